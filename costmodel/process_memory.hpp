// Memory a training process holds on a GPU beyond its tensors, each a named line of the memory
// breakdown (MemoryBreakdown, estimate.hpp) with its source (docs/runtimes.md):
//
//   cuda_context    the CUDA context with PyTorch's kernels loaded lazily: the device file's
//                   cuda_context_mib where measured, else an estimate (kCudaContextBytes)
//   workspaces      cuBLAS/cuBLASLt workspaces: PyTorch's default CUBLAS_WORKSPACE_CONFIG per
//                   handle (":4096:2:16:8", 8 MiB + 128 KiB, before Hopper; ":4096:8", 32 MiB,
//                   on Hopper: the device's blas_workspace_mib); training uses two handles (the
//                   forward thread's and the autograd device thread's). PyTorch takes them from
//                   its caching allocator, so they count among the tensors (the allocator's
//                   peak) as well as the device's used memory
//   nccl_buffers    per communicator the rank joins: channels x peers x the buffers of NCCL's three
//                   protocols (Simple: NCCL_BUFFSIZE 4 MiB; LL128 4.6875 MiB; LL 512 KiB)
//   fragmentation   the caching allocator's reserved-but-unallocated memory, a fraction of the
//                   step's working buffers: the device's `fragmentation` (a calibrated
//                   cluster's), else kFragmentationFraction. Not of the kept activations: each
//                   step allocates them again at the same sizes in the same order, and the
//                   allocator hands back the blocks they freed (128 one-GPU runs on H100s and
//                   H200s: the device's used memory less the allocator's peak grew by 0.006
//                   of the activations and 0.19 of the working buffers, bench/RESULTS.md)
//
// All zero on CPU devices: Loom's CPU ranks run without any of these, and the CPU validation
// measures the allocator's own peak.
#pragma once

#include "costmodel/strategy.hpp"
#include "profiles/cluster.hpp"

namespace loom::costmodel {

struct ProcessMemory {
  double cuda_context_bytes = 0;
  double workspace_bytes = 0;
  double nccl_buffer_bytes = 0;
  double fragmentation_bytes = 0;
  double total() const {
    return cuda_context_bytes + workspace_bytes + nccl_buffer_bytes + fragmentation_bytes;
  }
};

inline constexpr double kCudaContextBytes = 512.0 * 1024 * 1024;
inline constexpr double kCublasWorkspaceBytes = (8.0 * 1024 + 128) * 1024;  // per handle
inline constexpr int kCublasHandles = 2;
// Simple (NCCL_BUFFSIZE) + LL128 + LL buffers of one connection.
inline constexpr double kNcclConnectionBytes = 4194304.0 + 4915200.0 + 524288.0;
inline constexpr int kNcclChannels = 8;
inline constexpr double kFragmentationFraction = 0.1;

// The NCCL communicators a rank of `strategy` joins and the peers it receives from in each:
// the dp, tp and pp groups of more than one rank, and the world when more than one of them
// exists. Ring and tree connections: 2 peers in a group of 3 or more ranks, 1 in a pair.
double nccl_connection_count(const Strategy& strategy);

// The process lines of a rank of `strategy` on `device` whose step holds `transient_bytes` of
// working buffers at its peak; all zero on CPU devices.
ProcessMemory process_memory(const profiles::DeviceSpec& device, const Strategy& strategy,
                             double transient_bytes);

}  // namespace loom::costmodel
