#include "costmodel/optimizer.hpp"

#include <algorithm>

namespace loom::costmodel {

double optimizer_bytes_per_parameter(OptimizerKernels kernels) {
  return kernels == OptimizerKernels::kFused ? 28 : 80;
}

double optimizer_host_ops_per_tensor(OptimizerKernels kernels) {
  return kernels == OptimizerKernels::kPerTensor ? 9 : 0;
}

OptimizerStepRates optimizer_step_rates(OptimizerKernels kernels, const DeviceRates& rates) {
  return {optimizer_bytes_per_parameter(kernels) / rates.memory_bytes_per_s,
          optimizer_host_ops_per_tensor(kernels) * rates.host_op_s};
}

double optimizer_step_s(const OptimizerStepRates& rates, double parameters, double tensors) {
  return std::max(parameters * rates.s_per_parameter, tensors * rates.s_per_tensor);
}

}  // namespace loom::costmodel
