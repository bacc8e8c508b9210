// Memory per rank: model states under ZeRO, and how many micro-batches' activations each
// pipeline schedule keeps alive.
#pragma once

#include <cstdint>

#include "costmodel/strategy.hpp"

namespace loom::costmodel {

// Bytes of parameters, gradients and optimizer states one data-parallel rank holds.
struct ModelStateBytes {
  double parameters = 0;
  double gradients = 0;
  double optimizer = 0;
  double total() const { return parameters + gradients + optimizer; }
};

// Rajbhandari et al. 2020 (ZeRO), section 3.1 and Table 1: with mixed precision (fp16/bf16) and
// Adam, 2 bytes of parameters, 2 of gradients and K = 12 of optimizer states (fp32 master
// weights, momentum, variance) per parameter. With fp32 training: 4 + 4 + 8 (no master copy).
// Stage 1 shards the optimizer states over dp, stage 2 also the gradients, stage 3 also the
// parameters. `parameters` is the count this rank's model replica holds (after tp and pp).
ModelStateBytes model_state_bytes(double parameters, int dp, int zero, Precision precision);

// How many micro-batches' worth of this stage's activations are alive at the peak, on pipeline
// rank `stage` of `pp` with `micro_batches` per step (in units of one full stage, i.e. all of the
// rank's chunks). GPipe: all m. 1F1B: min(pp - stage, m) (Narayanan et al. 2021). Interleaved
// with v chunks: Megatron-LM's warm-up of (pp - stage - 1) * 2 + (v - 1) * pp chunk-micro-batches
// plus the one in flight, capped at m * v, divided by v (Korthikanti et al. 2022, section 4.2.3:
// the first stage holds p (1 + (p - 1)/(p v)) micro-batches); when m == pp Megatron-LM warms up
// every forward, so every stage holds all m.
double activation_micro_batches_in_flight(Schedule schedule, int pp, int stage,
                                          std::int64_t micro_batches, int virtual_stages);

}  // namespace loom::costmodel
