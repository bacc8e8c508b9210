#include "costmodel/optimizer.hpp"

#include <algorithm>

namespace loom::costmodel {

double optimizer_bytes_per_parameter(OptimizerKernels kernels) {
  return kernels == OptimizerKernels::kFused ? 28 : 80;
}

double optimizer_host_ops_per_tensor(OptimizerKernels kernels) {
  return kernels == OptimizerKernels::kPerTensor ? 9 : 0;
}

OptimizerStepRates optimizer_step_rates(OptimizerKernels kernels, const DeviceRates& rates,
                                        std::optional<double> measured_fused_s_per_parameter) {
  const double bytes = optimizer_bytes_per_parameter(kernels);
  const double s_per_parameter = measured_fused_s_per_parameter
                                     ? *measured_fused_s_per_parameter * bytes /
                                           optimizer_bytes_per_parameter(OptimizerKernels::kFused)
                                     : bytes / rates.memory_bytes_per_s;
  return {s_per_parameter, optimizer_host_ops_per_tensor(kernels) * rates.host_op_s};
}

double optimizer_temporary_bytes(OptimizerKernels kernels, double shard_parameters,
                                 double largest_tensor_parameters) {
  switch (kernels) {
    case OptimizerKernels::kFused:
      return 0;
    case OptimizerKernels::kForeach:
      return 4 * shard_parameters;
    case OptimizerKernels::kPerTensor:
      return 8 * std::min(largest_tensor_parameters, shard_parameters);
  }
  return 0;
}

double optimizer_step_s(const OptimizerStepRates& rates, double parameters, double tensors) {
  return std::max(parameters * rates.s_per_parameter, tensors * rates.s_per_tensor);
}

}  // namespace loom::costmodel
