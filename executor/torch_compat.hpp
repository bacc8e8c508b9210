// The one place that knows which LibTorch it is compiled against.
//
// Loom builds against Debian's CPU LibTorch 1.13 and against CUDA LibTorch 2.x. Every API that
// differs between them is wrapped here, behind one function with one contract; no other file tests
// TORCH_VERSION_MAJOR. CUDA-only headers are included only when the build defines LOOM_TORCH_CUDA
// (set by executor/CMakeLists.txt when LibTorch was built with CUDA), so the CPU build never sees
// them; code that may run on CUDA checks torch::cuda::is_available() at run time.
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>
#include <c10/core/Allocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>
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
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <type_traits>
#include <utility>

// Gloo: Debian's LibTorch and most pip wheels ship its headers; a CUDA build without them uses
// NCCL alone (CPU tensors then cannot be communicated). A CPU build needs Gloo.
#if defined(USE_C10D_GLOO) && __has_include(<gloo/algorithm.h>)
#define LOOM_HAS_GLOO 1
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#elif !defined(LOOM_TORCH_CUDA)
#error "Loom's CPU build needs LibTorch's Gloo (USE_C10D_GLOO and the gloo headers: libgloo-dev)"
#endif

#if defined(LOOM_TORCH_CUDA)
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>

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

// Whether this build can use CUDA: compiled with CUDA support and a device present.
inline bool cuda_available() {
#if defined(LOOM_TORCH_CUDA)
  return torch::cuda::is_available();
#else
  return false;
#endif
}

// Peak bytes allocated by the CUDA caching allocator on `device_index` since the last reset;
// 0 when the build has no CUDA.
inline std::int64_t cuda_peak_allocated_bytes(int device_index) {
#if defined(LOOM_TORCH_CUDA)
  const auto stats =
      c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(device_index));
  return stats.allocated_bytes[0].peak;  // index 0: the aggregate over all pools
#else
  (void)device_index;
  return 0;
#endif
}

// Bytes the CUDA caching allocator has handed out on `device_index` now; 0 without CUDA.
inline std::int64_t cuda_allocated_bytes(int device_index) {
#if defined(LOOM_TORCH_CUDA)
  const auto stats =
      c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(device_index));
  return stats.allocated_bytes[0].current;
#else
  (void)device_index;
  return 0;
#endif
}

// Bytes in use on the whole device `device_index` now (cudaMemGetInfo's total minus free: the
// CUDA context, the caching allocator's reserved segments, NCCL's buffers, every process on the
// device); 0 without CUDA.
inline std::int64_t cuda_device_used_bytes(int device_index) {
#if defined(LOOM_TORCH_CUDA)
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index));
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky error: the figure is only reported
    return 0;
  }
  return static_cast<std::int64_t>(total_bytes - free_bytes);
#else
  (void)device_index;
  return 0;
#endif
}

// The CUDA device's name ("NVIDIA H100 80GB HBM3"); "" without CUDA.
inline std::string cuda_device_name(int device_index) {
#if defined(LOOM_TORCH_CUDA)
  return at::cuda::getDeviceProperties(device_index)->name;
#else
  (void)device_index;
  return "";
#endif
}

// Resets the CUDA peak counters of `device_index`; no-op without CUDA.
inline void cuda_reset_peak(int device_index) {
#if defined(LOOM_TORCH_CUDA)
  c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(device_index));
#else
  (void)device_index;
#endif
}

// Makes `device_index` the calling thread's current CUDA device (NCCL's barrier and kernels
// launched without an explicit device use it); no-op without CUDA.
inline void cuda_set_device(int device_index) {
#if defined(LOOM_TORCH_CUDA)
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(device_index));
#else
  (void)device_index;
#endif
}

// Blocks until queued CUDA work on `device_index` is done; no-op without CUDA.
inline void cuda_synchronize(int device_index) {
#if defined(LOOM_TORCH_CUDA)
  torch::cuda::synchronize(device_index);
#else
  (void)device_index;
#endif
}

// ---------------------------------------------------------------------------------------------
// Random state and memory accounting

// The default generators' states (the CPU one, and the CUDA one of `device` in CUDA builds): what
// recomputation restores so that dropout draws the same masks again.
struct RngState {
  torch::Tensor cpu;
  torch::Tensor cuda;
  int cuda_device = -1;
};

inline RngState capture_rng(const torch::Device& device) {
  RngState state;
  at::Generator cpu = at::detail::getDefaultCPUGenerator();
  {
    std::lock_guard<std::mutex> lock(cpu.mutex());
    state.cpu = cpu.get_state();
  }
#if defined(LOOM_TORCH_CUDA)
  if (device.is_cuda()) {
    const int index = device.has_index() ? device.index() : 0;
    at::Generator cuda = at::cuda::detail::getDefaultCUDAGenerator(index);
    std::lock_guard<std::mutex> lock(cuda.mutex());
    state.cuda = cuda.get_state();
    state.cuda_device = index;
  }
#else
  (void)device;
#endif
  return state;
}

inline void restore_rng(const RngState& state) {
  at::Generator cpu = at::detail::getDefaultCPUGenerator();
  {
    std::lock_guard<std::mutex> lock(cpu.mutex());
    cpu.set_state(state.cpu);
  }
#if defined(LOOM_TORCH_CUDA)
  if (state.cuda_device >= 0) {
    at::Generator cuda = at::cuda::detail::getDefaultCUDAGenerator(state.cuda_device);
    std::lock_guard<std::mutex> lock(cuda.mutex());
    cuda.set_state(state.cuda);
  }
#endif
}

// Counts the bytes of CPU tensors the calling thread allocates while installed (LibTorch's CPU
// allocator reports every allocation and free to the thread's memory reporter when one is
// installed, as its profiler does): current and peak bytes in use, two ways.
// - thread: the sizes reported to this counter: the calling thread's allocations, less the frees
//   the calling thread makes (a tensor freed by another thread, such as a Gloo worker dropping
//   the last reference, is never subtracted; right when several ranks share the process).
// - process: the allocator's own total of the allocations made while a thread had a reporter,
//   less those freed on a thread with a reporter (the allocator subtracts only there: work that
//   another thread may free last, such as Gloo's, is released on the rank's thread, see
//   executor/distributed.cpp). Right when one rank runs in the process.
// The signature of the report changed from int64_t to size_t totals in 2.x; both overloads are
// declared, the one matching the base class overrides it.
class CpuMemoryCounter : public c10::MemoryReportingInfoBase {
 public:
  // NOLINTNEXTLINE(readability-inconsistent-declaration-parameter-name)
  void reportMemoryUsage(void* /*ptr*/, int64_t alloc_size, int64_t total_allocated,
                         int64_t /*total_reserved*/, c10::Device device) {
    count(alloc_size, total_allocated, device);
  }
  void reportMemoryUsage(void* /*ptr*/, int64_t alloc_size, size_t total_allocated,
                         size_t /*total_reserved*/, c10::Device device) {
    count(alloc_size, static_cast<std::int64_t>(total_allocated), device);
  }
  bool memoryProfilingEnabled() const override { return true; }

  std::int64_t current_bytes() const { return current_; }
  std::int64_t peak_bytes() const { return peak_; }
  // Process-wide: measured from the first report to this counter (bytes tracked before it, by
  // another counter, count too).
  std::int64_t process_current_bytes() const { return process_current_ - process_base_; }
  std::int64_t process_peak_bytes() const { return process_peak_ - process_base_; }
  // Starts a new peak from the current use.
  void reset_peak() {
    peak_ = current_;
    process_peak_ = process_current_;
  }

 private:
  void count(int64_t alloc_size, std::int64_t total_allocated, c10::Device device) {
    if (!device.is_cpu()) return;
    if (!started_) {  // the first report: the total before it is the base
      started_ = true;
      process_base_ = total_allocated - alloc_size;
      process_peak_ = process_base_;
    }
    current_ += alloc_size;
    peak_ = std::max(peak_, current_);
    process_current_ = total_allocated;
    process_peak_ = std::max(process_peak_, process_current_);
  }
  std::int64_t current_ = 0;
  std::int64_t peak_ = 0;
  bool started_ = false;
  std::int64_t process_base_ = 0;
  std::int64_t process_current_ = 0;
  std::int64_t process_peak_ = 0;
};

// Installs a CpuMemoryCounter for the calling thread while alive.
class CpuMemoryScope {
 public:
  CpuMemoryScope()
      : counter_(std::make_shared<CpuMemoryCounter>()),
        guard_(c10::DebugInfoKind::PROFILER_STATE, counter_) {}
  CpuMemoryCounter& counter() { return *counter_; }

 private:
  std::shared_ptr<CpuMemoryCounter> counter_;
  c10::DebugInfoGuard guard_;
};

// A rank's tensor bytes on its device behind one interface: the CUDA caching allocator's figures
// on a GPU; on CPUs a CpuMemoryCounter's, the whole process's (one rank in the process) or, with
// `own_thread`, the calling thread's alone (several ranks share the process).
class DeviceMemory {
 public:
  DeviceMemory(bool cuda, int device_index, CpuMemoryCounter& cpu, bool own_thread)
      : cuda_(cuda), index_(device_index), cpu_(cpu), own_thread_(own_thread) {}
  std::int64_t current_bytes() const {
    if (cuda_) return cuda_allocated_bytes(index_);
    return own_thread_ ? cpu_.current_bytes() : cpu_.process_current_bytes();
  }
  std::int64_t peak_bytes() const {
    if (cuda_) return cuda_peak_allocated_bytes(index_);
    return own_thread_ ? cpu_.peak_bytes() : cpu_.process_peak_bytes();
  }
  // What the whole device has in use (cuda_device_used_bytes); 0 on CPUs, which have no such
  // figure beyond the process's resident set.
  std::int64_t device_used_bytes() const { return cuda_ ? cuda_device_used_bytes(index_) : 0; }
  // Starts a new peak from the bytes in use now.
  void reset_peak() {
    if (cuda_) cuda_reset_peak(index_);
    cpu_.reset_peak();
  }

 private:
  bool cuda_;
  int index_;
  CpuMemoryCounter& cpu_;
  bool own_thread_;
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

// A Gloo group over `store` with one TCP device bound to `interface` when given, else to
// `host` when given, else to this machine's hostname; every operation times out after `timeout`.
// Blocks until all `size` members have joined. Throws std::runtime_error in a build without Gloo.
#if defined(LOOM_HAS_GLOO)
inline c10::intrusive_ptr<CollectiveBackend> make_gloo_backend(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    std::chrono::milliseconds timeout, const std::string& host, const std::string& interface) {
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  if (!interface.empty()) {
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(interface));
  } else if (!host.empty()) {
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(host));
  } else {
    options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  }
  options->threads = 2;
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
}
#else
inline c10::intrusive_ptr<CollectiveBackend> make_gloo_backend(
    const c10::intrusive_ptr<c10d::Store>& /*store*/, int /*rank*/, int /*size*/,
    std::chrono::milliseconds /*timeout*/, const std::string& /*host*/,
    const std::string& /*interface*/) {
  throw std::runtime_error(
      "this build of Loom has no Gloo (its LibTorch ships no gloo headers): CPU tensors cannot be "
      "communicated; use --device cuda (NCCL)");
}
#endif

// Whether this build has NCCL (a CUDA build whose LibTorch was compiled with it).
#if defined(LOOM_TORCH_CUDA) && defined(USE_C10D_NCCL)
inline constexpr bool kHasNccl = true;
// An NCCL group (communicators are created at the first collective) with `timeout`.
inline c10::intrusive_ptr<CollectiveBackend> make_nccl_backend(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    std::chrono::milliseconds timeout) {
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
}
// Ends an NCCL group's communicators before it is destroyed (2.4 and later warn, and may hang
// other ranks, when a group is destroyed without it). Every rank calls it, in the same order.
inline void shutdown_nccl_backend(const c10::intrusive_ptr<CollectiveBackend>& backend) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  static_cast<c10d::ProcessGroupNCCL&>(*backend).shutdown();
#else
  (void)backend;
#endif
}
#else
inline constexpr bool kHasNccl = false;
inline c10::intrusive_ptr<CollectiveBackend> make_nccl_backend(
    const c10::intrusive_ptr<c10d::Store>& /*store*/, int /*rank*/, int /*size*/,
    std::chrono::milliseconds /*timeout*/) {
  throw std::runtime_error("this build of Loom has no NCCL (a CPU LibTorch): use Gloo");
}
inline void shutdown_nccl_backend(const c10::intrusive_ptr<CollectiveBackend>& /*backend*/) {}
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

// How long waiting for a work may block the host: the group's timeout for Gloo (the wait is
// where it fails); none for NCCL, whose wait with a timeout blocks the host until the kernels end
// (2.x) and whose own watchdog enforces the group's timeout. 0 is c10d's kNoTimeout.
inline std::chrono::milliseconds wait_timeout(bool nccl, std::chrono::milliseconds timeout) {
  return nccl ? std::chrono::milliseconds(0) : timeout;
}

}  // namespace loom::executor::compat
