// The event-driven simulator: one training step of a plan played as a task graph on per-rank
// compute and communication streams over the links of the cluster, with the cost model's
// durations. Where estimate() adds closed forms, the simulator plays the dependencies, so it sees
// what they miss: contention on shared links, stalls of blocking transfers, DP buckets that do
// not fit behind the backward pass, uneven stages.
//
// The model, in the order a reader needs to trust the numbers:
//
// - Core. Events are kept in order of (time, sequence number), so events at equal times run in
//   the order they were scheduled and a plan always plays the same way. Tasks have predecessors
//   and a stream; a stream runs its tasks one at a time in the order they were issued (program
//   order, like a CUDA stream); a task starts when its predecessors are done and it heads its
//   stream. There is no other state: no globals, no clocks.
//
// - Symmetry. Ranks of one pipeline stage that differ only in their dp or tp index run the same
//   tasks at the same times, so one representative per pipeline rank is played: the rank with
//   dp = tp = 0, global rank pipeline_rank * dp * tp. Every communication task is a flow that
//   stands for all of its copies (all dp or tp groups of the stage, every rank pair between two
//   stages), so the links carry the load of every group, as GroupLinks accounts for it.
//
// - Network. Links are the directed links of the cluster graph (profiles::Topology's: device
//   uplinks to a node switch and node uplinks to the fabric, or the explicit links, widest path
//   first). A link's bandwidth is shared equally by the transfers crossing it at that moment (the
//   rule of Topology::concurrent_rings); a flow moves at the rate of its narrowest share, and the
//   rates of the flows that share a link with a flow are recomputed whenever it starts or ends. A
//   collective over rings of n ranks is one flow whose every ring hop carries the ring
//   algorithm's bytes (all-reduce 2 (n-1)/n * bytes, reduce-scatter and all-gather (n-1)/n *
//   bytes, p2p all of them), after the algorithm's latency (2 (n-1), n-1 or 1 hop latencies, the
//   hop latency being the largest route latency of the flow). Alone, a flow takes exactly
//   collective_time_s() over the link GroupLinks gives its group.
//
// - Tasks of one rank, per micro-batch and model chunk (a StageRange):
//   forward and backward compute (recomputation inside the backward); the chunk's tensor-parallel
//   all-reduces lumped into one flow right after each (blocking: the compute stream waits, as the
//   all-reduces sit inside the layers); a send of the activation (forward) or its gradient
//   (backward) to the neighbouring chunk's rank, blocking like Megatron-LM's p2p calls, which wait
//   on their requests, and, when tp > 1 without sequence parallelism, the receiving group's
//   all-gather of it (Megatron's scatter-gather; on the receiver's pp stream). Data parallelism:
//   the gradients of a chunk are all-reduced in buckets of CostOptions::dp_bucket_bytes issued
//   as its backward produces them (gradient bytes in proportion to backward time): during the
//   chunk's last micro-batch (ZeRO 0/1) or during every micro-batch (ZeRO-2/3, whose gradients
//   do not accumulate unsharded), as Loom's executor does. ZeRO-3 gathers the stage's parameters
//   before the step's first forward pass (the executor holds them for the whole step). Then the
//   optimizer step on the rank's shard (CostModel::kOptimizerBytesPerParameter bytes per
//   parameter at the device's memory rate, after every gradient reduction) and, with ZeRO-1/2,
//   the all-gather of the updated parameters. A rank's step ends when all its streams
//   are done; the step time is the last rank's.
//
// - Schedules: each rank runs its passes in pipeline_order() (schedule.hpp), the order the
//   executor runs.
//
// - Memory per rank over time: the static bytes of CostModel::stage_memory (parameters,
//   gradients, optimizer states, buffers) plus activations, allocated when a chunk's forward
//   starts and freed when its backward ends. The peak is the prediction's memory.
//
// - Phases. A rank's step also splits into the phases `loom train` records in metrics.jsonl
//   (phases_s), so a prediction can be read next to a measurement: a compute task counts in its
//   own phase (F: forward, B: backward, the optimizer step: optimizer, the step's scalar
//   all-reduces: other); a wait counts in the phase of what it waited for (a tp all-reduce: its
//   pass's; a pp transfer and the bubble: pipeline_wait; a dp bucket: backward with ZeRO-2/3 (the
//   executor reduces them inside the backward pass) or when a backward segment waits for it (CPU
//   ranks), else gradients; ZeRO's gather: other before the step's first
//   forward (ZeRO-3), optimizer after the step (ZeRO-1/2)); the time after a rank's last task until
//   the step ends is gradients (the executor's first collective over all ranks after the backward
//   passes: the gradient reduction or the norm's all-reduce). The phases add up to the step time.
//
// - Accounting. A compute stream that waits is charged to what it waited for: when a task starts
//   after a gap, the part of the gap during which the predecessor that finished last (a
//   communication task) ran is exposed communication of that task's kind (tp, pp, dp, zero: the
//   meaning of ExposedCommunication; the chain of communication tasks that released the waiting
//   task is followed back, across ranks, until a compute task), the rest is bubble (waiting on
//   other ranks' compute, which includes their own stalls). The step's exposed communication per
//   kind is the largest rank's. The bubble fraction is the schedule's own, as bubble_fraction()
//   defines it: the same schedule with the same compute replayed without communication, (end of
//   the last forward or backward - m * max_r T_r) / (m * max_r T_r), T_r the forward and backward
//   compute of rank r per micro-batch; exact where the closed form is approximate (uneven stages).
//
// Cost: events grow with ranks-per-pipeline x micro-batches x chunks (plus buckets and layers for
// ZeRO), not with dp or tp: GPT-3 175B on 1024 GPUs (pp 16, 192 micro-batches) plays in well under
// a second (bench/bench_simulate.cpp).
#pragma once

#include <array>
#include <cstdint>
#include <queue>
#include <string>
#include <vector>

#include "costmodel/estimate.hpp"
#include "costmodel/pipeline.hpp"
#include "costmodel/strategy.hpp"
#include "profiles/cluster.hpp"

namespace loom::costmodel {

// ---- The discrete-event core ------------------------------------------------------------------

enum class EventKind {
  kTaskEnd,     // a task with a fixed duration (compute, or a flow with nothing to move) ends
  kLatencyEnd,  // a flow's latency has passed: its bytes enter the network
  kFlowDrain,   // a flow's last byte arrives, if `version` is still the flow's current one
};

struct Event {
  double time_s = 0;
  std::uint64_t sequence = 0;  // order of scheduling: breaks ties between equal times
  EventKind kind = EventKind::kTaskEnd;
  int task = 0;
  std::uint64_t version = 0;  // kFlowDrain: the flow's rate version when scheduled
};

// Events in order of (time_s, sequence); sequence numbers are given in push order.
class EventQueue {
 public:
  void push(double time_s, EventKind kind, int task, std::uint64_t version = 0);
  bool empty() const { return heap_.empty(); }
  // The earliest event; requires !empty().
  Event pop();

 private:
  struct Later {
    bool operator()(const Event& a, const Event& b) const {
      return a.time_s != b.time_s ? a.time_s > b.time_s : a.sequence > b.sequence;
    }
  };
  std::priority_queue<Event, std::vector<Event>, Later> heap_;
  std::uint64_t next_sequence_ = 0;
};

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
