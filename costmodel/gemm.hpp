// Time of one matrix product on a GPU from its shape: C[m,n] = A[m,k] B[k,n], `batch` times.
//
// The kernel splits C into output tiles (tile_m x tile_n), one thread block per tile, and runs
// them in waves of one tile per SM (NVIDIA, "Matrix Multiplication Background User's Guide":
// tile quantization pads the edges up to whole tiles, wave quantization pads the last wave up to
// a whole wave). Each tile's main loop walks k at the SM's share of the device rate, plus a fixed
// prologue/epilogue worth `prologue_k` more steps of k (filling the pipeline, writing C); small
// tiles (under 128 x 128) reuse less data and run at `small_tile_efficiency`. The SM's share is
// `sm_rate_fraction` of the peak, or the ceiling's share where the device's measured ceiling is
// higher (fp32 on CUDA cores keeps its pipes fuller than tensor cores do): a measured rate the
// tiles could not reach would leave the ceiling without effect. cuBLAS picks the
// fastest of a small set of tile shapes (kTileShapes). The result is held under the device's
// achievable ceiling (the best measured matmul rate) and above a memory roofline (reading A and
// B, writing C once), plus a fixed per-kernel time.
//
// Fitted (docs/cost-model.md) to the sm_90 points of XLA's matmul performance table and the
// "maximum achievable matmul FLOPS" of H100 and A100 (prologue_k, sm_rate_fraction and
// small_tile_efficiency), then fixed_s to the device times of 104 bf16 and fp16 cuBLAS products
// of transformer shapes measured on an H100 (bench/gpu-runs/h100/kernels.json): XLA's table
// times each kernel with its launch, which the host floor (compute.hpp) charges apart.
// Everything else is the device's datasheet (sm_count, peak, bandwidth) and its measured
// ceiling.
#pragma once

#include <array>
#include <cstdint>

namespace loom::costmodel {

struct GemmShape {
  double m = 1;
  double n = 1;
  double k = 1;
  double batch = 1;
  // The operands' rows are not a whole number of 16-byte vectors (GemmDevice::alignment_elements),
  // so the kernel loads them in narrower pieces (set by the caller: see operands_aligned).
  bool unaligned = false;
  double flops() const { return 2 * m * n * k * batch; }
  // A and B read once and C written once, `element_bytes` each.
  double bytes(int element_bytes) const { return element_bytes * batch * (m * k + k * n + m * n); }
};

// What the shape model needs of one device for one precision.
struct GemmDevice {
  int sm_count = 0;
  double peak_flops_per_s = 0;     // datasheet dense rate of the precision
  double ceiling_flops_per_s = 0;  // best measured rate (achievable_tflops)
  double memory_bytes_per_s = 0;   // effective memory bandwidth
  int element_bytes = 2;
  // A tile's prologue and epilogue (filling the operand pipeline, writing the output) take a
  // time set by memory, not by the math rate: GemmFit::prologue_k counts them in k-steps of a
  // 16-bit type at the device's tensor-core rate. A precision at a fraction f of that rate whose
  // elements are w bytes spends f * w / 2 as many steps on them (costmodel::device_rates).
  double prologue_scale = 1;
  // Tensor-core kernels read their operands in 16-byte vectors: the row length of every operand
  // must be a multiple of this many elements (8 for 16-bit types, 4 for tf32); 0 = no such rule
  // (CUDA-core fp32, CPUs).
  int alignment_elements = 0;
};

// Whether the product of a layer with weight dims `n` x `k` (the forward's C[m,n] = A[m,k] B[k,n],
// m the tokens) keeps every operand's rows a multiple of `alignment_elements`, in the forward and
// in both backward products: their leading dimensions are n and k, never the tokens. A fractional
// dimension (a tensor-parallel share not padded) is unaligned.
bool operands_aligned(double n, double k, int alignment_elements);

// The fitted constants (see the header comment).
struct GemmFit {
  double fixed_s = 2.0e-6;             // per kernel: ramp-up and tail
  double prologue_k = 160;             // per tile, in steps of k
  double sm_rate_fraction = 0.89;      // one SM's rate as a fraction of peak / sm_count
  double small_tile_efficiency = 0.8;  // tiles of fewer than 128 x 128 outputs
  // An unaligned product's rate (GemmShape::unaligned) as a fraction of the aligned one's: what
  // makes GPT-2 124M's step 1.25x as long with its vocabulary of 50257 as with 50304 on A100, as
  // nanoGPT measured (docs/cost-model.md, "Alignment").
  double unaligned_rate_fraction = 0.35;
  bool operator==(const GemmFit&) const = default;
};

struct TileShape {
  int m = 128;
  int n = 128;
};
// The tile shapes cuBLAS and CUTLASS kernels use for bf16/fp16 on Ampere and Hopper.
inline constexpr std::array<TileShape, 6> kTileShapes = {
    {{256, 128}, {128, 256}, {128, 128}, {128, 64}, {64, 128}, {64, 64}}};

struct GemmTime {
  double time_s = 0;
  TileShape tile;          // the fastest tile shape
  std::int64_t tiles = 0;  // output tiles over all batches
  std::int64_t waves = 0;  // ceil(tiles / sm_count)
  bool memory_bound = false;
};

// Requires device.sm_count > 0 and positive rates.
GemmTime gemm_time(const GemmShape& shape, const GemmDevice& device, const GemmFit& fit = {});

// The fraction of peak a shape reaches: flops / time / peak.
double gemm_efficiency(const GemmShape& shape, const GemmDevice& device, const GemmFit& fit = {});

// One pass of a fused attention kernel (FlashAttention, cuDNN's fused attention): one thread
// block per 128 queries of each (sample, head), each walking 128 x 128 tiles of scores (the
// caller says how many: compute.cpp times a causal decoder's over the whole grid).
struct FusedAttentionWork {
  double flops = 0;     // the pass's counted FLOPs (a causal mask's masked half left out)
  double blocks = 0;    // thread blocks
  double elements = 0;  // score elements the blocks compute: 128^2 per tile walked
  double head_dim = 64;
  bool backward = false;
  bool dropout = false;  // dropout on the probabilities, drawn inside the kernel
  bool mask = false;     // a key-padding mask applied to every score
};

// What a fused attention kernel spends beyond its matrix products, measured on an H200 with
// cuDNN's fused attention (PyTorch 2.11's scaled_dot_product_attention on Hopper;
// bench/gpu_layers.py, bench/RESULTS.md "Fused attention kernels on an H200"), forward and
// backward. Each cost is in head dimensions: work equal to the products of that much more head
// dimension, so it runs at the device's attention rate and carries to other devices with it.
struct FusedAttentionFit {
  // Per score element: the exponential (16 per clock per SM on the special-function units, a
  // sizeable share of a 64-wide head's products on Hopper), in-kernel dropout (a Philox draw)
  // and a key-padding mask.
  std::array<double, 2> exp_head_dims = {43.6, 5.3};
  std::array<double, 2> dropout_head_dims = {175, 26.5};
  std::array<double, 2> mask_head_dims = {58.9, 40.5};
  // Per thread block (loading its queries, writing its outputs; in backward also the per-block
  // reductions and the fp32 accumulator of dQ), in tiles of 128 x 128 scores times head
  // dimensions: about 2 tiles of a 64-wide head forward and 6 backward, so a short sequence
  // (BERT at 128: one tile per block) runs far below the kernel's long-sequence rate.
  std::array<double, 2> block_tile_head_dims = {139, 367};
  // Backward's counted FLOPs (2.5 times forward) run at this fraction of forward's rate.
  double backward_rate = 0.663;
  // Forward only, once per call: turning a boolean key mask into the kernel's additive bias,
  // and the dropout's random-number offsets (small kernels of their own).
  double mask_setup_s = 12.9e-6;
  double dropout_setup_s = 2.3e-6;
};

// The pass's time: the blocks in whole waves over the SMs, each doing its share of the products
// and of the costs above at `efficiency` of the peak (the SM's share of it), plus the fixed
// per-kernel time and, forward, the mask's and dropout's setup. With sm_count 0 (CPUs), the counted
// FLOPs at peak x efficiency.
double fused_attention_time_s(const FusedAttentionWork& work, const GemmDevice& device,
                              double efficiency, const GemmFit& fit = {},
                              const FusedAttentionFit& kernel = {});

}  // namespace loom::costmodel
