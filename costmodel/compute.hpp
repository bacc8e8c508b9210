// Compute time of the layers, kernel by kernel. Devices without a GEMM model (CPUs, GPU files
// without sm_count) use a roofline: each kernel takes the longer of its FLOPs at the device's
// matrix rate and its bytes at the device's memory bandwidth, each scaled by an efficiency, and
// at least the launch overhead (kernels are launched asynchronously, so launch cost only shows
// when kernels are shorter than it); a matrix product's backward is two products of its size.
// GPUs with sm_count and achievable_tflops time every matrix product from its shape
// (costmodel/gemm.hpp), forward and the backward's input- and weight-gradient products each with
// its own shape; elementwise kernels are memory-bound, one per kernel the runtime launches
// (KernelFusions); attention is the unfused math or one fused FlashAttention kernel.
//
// Host floor (GPUs, runtimes with RuntimeRules::host_floor): an eager runtime issues each kernel
// from the host, so a pass whose kernels are shorter than their issue is host-bound. A layer's
// forward issue is host_launch_s per kernel it launches plus its share of the stage's per-pass
// host cost (host_pass_s over the stage's layers); its backward's is kBackwardHostOps times the
// forward's launches plus the same share. The pass takes the longer of issue and kernels plus
// host_serial_fraction of the shorter (where the runtime synchronises, one waits for the other).
// Measured on an H200 with Loom's executor (bench/RESULTS.md): BERT-base and -large at
// micro-batches 8 and 32, sequence 128, ran at the same time per micro-batch, about 0.4 ms per
// layer forward and 0.9 ms backward plus a few ms per pass whatever the layer count.
#pragma once

#include <array>
#include <cstdint>

#include "costmodel/gemm.hpp"
#include "costmodel/strategy.hpp"

namespace loom::costmodel {

// Rates and efficiencies of one device for one precision.
struct DeviceRates {
  double matrix_flops_per_s = 0;  // peak for the precision x matrix efficiency
  double memory_bytes_per_s = 0;  // bandwidth x memory efficiency
  double kernel_launch_s = 0;     // lower bound on any kernel's time
  // The shape model's view of the device (gemm.hpp); sm_count 0 = roofline at
  // matrix_flops_per_s.
  GemmDevice gemm;
  // The products that stay in 16 bits when the linear layers' run in fp8 (Precision::kFp8): the
  // attention core's, fused or not, and the head's. The same as gemm and matrix_flops_per_s for
  // every other precision.
  GemmDevice core_gemm;
  double core_matrix_flops_per_s = 0;
  // fp8 linear layers (TransformerEngine's recipe): each product's input and weight are cast to
  // fp8 with their transposes before the forward product, its output's gradient before the
  // backward ones (transformer_layer_time).
  bool fp8_casts = false;
  double attention_efficiency = 0;  // fused attention's fraction of peak
  bool gpu = false;                 // a GPU device (causal_attention_time_scale applies)
  double host_launch_s = 0;         // host time per kernel issued (0 on CPUs)
  double host_pass_s = 0;           // host time per forward or backward pass of a stage
  double host_op_s = 0;  // host time per eager operation without autograd (the optimizer's)
  double host_serial_fraction = 0;    // of the shorter of host issue and kernels, not overlapped
  double thread_serial_fraction = 0;  // CPUs: the share intra-op threads do not split (Amdahl)
  bool shape_model() const { return gemm.sm_count > 0; }
};

// Default efficiencies when the cluster gives none: matrix 0.7 of peak and memory 0.8 of
// bandwidth on GPUs (large bf16 GEMMs reach 70-80 % of the datasheet rate; elementwise kernels
// ~80 % of HBM bandwidth), 0.5 and 0.5 on CPUs; 5 us per kernel on GPUs, 0 on CPUs.
struct EfficiencyDefaults {
  double gpu_matrix = 0.7;
  double gpu_memory = 0.8;
  double cpu_matrix = 0.5;
  double cpu_memory = 0.5;
  double gpu_kernel_launch_s = 5e-6;
  // The fused attention kernel's rate on its products (costmodel/gemm.hpp's
  // FusedAttentionFit adds what it spends beyond them): FlashAttention-2 on A100 reaches about
  // 63 % of peak forward plus backward at head dimension 128 (Dao 2023, "FlashAttention-2:
  // Faster Attention with Better Parallelism and Work Partitioning", section 4.1), which that
  // fit gives at 0.9. A device file's attention_efficiency replaces it (cuDNN's fused attention
  // on H100 and H200 0.89; FlashAttention-2 there 0.52, flash_attention_2_efficiency:
  // bench/RESULTS.md).
  double flash_attention = 0.9;
  // The host floor's costs when the device file gives none: Loom's executor (LibTorch 2.11) on
  // an H200 machine's host, fitted to 20 single-GPU runs of BERT-base, BERT-large, RoBERTa-base
  // and a tiny BERT (sequences 64 to 512, micro-batches 4 to 64; bench/RESULTS.md);
  // `loom calibrate` fits them to a cluster's own runs.
  double gpu_host_launch_s = 35e-6;
  double gpu_host_pass_s = 2e-3;
  double gpu_host_serial_fraction = 0.25;
  // An eager PyTorch operation issued from Python outside autograd (an optimizer's per-tensor
  // loop): torch.optim.AdamW(foreach=False) over BERT-base's parameters in 151 tensors (Q, K and V
  // fused) took 14.79 ms on an H100 machine, host-bound, 10.9 us for each of its 9 operations per
  // tensor (bench/RESULTS.md).
  double gpu_host_op_s = 10.9e-6;
  bool operator==(const EfficiencyDefaults&) const = default;
};

// The rates of a CPU rank running `threads` intra-op threads: `rates` (one core's) times Amdahl's
// speedup, threads / (1 + thread_serial_fraction * (threads - 1)); threads 1 leaves them as they
// are.
DeviceRates scaled_rates(DeviceRates rates, int threads);

// Host operations autograd issues in a backward pass per kernel of the forward: a product's two
// gradient products and the gradient accumulation, an elementwise kernel's gradient. Measured:
// the backward phase's per-layer host time over the forward's on the H200 (2.3 for BERT-base
// and BERT-large alike).
inline constexpr double kBackwardHostOps = 2.3;

// The fused attention kernel's time on a GPU, as a multiple of what its FLOPs
// (attention_forward_flops, attention_backward_flops) take at the device's attention rate: 2 for
// causal decoders, 1 otherwise. A causal kernel does half the work of the s x s grid, yet the
// step times published for causal decoders (FlashAttention in llm-foundry, SDPA's FlashAttention-2
// in torchtitan and fms-fsdp, on A100 and H100) grow with the sequence length at the rate of the
// whole grid: over s = 4096..65536 the extra time per token is what the full grid takes at
// 0.48-0.62 of A100's peak and 0.27-0.34 of H100's, the kernels' non-causal rates
// (docs/cost-model.md). The FLOPs counted for MFU stay the causal half.
double causal_attention_time_scale(const profiles::ModelSpec& model);

// The fused attention kernel a runtime runs (RuntimeRules::attention_kernel):
//   kNative           the device's own: cuDNN's fused attention (TransformerEngine, PyTorch's
//                     scaled_dot_product_attention in Loom's executor) or FlashAttention-3 on
//                     Hopper, FlashAttention-2 on Ampere (DeviceSpec::attention_efficiency)
//   kFlashAttention2  FlashAttention-2 (flash-attn 2, SDPA's flash backend), whose rate on Hopper
//                     is its own (DeviceSpec::flash_attention_2_efficiency)
enum class AttentionKernel { kNative, kFlashAttention2 };

// Throws InputError when the device has no rate for `precision`.
DeviceRates device_rates(const profiles::DeviceSpec& device, Precision precision,
                         const EfficiencyDefaults& defaults,
                         AttentionKernel attention = AttentionKernel::kNative);

// Time of one micro-batch through one layer on one tensor-parallel rank, communication excluded.
struct LayerTime {
  double forward_s = 0;
  double backward_s = 0;
  double recompute_s = 0;  // extra forward work done in the backward pass
  // A transformer layer's linear products on the device, by the tensor-parallel exchange each
  // sits beside (kLinearWindows order: the QKV products, the attention output, the MLP's input
  // products, the MLP's output), forward and backward (both gradients' products); the windows
  // TransformerEngine's userbuffers overlap hide the exchanges in (tp_overlap.hpp). Zero for
  // other entries and for measured layers.
  std::array<double, 4> linear_forward_s{};
  std::array<double, 4> linear_backward_s{};
  // A transformer layer's attention core on the device (the window context parallelism's
  // key/value sends hide in, context_parallel.hpp); zero for other entries and measured layers.
  double attention_forward_s = 0;
  double attention_backward_s = 0;
};
// The order of LayerTime's linear windows.
enum LinearWindow { kQkvWindow = 0, kAttentionOutWindow, kMlpInWindow, kMlpOutWindow };

// The elementwise kernels a runtime fuses. The default is Loom's executor (eager LibTorch):
// biases in the matrix products' epilogues, LayerNorm and softmax one kernel each, and separate
// kernels for the attention scale, the mask, GeLU, dropout and the residual add; separate Q, K
// and V products. Megatron-LM fuses QKV into one product, bias + GeLU, bias + dropout + add, and
// scale + mask + softmax (megatron()).
struct KernelFusions {
  bool fused_qkv = false;         // one QKV product instead of three
  bool fused_gate_up = false;     // gated MLPs: one product for W1 and W3
  bool masked_softmax = false;    // scale, mask and softmax in one kernel
  bool bias_dropout_add = false;  // dropout and the residual add in one kernel
  bool swiglu = false;            // SiLU and the product of a gated MLP in one kernel
  // Llama blocks (gated MLPs): RMSNorm with the residual add before it in one kernel, and the
  // rotary embedding of q and of k in one kernel each. Eager PyTorch runs both as chains of
  // elementwise kernels through fp32 (transformer_layer_time).
  bool norm = false;
  bool rotary = false;
  // The MLP's activation in one kernel whatever the model's code writes (ModelSpec::activation:
  // Hugging Face's gelu_new is eight elementwise operations, eight kernels eagerly). Megatron-LM
  // runs its own bias-GeLU kernel.
  bool activation = false;
  static KernelFusions megatron() { return {true, true, true, true, true, true, true, true}; }
  // torch.compile (Inductor): every elementwise chain fused; the products stay as written.
  static KernelFusions compiled() { return {false, false, true, true, true, true, true, true}; }
  bool operator==(const KernelFusions&) const = default;
};

struct LayerShape {
  std::int64_t micro_batch = 1;
  std::int64_t seq_len = 1;
  int tp = 1;
  int element_bytes = 2;
  Recompute recompute = Recompute::kNone;
  SelectivePolicy selective = SelectivePolicy::kAttentionCore;  // what kSelective recomputes
  Attention attention = Attention::kMath;
  bool sequence_parallel = false;  // LayerNorm, dropout and residual work divided by tp
  KernelFusions fusions = {};      // GPUs with the shape model only
  bool host_floor = false;         // the runtime's passes are bounded by the host's issue
  // 16-bit products under autocast on an fp32 residual stream (RuntimeRules::autocast), GPUs
  // with the shape model only: the elementwise kernels move what autocast makes them move
  // (autocast_bytes in compute.cpp) instead of element_bytes everywhere.
  bool autocast = false;
  std::int64_t stage_layers = 1;  // transformer layers on the stage (its per-pass host share)
  // fp8 linear layers: the share of a step's micro-batches that cast each weight to fp8 with its
  // transpose. TransformerEngine casts on the first micro-batch of a step and keeps the copies
  // when the engine says which one is first (RuntimeRules::caches_fp8_weights: 1 / the
  // micro-batches); 1 where every micro-batch casts again.
  double fp8_weight_cast_share = 1;
  // Context parallelism (context_parallel.hpp): seq_len is one rank's share of a sequence of
  // seq_len x cp tokens, and the fused attention core attends its queries to all of them.
  int cp = 1;
};

LayerTime transformer_layer_time(const profiles::ModelSpec& model, const LayerShape& shape,
                                 const DeviceRates& rates);
LayerTime embedding_time(const profiles::ModelSpec& model, const LayerShape& shape,
                         const DeviceRates& rates);
LayerTime head_time(const profiles::ModelSpec& model, const LayerShape& shape,
                    const DeviceRates& rates);

}  // namespace loom::costmodel
