// The one place that knows which LibTorch it is compiled against.
//
// Loom builds against Debian's CPU LibTorch 1.13 and against CUDA LibTorch 2.x. Every API that
// differs between them is wrapped here, behind one function with one contract; no other file tests
// TORCH_VERSION_MAJOR. CUDA-only code compiles only when the build defines LOOM_TORCH_CUDA (set by
// executor/CMakeLists.txt when LibTorch was built with CUDA), so the CPU build never sees it. What
// does not differ between versions lives where it is used: the device's memory and random state in
// executor/device.hpp, the Gloo and NCCL groups in executor/distributed.cpp.
#pragma once

#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <type_traits>
#include <utility>

// NCCL's process group, for shutdown_nccl() (CUDA builds whose LibTorch has NCCL).
#if defined(LOOM_TORCH_CUDA) && defined(USE_C10D_NCCL)
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace loom::executor::compat {

// True when this LibTorch provides at::scaled_dot_product_attention (2.0 and later).
inline constexpr bool kHasFusedAttention = TORCH_VERSION_MAJOR >= 2;

// The most negative finite value of `t`'s floating dtype (Hugging Face's finfo(dtype).min).
inline double lowest_finite(const torch::Tensor& t) {
  switch (t.scalar_type()) {
    case torch::kHalf:
      return -65504.0;
    case torch::kBFloat16:
      return -3.3895313892515355e38;
    case torch::kDouble:
      return std::numeric_limits<double>::lowest();
    default:
      return std::numeric_limits<float>::lowest();
  }
}

// Multiplies every tensor of `tensors` in place by `factor`, a one-element tensor on their device,
// without reading it on the host: one multi-tensor kernel from 2.1, a kernel per tensor before.
inline void foreach_mul_(at::TensorList tensors, const torch::Tensor& factor) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
  if (!tensors.empty()) at::_foreach_mul_(tensors, factor);
#else
  for (const torch::Tensor& t : tensors) t.mul_(factor);
#endif
}

// AdamW over lists of CUDA tensors by ATen's fused multi-tensor kernel (_fused_adamw_, what
// torch.optim.AdamW(fused=True) runs): each element read and written once, where the unfused
// step's multi-tensor operations pass over the moments about nine times. `step` is the step
// number after this update. Returns false, touching nothing, where this LibTorch has no such
// kernel (before 2.1, or built without CUDA) or the lists are not what the kernel takes (every
// tensor on the first parameter's CUDA device with its dtype, dense, each gradient and moment
// of its parameter's sizes and strides); the caller then runs the unfused step.
inline bool fused_adamw_(at::TensorList parameters, at::TensorList grads, at::TensorList exp_avgs,
                         at::TensorList exp_avg_sqs, std::int64_t step, double lr, double beta1,
                         double beta2, double weight_decay, double eps) {
#if defined(LOOM_TORCH_CUDA) && \
    (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1))
  if (parameters.empty() || !parameters.front().is_cuda()) return false;
  const torch::Device device = parameters.front().device();
  const auto dtype = parameters.front().scalar_type();
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    const torch::Tensor& p = parameters[i];
    if (p.device() != device || p.scalar_type() != dtype || !p.is_non_overlapping_and_dense()) {
      return false;
    }
    for (const torch::Tensor& t : {grads[i], exp_avgs[i], exp_avg_sqs[i]}) {
      if (t.device() != device || t.scalar_type() != dtype || t.sizes() != p.sizes() ||
          t.strides() != p.strides()) {
        return false;
      }
    }
  }
  // The kernel reads each tensor's step count from a float tensor on its device.
  const torch::Tensor count =
      torch::full({}, static_cast<double>(step), parameters.front().options().dtype(torch::kFloat));
  const std::vector<torch::Tensor> steps(parameters.size(), count);
  at::_fused_adamw_(parameters, grads, exp_avgs, exp_avg_sqs, /*max_exp_avg_sqs=*/{}, steps, lr,
                    beta1, beta2, weight_decay, eps, /*amsgrad=*/false, /*maximize=*/false);
  return true;
#else
  (void)parameters, (void)grads, (void)exp_avgs, (void)exp_avg_sqs, (void)step, (void)lr;
  (void)beta1, (void)beta2, (void)weight_decay, (void)eps;
  return false;
#endif
}

// The key under which `optimizer.state()` keeps parameter `p`'s state: its TensorImpl's address
// in 2.x, that address written as a string in 1.13 (as the optimizers and their serialisation
// write it).
template <class Optimizer>
auto optimizer_state_key(Optimizer& optimizer, const torch::Tensor& p) {
  using Key = typename std::decay_t<decltype(optimizer.state())>::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream address;
    address << p.unsafeGetTensorImpl();
    return address.str();
  } else {
    return Key(p.unsafeGetTensorImpl());
  }
}

// Multi-head attention softmax(q k^T / sqrt(head_dim) + mask) v with dropout on the probabilities,
// written out as separate kernels on every LibTorch (the s x s scores and probabilities are
// tensors autograd keeps). q, k, v: [batch, heads, seq, head_dim]; keep: bool [batch, 1, 1, seq]
// (true = a key that may be attended to; every row must keep at least one key) or undefined for no
// mask. dropout_p is applied only when > 0. Returns [batch, heads, seq, head_dim]. Masked scores
// are set to the lowest finite value of their dtype (as Hugging Face's additive finfo.min mask).
inline torch::Tensor unfused_attention(const torch::Tensor& q, const torch::Tensor& k,
                                       const torch::Tensor& v, const torch::Tensor& keep,
                                       double dropout_p) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  torch::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) * scale;
  if (keep.defined()) scores = scores.masked_fill(keep.logical_not(), lowest_finite(scores));
  torch::Tensor probs = torch::softmax(scores, -1);
  if (dropout_p > 0.0) probs = torch::dropout(probs, dropout_p, /*train=*/true);
  return torch::matmul(probs, v);
}

// The same attention, fused: on 2.x scaled_dot_product_attention (flash or memory-efficient
// kernels where the device has them; dropout drawn inside the kernel from the device's default
// generator), on 1.13 unfused_attention (kHasFusedAttention says which).
inline torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, const torch::Tensor& keep,
                               double dropout_p) {
#if TORCH_VERSION_MAJOR >= 2
  c10::optional<torch::Tensor> mask;
  if (keep.defined()) mask = keep;
  return at::scaled_dot_product_attention(q, k, v, mask, dropout_p, /*is_causal=*/false);
#else
  return unfused_attention(q, k, v, keep, dropout_p);
#endif
}

// Autocast for one device type while alive: ops run in `dtype` where autocast allows it. Restores
// the previous enabled flag and dtype on destruction and clears the cast cache when the outermost
// guard ends (what Python's torch.autocast does). `enabled` = false makes the guard a no-op.
// Only kCPU and kCUDA are supported. Autocast state is per thread.
class AutocastGuard {
 public:
  AutocastGuard(c10::DeviceType device_type, c10::ScalarType dtype, bool enabled = true)
      : device_type_(device_type), active_(enabled) {
    if (!active_) return;
    previous_enabled_ = is_enabled(device_type_);
    previous_dtype_ = get_dtype(device_type_);
    set_dtype(device_type_, dtype);
    set_enabled(device_type_, true);
    at::autocast::increment_nesting();
  }
  ~AutocastGuard() {
    if (!active_) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    set_enabled(device_type_, previous_enabled_);
    set_dtype(device_type_, previous_dtype_);
  }
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

  // The calling thread's autocast state for `type`.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  static bool is_enabled(c10::DeviceType type) { return at::autocast::is_autocast_enabled(type); }
  static c10::ScalarType get_dtype(c10::DeviceType type) {
    return at::autocast::get_autocast_dtype(type);
  }
#else
  static bool is_enabled(c10::DeviceType type) {
    return type == c10::DeviceType::CUDA ? at::autocast::is_enabled()
                                         : at::autocast::is_cpu_enabled();
  }
  static c10::ScalarType get_dtype(c10::DeviceType type) {
    return type == c10::DeviceType::CUDA ? at::autocast::get_autocast_gpu_dtype()
                                         : at::autocast::get_autocast_cpu_dtype();
  }
#endif

 private:
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  static void set_enabled(c10::DeviceType type, bool on) {
    at::autocast::set_autocast_enabled(type, on);
  }
  static void set_dtype(c10::DeviceType type, c10::ScalarType dtype) {
    at::autocast::set_autocast_dtype(type, dtype);
  }
#else
  static void set_enabled(c10::DeviceType type, bool on) {
    if (type == c10::DeviceType::CUDA) {
      at::autocast::set_enabled(on);
    } else {
      at::autocast::set_cpu_enabled(on);
    }
  }
  static void set_dtype(c10::DeviceType type, c10::ScalarType dtype) {
    if (type == c10::DeviceType::CUDA) {
      at::autocast::set_autocast_gpu_dtype(dtype);
    } else {
      at::autocast::set_autocast_cpu_dtype(dtype);
    }
  }
#endif

  c10::DeviceType device_type_;
  bool active_;
  bool previous_enabled_ = false;
  c10::ScalarType previous_dtype_ = c10::ScalarType::Float;
};

// ---------------------------------------------------------------------------------------------
// Autograd

// Calls `ready` each time autograd has accumulated a gradient into the leaf `parameter` (what
// c10d's Reducer hooks). Returns the accumulator node: keep it alive as long as the hook should
// fire (autograd holds it only weakly between backward passes). Call after the parameter's last
// set_data with a new dtype or device.
// The owning pointer to an autograd node: std::shared_ptr up to some 2.x, c10::intrusive_ptr in
// newer ones (2.14 has it).
using NodePointer =
    decltype(torch::autograd::impl::grad_accumulator(std::declval<const torch::Tensor&>()));

inline NodePointer add_gradient_ready_hook(const torch::Tensor& parameter,
                                           std::function<void()> ready) {
  NodePointer accumulator = torch::autograd::impl::grad_accumulator(parameter);
  accumulator->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
      [ready = std::move(ready)](const torch::autograd::variable_list& outputs,
                                 const torch::autograd::variable_list& /*inputs*/) {
        ready();
        return outputs;
      }));
  return accumulator;
}

// ---------------------------------------------------------------------------------------------
// c10d

// The object that runs collectives: c10d::ProcessGroup on 1.13, c10d::Backend on 2.x (where
// ProcessGroup became a dispatching wrapper). Both have the same collective methods.
#if TORCH_VERSION_MAJOR >= 2
using CollectiveBackend = c10d::Backend;
#else
using CollectiveBackend = c10d::ProcessGroup;
#endif

#if defined(LOOM_TORCH_CUDA) && defined(USE_C10D_NCCL)
// Ends an NCCL group's communicators before it is destroyed: 2.4 and later warn, and may hang
// other ranks, when a group is destroyed without it; before 2.4 there is nothing to call.
inline void shutdown_nccl(c10d::ProcessGroupNCCL& group) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  group.shutdown();
#else
  (void)group;
#endif
}
#endif

// TCPStore's server backend: LibTorch 2.4 and later ask for the libuv one by default, which a
// LibTorch built without libuv refuses (Debian 13's 2.6: "use_libuv was requested but PyTorch was
// build without libuv support"). Switches `options` to the classic backend and returns true, or
// returns false when there is nothing to switch (1.13 and 2.0-2.3 use the classic one).
inline bool use_classic_tcp_store(c10d::TCPStoreOptions& options) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  if (!options.useLibUV) return false;
  options.useLibUV = false;
  return true;
#else
  (void)options;
  return false;
#endif
}

}  // namespace loom::executor::compat
