#include "costmodel/compute.hpp"

#include <algorithm>
#include <cmath>

#include "costmodel/layers.hpp"
#include "profiles/errors.hpp"

namespace loom::costmodel {

DeviceRates device_rates(const profiles::DeviceSpec& device, Precision precision,
                         const EfficiencyDefaults& d, AttentionKernel attention) {
  double peak_tflops = device.peak_tflops.of(precision);
  if (peak_tflops <= 0) {
    throw InputError("--precision", "",
                     std::string("device ") + device.name + " has no " +
                         profiles::to_string(precision) + " rate in its peak_tflops");
  }
  bool gpu = device.kind == profiles::DeviceKind::kGpu;
  DeviceRates r;
  const double matrix = device.matrix_efficiency.value_or(gpu ? d.gpu_matrix : d.cpu_matrix);
  // Tensor-core products run at the clock a long run sustains; fp32 (CUDA cores) and memory-bound
  // kernels draw less power and keep theirs.
  // WIRE: sustained_clock_fraction per GPU cluster file, measured or fitted by the calibration.
  const double clock =
      gpu && precision != Precision::kFp32 ? device.sustained_clock_fraction.value_or(1) : 1;
  peak_tflops *= clock;
  r.matrix_flops_per_s = peak_tflops * 1e12 * matrix;
  r.memory_bytes_per_s = device.memory_bandwidth_gbps * 1e9 *
                         device.memory_efficiency.value_or(gpu ? d.gpu_memory : d.cpu_memory);
  r.kernel_launch_s = gpu ? d.gpu_kernel_launch_s : 0;
  r.gpu = gpu;
  if (gpu) {
    r.host_launch_s = device.host_launch_us ? *device.host_launch_us * 1e-6 : d.gpu_host_launch_s;
    r.host_pass_s = device.host_pass_us ? *device.host_pass_us * 1e-6 : d.gpu_host_pass_s;
    r.host_serial_fraction = device.host_serial_fraction.value_or(d.gpu_host_serial_fraction);
    r.host_op_s = d.gpu_host_op_s;
  } else {
    r.thread_serial_fraction = device.thread_serial_fraction.value_or(0);
  }
  r.gemm.peak_flops_per_s = peak_tflops * 1e12;
  r.gemm.memory_bytes_per_s = r.memory_bytes_per_s;
  r.gemm.element_bytes = precision == Precision::kFp8 ? 1 : element_bytes(precision);
  r.attention_efficiency = device.attention_efficiency.value_or(gpu ? d.flash_attention : matrix);
  if (attention == AttentionKernel::kFlashAttention2 && device.flash_attention_2_efficiency) {
    r.attention_efficiency = *device.flash_attention_2_efficiency;
  }
  const double ceiling_tflops = device.achievable_tflops.of(precision);
  if (gpu && device.sm_count > 0 && ceiling_tflops > 0) {
    r.gemm.sm_count = static_cast<int>(device.sm_count);
    r.gemm.ceiling_flops_per_s = ceiling_tflops * 1e12 * clock;
    const double tensor_tflops = device.peak_tflops.bf16 > 0   ? device.peak_tflops.bf16
                                 : device.peak_tflops.fp16 > 0 ? device.peak_tflops.fp16
                                                               : device.peak_tflops.of(precision);
    // The prologue and epilogue move element_bytes per element: twice a 16-bit type's time for
    // 4-byte elements (tf32 on tensor cores at half the rate: the same k-steps; fp32 on CUDA cores
    // at 1/8 of the rate on V100: a quarter of them).
    r.gemm.prologue_scale = std::min(
        1.0, device.peak_tflops.of(precision) / tensor_tflops * r.gemm.element_bytes / 2.0);
    // Tensor cores (16-bit types and tf32) read 16-byte vectors; fp32 runs on CUDA cores.
    r.gemm.alignment_elements = precision == Precision::kFp32 ? 0 : 16 / r.gemm.element_bytes;
  }
  r.core_gemm = r.gemm;
  r.core_matrix_flops_per_s = r.matrix_flops_per_s;
  if (precision == Precision::kFp8) {
    // Only the linear layers' products run in fp8; attention and the head keep bf16's rates.
    const DeviceRates bf16 = device_rates(device, Precision::kBf16, d, attention);
    r.core_gemm = bf16.gemm;
    r.core_matrix_flops_per_s = bf16.matrix_flops_per_s;
    r.fp8_casts = true;
  }
  return r;
}

double causal_attention_time_scale(const profiles::ModelSpec& model) {
  return model.family == profiles::Family::kDecoder ? 2.0 : 1.0;
}

namespace {

// Accumulates kernels of a forward pass and their backward counterparts.
struct Pass {
  const DeviceRates& rates;
  int element_bytes = 2;
  // The share of micro-batches that cast a linear layer's weight to fp8 (LayerShape).
  double fp8_weight_cast_share = 1;
  double forward_s = 0;
  double backward_s = 0;
  int forward_kernels = 0;   // launched by the forward pass (the host floor's count)
  int matmuls = 0;           // products so far
  double kept_matmul_s = 0;  // forward time of the 1st, 3rd, ... products (SelectivePolicy)

  // Kernels the runtime launches that the roofline times as one (the host issues each).
  void also_launches(int kernels) { forward_kernels += kernels; }

  double kernel(double flops, double bytes) const {
    return std::max({flops / rates.matrix_flops_per_s, bytes / rates.memory_bytes_per_s,
                     rates.kernel_launch_s});
  }
  // A matrix product C[m,n] = A[m,k] B[k,n]: forward once; backward as the gradients of A
  // (m x k, inner n) and of B (k x n, inner m), each from its shape under the shape model (all
  // three unaligned when n or k is: operands_aligned), two products of the forward's cost under
  // the roofline. A linear layer's product (B its weight) runs at the job's precision, the
  // others (attention's, the head's) at core_gemm's; in fp8 a linear layer's also pays its casts.
  double matmul(const GemmShape& x, bool linear = true) {
    ++forward_kernels;
    const bool kept = matmuls++ % 2 == 0;
    double t = 0;
    if (!rates.shape_model()) {
      const double rate = linear ? rates.matrix_flops_per_s : rates.core_matrix_flops_per_s;
      t = std::max({x.flops() / rate, x.bytes(element_bytes) / rates.memory_bytes_per_s,
                    rates.kernel_launch_s});
      forward_s += t;
      backward_s += 2 * t;
    } else {
      const GemmDevice& g = linear ? rates.gemm : rates.core_gemm;
      const bool unaligned = !operands_aligned(x.n, x.k, g.alignment_elements);
      t = gemm_time({x.m, x.n, x.k, x.batch, unaligned}, g).time_s;
      forward_s += t;
      backward_s += gemm_time({x.m, x.k, x.n, x.batch, unaligned}, g).time_s +
                    gemm_time({x.k, x.n, x.m, x.batch, unaligned}, g).time_s;
    }
    if (kept) kept_matmul_s += t;
    if (linear && rates.fp8_casts) {
      // TransformerEngine fuses the casts of the input and of the output's gradient into the
      // kernels that produce them; what remains is the fp8 transpose they write beside (1 byte
      // per element), and the weight's cast and transpose (read 2 bytes, write 1 + 1), on the
      // micro-batches that make them.
      forward_s +=
          kernel(0, 1 * x.batch * x.m * x.k) + fp8_weight_cast_share * kernel(0, 4 * x.k * x.n);
      backward_s += kernel(0, 1 * x.batch * x.m * x.n);
      forward_kernels += 2;
    }
    return t;
  }
  // An elementwise or reduction kernel moving `bytes`; backward moves about twice as much.
  double memory(double bytes) {
    ++forward_kernels;
    double t = kernel(0, bytes);
    forward_s += t;
    backward_s += kernel(0, 2 * bytes);
    return t;
  }
  // A fused attention kernel (FlashAttention, cuDNN's): `work` forward, its backward after.
  double fused_attention(FusedAttentionWork work, double backward_flops) {
    GemmDevice d = rates.core_gemm;
    if (d.peak_flops_per_s <= 0) d.peak_flops_per_s = rates.core_matrix_flops_per_s;
    const double eff = rates.attention_efficiency > 0 ? rates.attention_efficiency : 1;
    ++forward_kernels;
    work.backward = false;
    const double t = std::max(fused_attention_time_s(work, d, eff), rates.kernel_launch_s);
    forward_s += t;
    work.backward = true;
    work.flops = backward_flops;
    backward_s += std::max(fused_attention_time_s(work, d, eff), rates.kernel_launch_s);
    return t;
  }
  // The pass's times, each at least the host's issue of its kernels plus `pass_share_s` of the
  // stage's per-pass host cost, when the runtime is host-bound at all.
  LayerTime times(bool host_floor, double pass_share_s) const {
    if (!host_floor || rates.host_launch_s <= 0) return {forward_s, backward_s, 0};
    const double issue = forward_kernels * rates.host_launch_s;
    // The longer of the two, and the part of the shorter that waits for the other.
    const double serial = rates.host_serial_fraction;
    auto both = [serial](double kernels_s, double host_s) {
      return std::max(kernels_s, host_s) + serial * std::min(kernels_s, host_s);
    };
    return {both(forward_s, issue + pass_share_s),
            both(backward_s, kBackwardHostOps * issue + pass_share_s), 0};
  }
};

// Bytes per element of what autocast keeps in fp32: the residual stream, LayerNorm's output,
// softmax's output and the dropout on it.
constexpr double kAutocastBytes = 4;

// The layer's sizes as doubles.
struct Dims {
  double b, s, h, f, a, kv, t, e;
};

// The attention core (scores, softmax, context) forward and backward; returns its forward time
// (what selective recomputation repeats: nothing for the fused kernel, which keeps no scores).
double attention_core(const profiles::ModelSpec& m, const LayerShape& x, const Dims& d, Pass& p) {
  const double heads = d.b * d.a / d.t;  // (sample, head) pairs on this rank
  const double head_dim = d.h / d.a;
  if (x.attention == Attention::kFlash) {
    // 4 b s^2 h / t FLOPs forward, 2.5x that backward; one thread block per 128 queries of each
    // head. A causal decoder counts half the FLOPs (attention_forward_flops), but on GPUs its
    // step time grows with s as the whole s x s grid at the kernel's rate
    // (causal_attention_time_scale): its blocks are timed as walking every tile. Encoders are
    // trained with dropout on the probabilities, decoders without. Sequences are taken as full
    // length: a batch without padding carries no mask (Loom's executor and Hugging Face's models
    // pass none then), so the mask's costs are not charged.
    // With context parallelism the rank's s / cp queries meet all s keys over cp kernels, 1/cp
    // of the whole sequence's work (its causal half balanced over the ranks).
    const double tiles = std::ceil(d.s / 128);
    const double key_tiles = std::ceil(d.s * x.cp / 128);
    const bool causal = m.family == profiles::Family::kDecoder;
    // The tiles the blocks are timed walking: the causal half times the rule's scale (the whole
    // grid for decoders), every tile for encoders. CPUs time the counted FLOPs instead.
    const double walked = tiles * key_tiles * (causal ? causal_attention_time_scale(m) / 2 : 1);
    const std::int64_t sequence = x.seq_len * x.cp;
    FusedAttentionWork work;
    work.flops = attention_forward_flops(m, x.micro_batch, sequence, x.attention) / d.t / x.cp;
    work.blocks = heads * tiles;
    work.elements = heads * walked * 128 * 128;
    work.head_dim = head_dim;
    work.dropout = !causal;
    p.fused_attention(
        work, attention_backward_flops(m, x.micro_batch, sequence, x.attention) / d.t / x.cp);
    return 0;
  }
  const double scores = d.a * d.b * d.s * d.s / d.t;
  double core = p.matmul({d.s, d.s, head_dim, heads}, false);  // Q K^T
  if (!p.rates.shape_model()) {
    core += p.memory((3 * d.e + 1) * scores);  // scale, mask, softmax, dropout
    p.also_launches(x.fusions.masked_softmax ? 1 : 3);
  } else if (x.autocast) {
    // Autocast runs softmax in fp32: the 16-bit scores are cast up first, the fp32
    // probabilities go through dropout and are cast down again for the product with V.
    const double r = kAutocastBytes;
    core += p.memory(2 * d.e * scores);        // scale
    core += p.memory((2 * d.e + 1) * scores);  // mask
    core += p.memory((d.e + r) * scores);      // cast up
    core += p.memory(2 * r * scores);          // softmax
    core += p.memory((2 * r + 1) * scores);    // dropout
    core += p.memory((r + d.e) * scores);      // cast down
  } else if (x.fusions.masked_softmax) {
    core += p.memory(2 * d.e * scores);        // scale + mask + softmax
    core += p.memory((2 * d.e + 1) * scores);  // dropout (and its mask)
  } else {
    for (int i = 0; i < 3; ++i) core += p.memory(2 * d.e * scores);  // scale, mask, softmax
    core += p.memory((2 * d.e + 1) * scores);                        // dropout
  }
  core += p.matmul({d.s, head_dim, d.s, heads}, false);  // probabilities x V
  return core;
}

// Eager PyTorch's RMSNorm over n elements (torchtitan's and Hugging Face's Llama): x.float(),
// pow(2), mean, x * rsqrt(mean + eps), .type_as(x), * weight; the two casts only for 16-bit x.
void eager_rms_norm(double n, const Dims& d, Pass& p) {
  p.memory(8 * n);        // pow(2) in fp32
  p.memory(4 * n);        // mean over the hidden dimension
  p.memory(8 * n);        // x * rsqrt(...)
  p.memory(2 * d.e * n);  // * weight
  if (d.e < 4) {
    p.memory((d.e + 4) * n);  // x.float()
    p.memory((4 + d.e) * n);  // .type_as(x)
  }
}

// The rotary embedding of n elements of q or k: one kernel fused; eager (torchtitan's
// apply_rotary_emb) the fp32 copy, the complex product and the cast back.
void rotary(double n, const LayerShape& x, const Dims& d, Pass& p) {
  if (x.fusions.rotary) {
    p.memory(2 * d.e * n);
    return;
  }
  p.memory((d.e + 4) * n);
  p.memory(8 * n);
  p.memory((4 + d.e) * n);
}

// The GeLU of n elements: one kernel; Hugging Face's gelu_new run eagerly (transformers,
// activations.py: 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)))) one kernel per
// operation: 0.5 x, x^3, 0.044715 *, x +, sqrt(2 / pi) *, tanh, 1 +, the product.
void gelu(const profiles::ModelSpec& m, const LayerShape& x, double n, const Dims& d, Pass& p) {
  if (m.activation != profiles::Activation::kGeluNew || x.fusions.activation) {
    p.memory(2 * d.e * n);
    return;
  }
  for (double tensors : {2, 2, 2, 3, 2, 2, 2, 3}) p.memory(tensors * d.e * n);
}

// Dropout, the residual add and LayerNorm after a row-parallel product, over `tokens` x h
// (1/tp of the tokens with sequence parallelism). Llama blocks (gated MLPs) have no dropout and
// an RMSNorm.
void residual_block(const profiles::ModelSpec& m, const LayerShape& x, const Dims& d, Pass& p) {
  const double n = d.b * d.s * d.h / (x.sequence_parallel ? d.t : 1);
  if (p.rates.shape_model() && m.gated_mlp) {
    if (x.fusions.norm) {
      p.memory(4 * d.e * n);  // read x and the residual, write the sum and the normed
    } else {
      p.memory(3 * d.e * n);  // residual add
      eager_rms_norm(n, d, p);
    }
    return;
  }
  if (!p.rates.shape_model()) {
    p.memory(5 * d.e * n);  // bias, dropout, residual, LayerNorm
    p.also_launches(x.fusions.bias_dropout_add ? 1 : 2);
    return;
  }
  if (x.autocast) {
    // The 16-bit product's dropout, then the add to the fp32 residual stream (promoted to fp32)
    // and LayerNorm in fp32.
    const double r = kAutocastBytes;
    p.memory((2 * d.e + 1) * n);  // dropout
    p.memory((d.e + 2 * r) * n);  // residual add
    p.memory(2 * r * n);          // LayerNorm
    return;
  }
  if (x.fusions.bias_dropout_add) {
    p.memory((3 * d.e + 1) * n);  // read x and the residual, write the sum and the mask
  } else {
    p.memory((2 * d.e + 1) * n);  // dropout
    p.memory(3 * d.e * n);        // residual add
  }
  p.memory(2 * d.e * n);  // LayerNorm
}

}  // namespace

LayerTime transformer_layer_time(const profiles::ModelSpec& m, const LayerShape& x,
                                 const DeviceRates& rates) {
  const Dims d{static_cast<double>(x.micro_batch), static_cast<double>(x.seq_len),
               static_cast<double>(m.hidden),      static_cast<double>(m.ffn_hidden),
               static_cast<double>(m.heads),       static_cast<double>(m.key_value_heads()),
               static_cast<double>(x.tp),          static_cast<double>(x.element_bytes)};
  const double tokens = d.b * d.s;
  const bool shapes = rates.shape_model();
  Pass p{rates, x.element_bytes, x.fp8_weight_cast_share};
  // QKV: h query columns and h kv / a for each of key and value, split over tp.
  const double kv_width = d.h * d.kv / d.a;
  // Under autocast the fp32 residual stream is cast to 16 bits once for the three products
  // (Loom's executor; autocast would cast it for each).
  const bool autocast = shapes && x.autocast && !m.gated_mlp;
  if (autocast) p.memory((kAutocastBytes + d.e) * tokens * d.h);
  // Each group of linear products' device time, the window of the exchange beside it.
  std::array<double, 4> window_forward{};
  std::array<double, 4> window_backward{};
  double start_forward = p.forward_s;
  double start_backward = p.backward_s;
  auto window = [&](LinearWindow w) {
    window_forward[w] += p.forward_s - start_forward;
    window_backward[w] += p.backward_s - start_backward;
  };
  if (!shapes || x.fusions.fused_qkv) {
    p.matmul({tokens, (d.h + 2 * kv_width) / d.t, d.h});
    if (!x.fusions.fused_qkv) p.also_launches(2);
  } else {
    p.matmul({tokens, d.h / d.t, d.h});
    p.matmul({tokens, kv_width / d.t, d.h});
    p.matmul({tokens, kv_width / d.t, d.h});
  }
  window(kQkvWindow);
  if (shapes && m.gated_mlp) {  // Llama's rotary positions on q and k
    rotary(tokens * d.h / d.t, x, d, p);
    rotary(tokens * kv_width / d.t, x, d, p);
  }
  const double core_start_forward = p.forward_s;
  const double core_start_backward = p.backward_s;
  const double core = attention_core(m, x, d, p);
  const double core_forward_s = p.forward_s - core_start_forward;
  const double core_backward_s = p.backward_s - core_start_backward;
  start_forward = p.forward_s;
  start_backward = p.backward_s;
  p.matmul({tokens, d.h, d.h / d.t});  // attention output
  window(kAttentionOutWindow);
  residual_block(m, x, d, p);
  const double ffn = tokens * d.f / d.t;
  if (!m.gated_mlp) {
    if (autocast) p.memory((kAutocastBytes + d.e) * tokens * d.h);  // the MLP's input cast down
    start_forward = p.forward_s;
    start_backward = p.backward_s;
    p.matmul({tokens, d.f / d.t, d.h});  // MLP up
    window(kMlpInWindow);
    gelu(m, x, ffn, d, p);
  } else {
    start_forward = p.forward_s;
    start_backward = p.backward_s;
    if (!shapes || x.fusions.fused_gate_up) {
      p.matmul({tokens, 2 * d.f / d.t, d.h});  // W1 and W3
      if (!x.fusions.fused_gate_up) p.also_launches(1);
    } else {
      p.matmul({tokens, d.f / d.t, d.h});
      p.matmul({tokens, d.f / d.t, d.h});
    }
    window(kMlpInWindow);
    if (!shapes || x.fusions.swiglu) {
      p.memory(3 * d.e * ffn);  // SiLU(a) * b
      if (!x.fusions.swiglu) p.also_launches(1);
    } else {
      p.memory(2 * d.e * ffn);  // SiLU
      p.memory(3 * d.e * ffn);  // product
    }
  }
  start_forward = p.forward_s;
  start_backward = p.backward_s;
  p.matmul({tokens, d.h, d.f / d.t});  // MLP down
  window(kMlpOutWindow);
  residual_block(m, x, d, p);
  // The stage's per-pass host cost is spread over its transformer layers.
  LayerTime out =
      p.times(x.host_floor,
              rates.host_pass_s / static_cast<double>(std::max<std::int64_t>(1, x.stage_layers)));
  out.linear_forward_s = window_forward;
  out.linear_backward_s = window_backward;
  out.attention_forward_s = core_forward_s;
  out.attention_backward_s = core_backward_s;
  if (x.recompute == Recompute::kFull) out.recompute_s = out.forward_s;
  if (x.recompute == Recompute::kSelective) {
    out.recompute_s = core;
    if (x.selective == SelectivePolicy::kOperators && p.forward_s > 0) {
      // The forward pass less the kept products and the fused attention kernel, in the pass's
      // proportion (host floor included).
      const double kept = p.kept_matmul_s + (x.attention == Attention::kFlash ? core : 0);
      out.recompute_s = out.forward_s * std::max(0.0, 1 - kept / p.forward_s);
    }
  }
  return out;
}

LayerTime embedding_time(const profiles::ModelSpec& m, const LayerShape& x,
                         const DeviceRates& rates) {
  const double bsh = static_cast<double>(x.micro_batch * x.seq_len * m.hidden);
  const double e = x.element_bytes;
  Pass p{rates, x.element_bytes};
  p.memory(3 * e * bsh);  // gather word, position and token-type rows
  p.memory(4 * e * bsh);  // sum, LayerNorm, dropout
  // Backward also clears and scatters into the (vocab-parallel) word-embedding gradient.
  double table = e * static_cast<double>(m.vocab * m.hidden) / x.tp;
  p.backward_s += p.kernel(0, table);
  return p.times(x.host_floor, 0);
}

LayerTime head_time(const profiles::ModelSpec& m, const LayerShape& x, const DeviceRates& rates) {
  const double b = static_cast<double>(x.micro_batch);
  const double s = static_cast<double>(x.seq_len);
  const double h = static_cast<double>(m.hidden);
  const double v = static_cast<double>(m.vocab);
  const double e = x.element_bytes;
  const double t = x.tp;
  Pass p{rates, x.element_bytes};
  if (m.num_labels) {
    const double labels = static_cast<double>(*m.num_labels);
    p.matmul({b, h, h}, false);       // pooler / dense
    p.memory(2 * e * b * h);          // tanh
    p.matmul({b, labels, h}, false);  // classifier
    p.memory(4 * b * labels);         // loss
    return p.times(x.host_floor, 0);
  }
  if (m.family == profiles::Family::kEncoder) {
    p.matmul({b * s, h, h}, false);  // MLM transform
    p.memory(4 * e * b * s * h);     // GeLU, LayerNorm
  } else {
    p.memory(4 * e * b * s * h);  // final LayerNorm
  }
  p.matmul({b * s, v / t, h}, false);  // logits
  p.memory((e + 8) * b * s * v / t);   // softmax cross-entropy in fp32
  return p.times(x.host_floor, 0);
}

DeviceRates scaled_rates(DeviceRates rates, int threads) {
  // Amdahl: the share the threads do not split runs on one of them.
  const double speedup = threads / (1 + rates.thread_serial_fraction * (threads - 1));
  rates.matrix_flops_per_s *= speedup;
  rates.core_matrix_flops_per_s *= speedup;
  rates.memory_bytes_per_s *= speedup;
  for (GemmDevice* g : {&rates.gemm, &rates.core_gemm}) {
    g->peak_flops_per_s *= speedup;  // the fused attention kernel's rate on CPUs
    g->memory_bytes_per_s *= speedup;
  }
  return rates;
}

}  // namespace loom::costmodel
