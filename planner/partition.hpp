// Layer-to-stage partition: which contiguous range of the layer sequence (embedding, transformer
// layers, head) each pipeline stage holds.
//
// The embedding and the head weigh differently from a transformer layer (the embedding holds the
// word table but little compute; an LM head holds a vocab-sized matmul), so equal layer counts
// leave stages unbalanced. balanced_partition minimises the slowest stage's per-micro-batch time
// (forward + backward, tensor-parallel collectives included) subject to every stage fitting in
// memory, by a bottleneck search: for a candidate bottleneck T, stages are filled greedily from
// the last one backwards (later 1F1B stages hold fewer micro-batches, so they absorb the heavier
// ranges); the smallest T for which the greedy covers the sequence is found by bisection over the
// finitely many range sums. Pure and deterministic.
#pragma once

#include <optional>
#include <vector>

#include "costmodel/estimate.hpp"

namespace loom::planner {

// The balanced partition for `strategy` (pp chunks; interleaved schedules keep Megatron's equal
// chunks and get even_partition). nullopt when no partition fits `memory_limit_bytes` per device.
std::optional<std::vector<costmodel::StageRange>> balanced_partition(
    const costmodel::CostModel& cost, const costmodel::Job& job,
    const costmodel::Strategy& strategy, double memory_limit_bytes);
// The same from the strategy's terms (cost.step_terms(job, strategy)).
std::optional<std::vector<costmodel::StageRange>> balanced_partition(
    const costmodel::CostModel& cost, const costmodel::StepTerms& terms, const costmodel::Job& job,
    const costmodel::Strategy& strategy, double memory_limit_bytes);

// Parses "0-0,1-13" (inclusive ranges of the layer sequence, one per stage) as given to
// `loom plan --stages`. Throws InputError naming `source` on bad syntax.
std::vector<costmodel::StageRange> parse_stages(const std::string& text, const std::string& source);

}  // namespace loom::planner
