// Memory per rank: model states under ZeRO. (How many micro-batches' activations each pipeline
// schedule keeps alive is the schedule's rule: activation_micro_batches_in_flight, schedule.hpp.)
#pragma once

#include <cstdint>

#include "costmodel/strategy.hpp"

namespace loom::costmodel {

// Bytes of parameters, gradients and optimizer states one data-parallel rank holds.
struct ModelStateBytes {
  double parameter_bytes = 0;
  double gradient_bytes = 0;
  double optimizer_bytes = 0;
  double total() const { return parameter_bytes + gradient_bytes + optimizer_bytes; }
};

// Rajbhandari et al. 2020 (ZeRO), section 3.1 and Table 1: with mixed precision (fp16/bf16) and
// Adam, 2 bytes of parameters, 2 of gradients and K = 12 of optimizer states (fp32 master
// weights, momentum, variance) per parameter. With fp32 training: 4 + 4 + 8 (no master copy).
// Stage 1 shards the optimizer states over dp, stage 2 also the gradients, stage 3 also the
// parameters. `parameters` is the count this rank's model replica holds (after tp and pp).
ModelStateBytes model_state_bytes(double parameters, int dp, int zero, Precision precision);

}  // namespace loom::costmodel
