#include "costmodel/zero.hpp"

#include <stdexcept>
#include <string>

namespace loom::costmodel {

ZeroPolicy zero_policy(int stage) {
  if (stage < 0 || stage > 3) {
    throw std::invalid_argument("ZeRO stage " + std::to_string(stage) + " is not 0, 1, 2 or 3");
  }
  ZeroPolicy p;
  p.shards_optimizer_states = stage >= 1;
  p.shards_gradients = stage >= 2;
  p.shards_parameters = stage == 3;
  p.reduces_every_micro_batch = stage >= 2;
  p.gathers_after_step = stage == 1 || stage == 2;
  p.gathers_before_forward = stage == 3;
  p.reduces_norm_over_dp = stage >= 1;
  p.gathers_per_block = stage == 3;
  p.reduce_scatters_gradients = stage >= 2;
  return p;
}

}  // namespace loom::costmodel
