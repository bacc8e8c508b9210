#include "costmodel/process_memory.hpp"

namespace loom::costmodel {

double nccl_connection_count(const Strategy& s) {
  auto peers = [](int ranks) { return ranks > 2 ? 2.0 : ranks == 2 ? 1.0 : 0.0; };
  double out = peers(s.dp) + peers(s.tp) + peers(s.pp);
  const int groups = (s.dp > 1) + (s.tp > 1) + (s.pp > 1);
  if (groups > 1) out += peers(s.world_size());
  return out;
}

ProcessMemory process_memory(const profiles::DeviceSpec& device, const Strategy& s,
                             double transient_bytes) {
  ProcessMemory out;
  if (device.kind != profiles::DeviceKind::kGpu) return out;
  out.cuda_context_bytes =
      device.cuda_context_mib ? *device.cuda_context_mib * 1024 * 1024 : kCudaContextBytes;
  out.workspace_bytes =
      kCublasHandles * (device.blas_workspace_mib ? *device.blas_workspace_mib * 1024 * 1024
                                                  : kCublasWorkspaceBytes);
  out.nccl_buffer_bytes = nccl_connection_count(s) * kNcclChannels * kNcclConnectionBytes;
  out.fragmentation_bytes = device.fragmentation.value_or(kFragmentationFraction) * transient_bytes;
  return out;
}

}  // namespace loom::costmodel
