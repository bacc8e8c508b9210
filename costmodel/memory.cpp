#include "costmodel/memory.hpp"

#include <algorithm>

#include "costmodel/layers.hpp"
#include "costmodel/zero.hpp"

namespace loom::costmodel {

ModelStateBytes model_state_bytes(double parameters, int dp, int zero, Precision precision) {
  const bool mixed = element_bytes(precision) == 2;
  double param_bytes = mixed ? 2 : 4;
  double grad_bytes = mixed ? 2 : 4;
  double optimizer_bytes = mixed ? 12 : 8;
  const ZeroPolicy policy = zero_policy(zero);
  ModelStateBytes out;
  out.parameter_bytes = parameters * param_bytes / (policy.shards_parameters ? dp : 1);
  out.gradient_bytes = parameters * grad_bytes / (policy.shards_gradients ? dp : 1);
  out.optimizer_bytes = parameters * optimizer_bytes / (policy.shards_optimizer_states ? dp : 1);
  return out;
}

}  // namespace loom::costmodel
