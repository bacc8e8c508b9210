// Pipeline schedules: which forward and backward passes each pipeline rank runs, and in which
// order. The one home of every schedule rule: the names (the "schedule" values of loom-plan/1 and
// the words of --schedule), the combinations of pipeline ranks, micro-batches and virtual stages a
// schedule accepts, the order of passes on a rank and how many micro-batches' activations that
// order keeps alive. The simulator plays pipeline_order() and the executor runs it, so a
// prediction and a training run follow the same order.
//
// The schedules, as Megatron-LM orders them on pipeline rank r of pp with m micro-batches a step:
// - gpipe: all m forward passes, then all m backward passes, both in micro-batch order.
// - 1f1b: w = min(pp - r - 1, m) warm-up forwards, then one forward and one backward at a time
//   (forward w + i, backward i), then the w cool-down backwards (Narayanan et al. 2021).
// - interleaved: v model chunks per rank; global chunk c of the pp * v runs on rank c % pp, so
//   local chunk k of rank r is global chunk k * pp + r. The rank's m * v forwards are numbered
//   i = 0 .. m v - 1 in groups of pp micro-batches: forward i runs local chunk (i mod pp v) / pp
//   of micro-batch (i / (pp v)) * pp + i mod pp, backward i the same micro-batch on local chunk
//   v - 1 - that. Warm-up: (pp - r - 1) * 2 + (v - 1) * pp forwards, capped at m v, and all m v
//   of them when m == pp; then one forward one backward, then the cool-down backwards. Needs
//   v >= 2, pp >= 2 and m a multiple of pp.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace loom::costmodel {

enum class Schedule { kGpipe, k1F1B, kInterleaved };

// "gpipe", "1f1b", "interleaved".
const char* to_string(Schedule schedule);
std::optional<Schedule> parse_schedule(const std::string& text);
// Every schedule's name, in the enum's order (for JSON readers and command-line choices).
std::vector<std::string> schedule_names();

// Why `schedule` cannot run `num_micro_batches` micro-batches over `pp` pipeline ranks with
// `virtual_stages` model chunks per rank, or nullopt when it can. The message names the rule and
// the numbers ("the interleaved schedule needs the 5 micro-batches to be a multiple of pp=2").
std::optional<std::string> check_schedule(Schedule schedule, int pp, std::int64_t num_micro_batches,
                                          int virtual_stages);
// The part of check_schedule() about virtual stages alone: 1 for gpipe and 1f1b, >= 2 for
// interleaved.
std::optional<std::string> check_virtual_stages(Schedule schedule, int virtual_stages);

enum class PassKind { kForward, kBackward };

// One pass of one micro-batch through one of a rank's model chunks.
struct PipelineOp {
  PassKind pass = PassKind::kForward;
  std::int64_t micro_batch = 0;
  int chunk = 0;  // local model chunk of the rank, 0 .. virtual_stages - 1
  bool operator==(const PipelineOp&) const = default;
};

// The global chunk (0 .. pp * v - 1, the index into a plan's stages) of local chunk `chunk` of
// pipeline rank `rank`.
inline int global_chunk(int chunk, int pp, int rank) { return chunk * pp + rank; }

// The passes pipeline rank `rank` (0 .. pp - 1) runs in one step, in order: 2 * m * v of them.
// Requires check_schedule() to pass and 0 <= rank < pp (std::invalid_argument otherwise).
std::vector<PipelineOp> pipeline_order(Schedule schedule, int pp, int rank,
                                       std::int64_t num_micro_batches, int virtual_stages);

// An order as text, one token per pass separated by spaces: "F" or "B", the micro-batch, and when
// any pass of the order runs a chunk other than 0, "." and the local chunk: 1f1b pp=3 m=4 rank 0
// is "F0 F1 F2 B0 F3 B1 B2 B3"; "F0.1" is the forward of micro-batch 0 on local chunk 1.
std::string to_string(const std::vector<PipelineOp>& order);

// How many micro-batches' worth of a rank's activations (all of its chunks) pipeline_order() keeps
// alive at its peak, a forward's activations living from its start to its backward's end: gpipe
// m; 1f1b min(pp - rank, m); interleaved (min(warm-up + 1, m v)) / v, m when m == pp (for the
// first rank, Korthikanti et al. 2022 section 4.2.3: p (1 + (p - 1) / (p v))). In closed form
// (the planner calls it for every candidate).
double activation_micro_batches_in_flight(Schedule schedule, int pp, int stage,
                                          std::int64_t micro_batches, int virtual_stages);

}  // namespace loom::costmodel
