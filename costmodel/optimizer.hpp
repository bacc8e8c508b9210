// The optimizer step's time: AdamW as the job's kernels issue it (Job::optimizer_kernels), one
// home for the estimate and the simulator.
//
// A step over a rank's shard of P parameters in T tensors takes the longer of its kernels'
// memory traffic, P * bytes_per_parameter over the device's bandwidth, and the host's issue of
// its operations, T * host_ops_per_tensor * DeviceRates::host_op_s: the host launches
// asynchronously, so the two run side by side and the longer binds.
#pragma once

#include <optional>

#include "costmodel/compute.hpp"
#include "costmodel/strategy.hpp"

namespace loom::costmodel {

// Bytes per parameter the step's kernels move (fp32 weights, gradients and moments):
//   fused       28: one pass reading the weight, the gradient and both moments, writing the
//               weight and both moments
//   foreach,    80: PyTorch's AdamW as eight operations (torch/optim/adamw.py, foreach and
//   per_tensor  single-tensor paths alike), each its own pass: weight decay (read and write the
//               weight, 8), the first moment's lerp (12), the second's mul_ and addcmul_ (8 + 12),
//               sqrt, division and add_ of eps into a new tensor (8 each), and addcdiv_ into the
//               weight (16)
double optimizer_bytes_per_parameter(OptimizerKernels kernels);

// Host operations per tensor: per_tensor's eight kernels and its step counter's increment (a CPU
// tensor); none for fused and foreach, whose few launches per step are not charged.
double optimizer_host_ops_per_tensor(OptimizerKernels kernels);

// The per-parameter and per-tensor rates of one rank's step on `rates`' device (host time only on
// GPUs, where DeviceRates::host_op_s is set). A measured fused step (a profile of Loom's
// executor, seconds per parameter) replaces the bandwidth's, scaled to the kernels' bytes.
struct OptimizerStepRates {
  double s_per_parameter = 0;
  double s_per_tensor = 0;
};
OptimizerStepRates optimizer_step_rates(OptimizerKernels kernels, const DeviceRates& rates,
                                        std::optional<double> measured_fused_s_per_parameter = {});

// One step over `parameters` in `tensors` tensors.
double optimizer_step_s(const OptimizerStepRates& rates, double parameters, double tensors);

// The fp32 temporaries a step allocates beyond the states, on a rank whose shard holds
// `shard_parameters` and whose largest tensor (its shard of it) `largest_tensor_parameters`:
// foreach's square roots of the second moments, one for every tensor at once (4 bytes per
// parameter; the division and eps then work in place); the per-tensor loop's square root and its
// quotient, of one tensor at a time (8 bytes per parameter of the largest); none for a fused
// kernel (a runtime's own buffers aside: RuntimeRules::memory).
double optimizer_temporary_bytes(OptimizerKernels kernels, double shard_parameters,
                                 double largest_tensor_parameters);

}  // namespace loom::costmodel
