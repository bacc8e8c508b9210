// The order in which one pipeline rank runs its forward and backward passes in a training step,
// without LibTorch (the io library). The many-rank training step runs exactly this list.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "costmodel/strategy.hpp"

namespace loom::executor {

struct PipelineTask {
  bool forward = true;
  int chunk = 0;                 // the rank's local model chunk, 0 .. virtual_stages - 1
  std::int64_t micro_batch = 0;  // 0 .. num_micro_batches - 1
  bool operator==(const PipelineTask&) const = default;
};

// The tasks of pipeline rank `rank` (0 .. pp - 1) in one step of `num_micro_batches`:
//   gpipe: every forward, then every backward, micro-batches in order;
//   1f1b: min(pp - rank - 1, m) warm-up forwards, then one forward and one backward in turn,
//     then the remaining backwards;
//   interleaved (virtual_stages v >= 2, the rank holding global chunks k * pp + rank):
//     Megatron-LM's interleaved 1F1B, virtual micro-step i running micro-batch
//     (i / (pp v)) pp + i % pp on local chunk (i % (pp v)) / pp (backward: v - 1 - that), with
//     (pp - rank - 1) * 2 + (v - 1) * pp warm-up forwards (all of them when m = pp).
// Every backward of a micro-batch and chunk comes after its forward.
std::vector<PipelineTask> pipeline_order(costmodel::Schedule schedule, int pp, int rank,
                                         std::int64_t num_micro_batches, int virtual_stages);

// "F0 F1 B0 ..." (with virtual stages: "F0.1" = micro-batch 0 on local chunk 1).
std::string to_string(const std::vector<PipelineTask>& tasks, bool show_chunks = false);

}  // namespace loom::executor
