// The simulator's engine: tasks on per-rank streams, played in event order. Internal to the
// simulator.
//
// Tasks have predecessors and a stream; a stream runs its tasks one at a time in the order they
// were issued (program order, like a CUDA stream); a task starts when its predecessors are done
// and it heads its stream. A task either lasts a fixed time or plays a flow on the Network. There
// is no other state: no globals, no clocks.
//
// Accounting, per rank: a compute stream that waits is charged to what it waited for. When a
// compute task starts after a gap, the part of the gap during which the chain of communication
// tasks that released it ran (followed back, across ranks, until a compute task) is exposed
// communication of their streams' kinds, the rest is bubble (waiting on other ranks' compute).
// The same split feeds the phases loom train records (Phase): a compute task counts in its own
// phase, a wait in the phase of what it waited for (a dp bucket waited on by a backward segment:
// backward), the bubble in pipeline_wait.
//
// Memory: a rank holds its static bytes from time 0, plus activations allocated when a task that
// allocates starts and freed when one that frees ends; the peak is the prediction's memory.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "costmodel/sim_events.hpp"
#include "costmodel/sim_network.hpp"
#include "costmodel/simulator.hpp"

namespace loom::costmodel::sim {

struct Task {
  int rank = 0;  // index of the representative (pipeline rank), or of a transfer
  Stream stream = Stream::kCompute;
  Phase phase = Phase::kOther;  // where its time (or a wait for it) counts
  // The stream whose order it runs in: its own, except on CPU ranks, where gradient reductions
  // and ZeRO gathers run in the compute stream's order (Gloo's reductions and copies use the
  // cores the compute uses, so they do not overlap it).
  Stream queue = Stream::kCompute;
  double duration_s = 0;  // tasks without a flow
  FlowSpec flow;
  bool pipeline = false;      // a forward or backward compute task
  bool optimizer = false;     // the optimizer step
  double allocate_bytes = 0;  // activations allocated when it starts
  double free_bytes = 0;      // and freed when it ends
  int pending = 0;            // predecessors not yet done
  std::vector<int> successors;
  int released_by = -1;  // the task whose end let it start (a predecessor or its stream's previous)
  double start_s = -1;
  double end_s = -1;
  std::string name;
  int peer_rank = -1;
};

struct StreamState {
  std::vector<int> tasks;  // program order of the tasks of this stream (accounting)
  std::vector<int> order;  // program order of the tasks this stream runs (queue == this stream)
  std::size_t next = 0;
  bool busy = false;
};

struct RankState {
  double static_bytes = 0;
  double activation_bytes = 0;
  double peak_activation_bytes = 0;
  std::vector<MemorySample> memory;
  double last_compute_end_s = 0;
  double busy_s = 0;
  double pipeline_busy_s = 0;
  double pipeline_end_s = 0;
  double exposed_s[kStreamCount] = {0, 0, 0, 0, 0};
  std::array<double, kPhaseCount> phases_s{};
  double bubble_s = 0;
  double finish_s = 0;
};

class Engine {
 public:
  Engine(int ranks, Network* network)
      : network_(network),
        streams_(static_cast<std::size_t>(ranks) * kStreamCount),
        ranks_(static_cast<std::size_t>(ranks)) {}

  int add(Task task);
  // `after` waits for `before` (no-op when either is -1).
  void depend(int before, int after);
  int last_on(int rank, Stream stream);

  RankState& rank(int r) { return ranks_[static_cast<std::size_t>(r)]; }
  Task& task(int id) { return tasks_[static_cast<std::size_t>(id)]; }
  const std::vector<Task>& tasks() const { return tasks_; }
  std::int64_t events_processed() const { return events_; }

  void run();

 private:
  StreamState& stream_of(int rank, Stream stream);
  std::size_t stream_index(const Task& t) const {
    return static_cast<std::size_t>(t.rank) * kStreamCount + static_cast<std::size_t>(t.queue);
  }

  void try_start(std::size_t stream, int trigger);

  void enter_network(int id);

  void finish(int id);

  // A compute task starts after a gap: the part of the gap covered by the chain of communication
  // tasks that released it is exposed communication of their kinds, the rest is bubble.
  void charge_wait(const Task& t, RankState& r);

  void change_memory(RankState& r, double delta_bytes);

  Network* network_;
  std::vector<Task> tasks_;
  std::vector<StreamState> streams_;
  std::vector<RankState> ranks_;
  EventQueue queue_;
  double now_s_ = 0;
  std::int64_t events_ = 0;
};

}  // namespace loom::costmodel::sim
