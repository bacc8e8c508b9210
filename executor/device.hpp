// The rank's device apart from the LibTorch version: whether CUDA is there and what it says
// (memory, name), the default random generators' state that recomputation and checkpoints restore,
// and the accounting of a rank's tensor bytes on CPUs and GPUs. CUDA-only code compiles only when
// the build defines LOOM_TORCH_CUDA (executor/CMakeLists.txt), so the CPU build never sees CUDA's
// headers; everything here answers "no CUDA" there.
#pragma once

#include <c10/core/Allocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#if defined(LOOM_TORCH_CUDA)
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#endif

namespace loom::executor {

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

// The default generators' states: the CPU one, and the CUDA one of the device a rank runs on.
// Recomputation restores them so that dropout draws the same masks again; checkpoints save them
// (executor/checkpoint.hpp).
struct GeneratorStates {
  torch::Tensor cpu;
  torch::Tensor cuda;    // undefined unless captured for a CUDA device
  int cuda_device = -1;  // its index
};

inline GeneratorStates capture_generators(const torch::Device& device) {
  GeneratorStates states;
  at::Generator cpu = at::globalContext().defaultGenerator(c10::DeviceType::CPU);
  {
    std::lock_guard<std::mutex> lock(cpu.mutex());
    states.cpu = cpu.get_state();
  }
  if (device.is_cuda()) {
    states.cuda_device = device.has_index() ? device.index() : 0;
    at::Generator cuda = at::globalContext().defaultGenerator(
        c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(states.cuda_device)));
    std::lock_guard<std::mutex> lock(cuda.mutex());
    states.cuda = cuda.get_state();
  }
  return states;
}

inline void restore_generators(const GeneratorStates& states) {
  at::Generator cpu = at::globalContext().defaultGenerator(c10::DeviceType::CPU);
  {
    std::lock_guard<std::mutex> lock(cpu.mutex());
    cpu.set_state(states.cpu);
  }
  if (states.cuda_device >= 0) {
    at::Generator cuda = at::globalContext().defaultGenerator(
        c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(states.cuda_device)));
    std::lock_guard<std::mutex> lock(cuda.mutex());
    cuda.set_state(states.cuda);
  }
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

}  // namespace loom::executor
