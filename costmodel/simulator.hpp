// The event-driven simulator: one training step of a plan played as a task graph on per-rank
// compute and communication streams over the links of the cluster, with the cost model's
// durations. Where estimate() adds closed forms, the simulator plays the dependencies, so it sees
// what they miss: contention on shared links, stalls of blocking transfers, DP buckets that do
// not fit behind the backward pass, uneven stages. Deterministic: a plan always plays the same
// way.
//
// One representative rank per pipeline rank is played (the rank with dp = tp = 0); its tasks
// follow pipeline_order() and the ZeRO policy (zero.hpp), as the executor runs them. Results:
// - The step time is the last rank's finish. A rank's compute stream that waits is charged to
//   what it waited for: exposed communication of that kind (tp, pp, dp, zero: the meaning of
//   ExposedCommunication) or bubble; the step's exposed communication per kind is the largest
//   rank's.
// - The bubble fraction is the schedule's own, as bubble_fraction() defines it: the same schedule
//   with the same compute replayed without communication, exact where the closed form is
//   approximate (uneven stages).
// - Memory per rank over time: CostModel::stage_memory's static bytes plus the activations of the
//   chunks in flight; the peak is the prediction's memory.
// - Phases: a rank's step splits into the phases `loom train` records in metrics.jsonl
//   (phases_s); the time after a rank's last task until the step ends counts as gradients. The
//   phases add up to the step time.
//
// The pieces, each with its own contract: sim_events.hpp (the event queue), sim_network.hpp
// (links, sharing, a plan's flows), sim_engine.hpp (streams, waits, memory accounting),
// sim_step.hpp (the step's task graph).
//
// Cost: events grow with ranks-per-pipeline x micro-batches x chunks (plus buckets and layers for
// ZeRO), not with dp or tp: GPT-3 175B on 1024 GPUs (pp 16, 192 micro-batches) plays in well under
// a second (bench/bench_simulate.cpp).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "costmodel/estimate.hpp"
#include "costmodel/pipeline.hpp"
#include "costmodel/strategy.hpp"
#include "profiles/cluster.hpp"

namespace loom::costmodel {

// ---- One training step ------------------------------------------------------------------------

struct SimulationOptions {
  bool record_trace = true;  // fill SimulationResult::slices (names cost a little time)
  // When > 0, a step whose task graph has more tasks than this is not played: the result has
  // `skipped` set and nothing else (the planner keeps its analytical figure for such plans).
  std::int64_t max_tasks = 0;
};

enum class Stream { kCompute, kTensorParallel, kPipeline, kDataParallel, kZero };
constexpr int kStreamCount = 5;
// "compute", "comm tp", "comm pp", "comm dp", "comm zero".
const char* to_string(Stream stream);

enum class Phase { kForward, kBackward, kPipelineWait, kGradients, kOptimizer, kOther };
constexpr int kPhaseCount = 6;
// "forward", "backward", "pipeline_wait", "gradients", "optimizer", "other": metrics.jsonl's
// phases_s keys.
const char* to_string(Phase phase);

// One task as it ran on a representative rank.
struct TraceSlice {
  int rank = 0;  // global rank of the representative (dp = tp = 0)
  Stream stream = Stream::kCompute;
  // "F mb3 L0-11", "B mb3 L0-11", "allreduce tp F mb3 (24x 8.39 MB)", "send act mb3",
  // "allreduce dp 26.2 MB", "all-gather zero L5 50.3 MB", "optimizer step".
  std::string name;
  double start_s = 0;
  double duration_s = 0;
  int peer_rank = -1;  // a send: the rank the representative sends to; -1 otherwise
  bool operator==(const TraceSlice&) const = default;
};

struct MemorySample {
  double time_s = 0;
  double bytes = 0;  // everything the rank holds from time_s on
  bool operator==(const MemorySample&) const = default;
};

// One pipeline rank, as its representative played it.
struct RankTimeline {
  int rank = 0;  // global rank of the representative: pipeline_rank * dp * tp
  int pipeline_rank = 0;
  double busy_s = 0;    // compute stream busy: forward, backward, optimizer
  double idle_s = 0;    // step_time_s - busy_s
  double finish_s = 0;  // when its last task ended
  double optimizer_s = 0;
  ExposedCommunication exposed_communication_s;  // compute stream waiting on communication
  double bubble_s = 0;             // compute stream waiting on other ranks, and idle after finish_s
  double static_memory_bytes = 0;  // parameters, gradients, optimizer states, buffers
  double activation_bytes_per_micro_batch = 0;  // all of the rank's chunks, one micro-batch
  double peak_activation_bytes = 0;
  double peak_memory_bytes = 0;      // static + peak activations
  std::vector<MemorySample> memory;  // starts at time 0 with the static bytes
  // Seconds per Phase (index: static_cast<int>(Phase)); they add up to the step time.
  std::array<double, kPhaseCount> phases_s{};
};

struct SimulationResult {
  double step_time_s = 0;
  double bubble_fraction = 0;
  ExposedCommunication exposed_communication_s;  // the largest rank's, per kind
  int world_size = 0;
  int ranks_per_stage = 1;  // dp * tp: global rank g is represented by ranks[g / ranks_per_stage]
  std::vector<RankTimeline> ranks;        // one per pipeline rank
  std::vector<std::string> device_names;  // per global rank ("node0/gpu3"), for the trace
  // Filled as estimate() fills it, from the simulated step; source = "simulation".
  Prediction prediction;
  bool skipped = false;               // see SimulationOptions::max_tasks
  std::int64_t tasks = 0;             // size of the task graph when skipped
  std::int64_t events_processed = 0;  // events acted on (stale flow events not counted)
  // The representatives' tasks that took time (options.record_trace), sorted by rank, stream,
  // start and name.
  std::vector<TraceSlice> slices;

  const RankTimeline& timeline_of(int global_rank) const {
    return ranks[static_cast<std::size_t>(global_rank / ranks_per_stage)];
  }
  // The share of the step in which each pipeline rank's compute stream does nothing (waiting on
  // other stages or on communication): idle_s / step_time_s, in pipeline order. Empty when
  // nothing was played. What `loom plan` and the report print as the devices' idle share.
  std::vector<double> idle_shares() const;
  // Their mean over the pipeline ranks (every rank of a stage idles alike); 0 when empty.
  double mean_idle_share() const;
};

// Plays one step. Requires check_strategy() and check_partition() to pass (std::invalid_argument
// with their message otherwise), like estimate().
SimulationResult simulate(const CostModel& cost, const Job& job, const Strategy& strategy,
                          const std::vector<StageRange>& stages,
                          const SimulationOptions& options = {});

// A pipeline schedule alone, communication free: chunk c (pp * virtual_stages of them, chunk c on
// pipeline rank c % pp) takes chunks[c] per micro-batch. One rank per stage (world = pp); no
// memory, no optimizer; prediction holds the step time and bubble only. std::invalid_argument when
// the sizes do not fit the schedule.
SimulationResult simulate_schedule(const std::vector<StageTime>& chunks, int pp,
                                   std::int64_t micro_batches, Schedule schedule,
                                   int virtual_stages, const SimulationOptions& options = {});

// ---- The network alone ------------------------------------------------------------------------

// One point-to-point transfer between devices of a cluster (device indices, node-major).
struct Transfer {
  int from_device = 0;
  int to_device = 0;
  double bytes = 0;
  double start_s = 0;
};

// Plays `transfers` over the links of `cluster` with the simulator's network model (equal shares
// of every directed link, rates recomputed as transfers start and end; each transfer its route's
// latency, then its bytes); returns when each one ends. InputError for a bad cluster,
// std::invalid_argument for a device out of range.
std::vector<double> simulate_transfers(const profiles::Cluster& cluster,
                                       const std::vector<Transfer>& transfers);

}  // namespace loom::costmodel
