#include "costmodel/compute.hpp"

#include <algorithm>

#include "profiles/errors.hpp"

namespace loom::costmodel {

DeviceRates device_rates(const profiles::DeviceSpec& device, Precision precision,
                         const EfficiencyDefaults& d) {
  double peak_tflops = device.peak_tflops.of(precision);
  if (peak_tflops <= 0) {
    throw InputError("--precision", "",
                     std::string("device ") + device.name + " has no " +
                         profiles::to_string(precision) + " rate in its peak_tflops");
  }
  bool gpu = device.kind == profiles::DeviceKind::kGpu;
  DeviceRates r;
  r.matrix_flops_per_s =
      peak_tflops * 1e12 * device.matrix_efficiency.value_or(gpu ? d.gpu_matrix : d.cpu_matrix);
  r.memory_bytes_per_s = device.memory_bandwidth_gbps * 1e9 *
                         device.memory_efficiency.value_or(gpu ? d.gpu_memory : d.cpu_memory);
  r.kernel_launch_s = gpu ? d.gpu_kernel_launch_s : 0;
  return r;
}

namespace {

// Accumulates kernels of a forward pass; backward kernels do twice the work (gradients with
// respect to inputs and to weights for products; reading saved tensors for elementwise ops).
struct Pass {
  const DeviceRates& rates;
  double forward_s = 0;
  double backward_s = 0;

  double kernel(double flops, double bytes) const {
    return std::max({flops / rates.matrix_flops_per_s, bytes / rates.memory_bytes_per_s,
                     rates.kernel_launch_s});
  }
  // A matrix product: forward once, backward as two products of the same size.
  double matmul(double flops, double bytes) {
    double t = kernel(flops, bytes);
    forward_s += t;
    backward_s += 2 * t;
    return t;
  }
  // An elementwise or reduction kernel moving `bytes`; backward moves about twice as much.
  double memory(double bytes) {
    double t = kernel(0, bytes);
    forward_s += t;
    backward_s += kernel(0, 2 * bytes);
    return t;
  }
};

}  // namespace

LayerTime transformer_layer_time(const profiles::ModelSpec& m, const LayerShape& x,
                                 const DeviceRates& rates) {
  const double b = static_cast<double>(x.micro_batch);
  const double s = static_cast<double>(x.seq_len);
  const double h = static_cast<double>(m.hidden);
  const double f = static_cast<double>(m.ffn_hidden);
  const double a = static_cast<double>(m.heads);
  const double t = x.tp;
  const double e = x.element_bytes;
  const double bsh = b * s * h;
  Pass p{rates};
  p.matmul(2 * bsh * 3 * h / t, e * (bsh + 3 * h * h / t + 3 * bsh / t));                // QKV
  double core = p.matmul(2 * b * s * s * h / t, e * (2 * bsh / t + a * b * s * s / t));  // QK^T
  core += p.memory((3 * e + 1) * a * b * s * s / t);  // scale, mask, softmax, dropout
  core += p.matmul(2 * b * s * s * h / t, e * (a * b * s * s / t + 2 * bsh / t));  // x V
  p.matmul(2 * bsh * h / t, e * (bsh / t + h * h / t + bsh));                      // output
  p.memory(5 * e * bsh);  // bias, dropout, residual, LayerNorm
  p.matmul(2 * bsh * f / t, e * (bsh + h * f / t + b * s * f / t));  // MLP up
  p.memory(2 * e * b * s * f / t);                                   // GeLU
  p.matmul(2 * bsh * f / t, e * (b * s * f / t + h * f / t + bsh));  // MLP down
  p.memory(5 * e * bsh);  // bias, dropout, residual, LayerNorm
  LayerTime out{p.forward_s, p.backward_s, 0};
  if (x.recompute == Recompute::kFull) out.recompute_s = p.forward_s;
  if (x.recompute == Recompute::kSelective) out.recompute_s = core;
  return out;
}

LayerTime embedding_time(const profiles::ModelSpec& m, const LayerShape& x,
                         const DeviceRates& rates) {
  const double bsh = static_cast<double>(x.micro_batch * x.seq_len * m.hidden);
  const double e = x.element_bytes;
  Pass p{rates};
  p.memory(3 * e * bsh);  // gather word, position and token-type rows
  p.memory(4 * e * bsh);  // sum, LayerNorm, dropout
  // Backward also clears and scatters into the (vocab-parallel) word-embedding gradient.
  double table = e * static_cast<double>(m.vocab * m.hidden) / x.tp;
  p.backward_s += p.kernel(0, table);
  return LayerTime{p.forward_s, p.backward_s, 0};
}

LayerTime head_time(const profiles::ModelSpec& m, const LayerShape& x, const DeviceRates& rates) {
  const double b = static_cast<double>(x.micro_batch);
  const double s = static_cast<double>(x.seq_len);
  const double h = static_cast<double>(m.hidden);
  const double v = static_cast<double>(m.vocab);
  const double e = x.element_bytes;
  const double t = x.tp;
  Pass p{rates};
  if (m.num_labels) {
    const double labels = static_cast<double>(*m.num_labels);
    p.matmul(2 * b * h * h, e * (b * h + h * h + b * h));  // pooler / dense
    p.memory(2 * e * b * h);                               // tanh
    p.matmul(2 * b * h * labels, e * (b * h + h * labels + b * labels));
    p.memory(4 * b * labels);  // loss
    return LayerTime{p.forward_s, p.backward_s, 0};
  }
  if (m.family == profiles::Family::kEncoder) {
    p.matmul(2 * b * s * h * h, e * (2 * b * s * h + h * h));  // MLM transform
    p.memory(4 * e * b * s * h);                               // GeLU, LayerNorm
  } else {
    p.memory(4 * e * b * s * h);  // final LayerNorm
  }
  p.matmul(2 * b * s * h * v / t, e * (b * s * h + h * v / t + b * s * v / t));  // logits
  p.memory((e + 8) * b * s * v / t);  // softmax cross-entropy in fp32
  return LayerTime{p.forward_s, p.backward_s, 0};
}

}  // namespace loom::costmodel
