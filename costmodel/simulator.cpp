#include "costmodel/simulator.hpp"

#include <algorithm>
#include <array>
#include <climits>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <stdexcept>
#include <tuple>
#include <utility>

#include "costmodel/comm.hpp"
#include "costmodel/layers.hpp"
#include "costmodel/lowering.hpp"
#include "costmodel/memory.hpp"
#include "costmodel/zero.hpp"
#include "profiles/topology.hpp"

namespace loom::costmodel {

void EventQueue::push(double time_s, EventKind kind, int task, std::uint64_t version) {
  heap_.push(Event{time_s, next_sequence_++, kind, task, version});
}

Event EventQueue::pop() {
  Event e = heap_.top();
  heap_.pop();
  return e;
}

const char* to_string(Phase phase) {
  switch (phase) {
    case Phase::kForward:
      return "forward";
    case Phase::kBackward:
      return "backward";
    case Phase::kPipelineWait:
      return "pipeline_wait";
    case Phase::kGradients:
      return "gradients";
    case Phase::kOptimizer:
      return "optimizer";
    case Phase::kOther:
      return "other";
  }
  return "?";
}

const char* to_string(Stream stream) {
  switch (stream) {
    case Stream::kCompute:
      return "compute";
    case Stream::kTensorParallel:
      return "comm tp";
    case Stream::kPipeline:
      return "comm pp";
    case Stream::kDataParallel:
      return "comm dp";
    case Stream::kZero:
      return "comm zero";
  }
  return "?";
}

namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();

// ---- Links --------------------------------------------------------------------------------------

// The directed links of the cluster graph come from profiles::Topology (link_count,
// link_bandwidth_gbps, route_links), the same graph and routes the closed forms use.
std::vector<double> link_capacities_bytes_per_s(const profiles::Topology& topology) {
  std::vector<double> out(static_cast<std::size_t>(topology.link_count()));
  for (int l = 0; l < topology.link_count(); ++l) {
    out[static_cast<std::size_t>(l)] = topology.link_bandwidth_gbps(l) * 1e9;
  }
  return out;
}

// ---- Network ------------------------------------------------------------------------------------

// Flows over directed links. A shape lists the links a flow's copies cross, with how many copies
// cross each; every copy on a link gets capacity / (copies of all active flows on it), and a flow
// moves at its smallest share. A flow's rate changes only when a flow sharing one of its links
// starts or ends; then its progress is brought up to date and its drain event rescheduled (the old
// one goes stale through the version number).
class Network {
 public:
  using Shape = std::vector<std::pair<int, int>>;  // (link, copies)

  explicit Network(std::vector<double> capacity_bytes_per_s)
      : capacity_(std::move(capacity_bytes_per_s)),
        load_(capacity_.size(), 0),
        flows_on_(capacity_.size()) {}

  int add_shape(Shape shape) {
    shapes_.push_back(std::move(shape));
    return static_cast<int>(shapes_.size()) - 1;
  }

  void resize(std::size_t tasks) {
    flows_.resize(tasks);
    mark_.resize(tasks, 0);
  }

  // Starts moving `bytes` across every hop of `shape` for `task`.
  void start(int task, int shape, double bytes, double now_s, EventQueue& queue) {
    Flow& f = flows_[static_cast<std::size_t>(task)];
    f.shape = shape;
    f.remaining_bytes = bytes;
    f.rate_bytes_per_s = 0;
    f.since_s = now_s;
    f.active = true;
    for (auto [link, copies] : shapes_[static_cast<std::size_t>(shape)]) {
      load_[static_cast<std::size_t>(link)] += copies;
      flows_on_[static_cast<std::size_t>(link)].push_back(task);
    }
    update_sharers(task, now_s, queue);
  }

  // The flow of `task` has drained: frees its links.
  void finish(int task, double now_s, EventQueue& queue) {
    Flow& f = flows_[static_cast<std::size_t>(task)];
    f.active = false;
    for (auto [link, copies] : shapes_[static_cast<std::size_t>(f.shape)]) {
      load_[static_cast<std::size_t>(link)] -= copies;
      auto& on = flows_on_[static_cast<std::size_t>(link)];
      auto it = std::find(on.begin(), on.end(), task);
      *it = on.back();
      on.pop_back();
    }
    update_sharers(task, now_s, queue);
  }

  bool is_current(int task, std::uint64_t version) const {
    const Flow& f = flows_[static_cast<std::size_t>(task)];
    return f.active && f.version == version;
  }

 private:
  struct Flow {
    int shape = -1;
    double remaining_bytes = 0;
    double rate_bytes_per_s = 0;
    double since_s = 0;
    std::uint64_t version = 0;
    bool active = false;
  };

  double rate_of(const Flow& f) const {
    double rate = kInfinity;
    for (auto [link, copies] : shapes_[static_cast<std::size_t>(f.shape)]) {
      auto l = static_cast<std::size_t>(link);
      rate = std::min(rate, capacity_[l] / load_[l]);
    }
    return rate;
  }

  // Re-rates every active flow that shares a link with `task`'s (and `task`'s own, if active).
  void update_sharers(int task, double now_s, EventQueue& queue) {
    ++epoch_;
    affected_.clear();
    auto visit = [&](int t) {
      if (mark_[static_cast<std::size_t>(t)] == epoch_) return;
      mark_[static_cast<std::size_t>(t)] = epoch_;
      affected_.push_back(t);
    };
    if (flows_[static_cast<std::size_t>(task)].active) visit(task);
    for (auto [link, copies] : shapes_[static_cast<std::size_t>(flows_[task].shape)]) {
      for (int t : flows_on_[static_cast<std::size_t>(link)]) visit(t);
    }
    for (int t : affected_) {
      Flow& f = flows_[static_cast<std::size_t>(t)];
      double rate = rate_of(f);
      if (rate == f.rate_bytes_per_s) continue;  // its drain event still holds
      if (f.rate_bytes_per_s > 0) {
        f.remaining_bytes =
            std::max(0.0, f.remaining_bytes - f.rate_bytes_per_s * (now_s - f.since_s));
      }
      f.since_s = now_s;
      f.rate_bytes_per_s = rate;
      ++f.version;
      double drain_s = std::isinf(rate) ? now_s : now_s + f.remaining_bytes / rate;
      queue.push(drain_s, EventKind::kFlowDrain, t, f.version);
    }
  }

  std::vector<double> capacity_;
  std::vector<int> load_;
  std::vector<std::vector<int>> flows_on_;
  std::vector<Shape> shapes_;
  std::vector<Flow> flows_;
  std::vector<std::uint64_t> mark_;
  std::uint64_t epoch_ = 0;
  std::vector<int> affected_;
};

// ---- Tasks, streams and the loop --------------------------------------------------------------

// A flow to play: `latency_s`, then `hop_bytes` across every hop of network shape `shape`.
struct FlowSpec {
  int shape = -1;
  double latency_s = 0;
  double hop_bytes = 0;
  bool empty() const { return shape < 0; }
};

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

  int add(Task task) {
    int id = static_cast<int>(tasks_.size());
    stream_of(task.rank, task.stream).tasks.push_back(id);
    stream_of(task.rank, task.queue).order.push_back(id);
    tasks_.push_back(std::move(task));
    return id;
  }
  // `after` waits for `before` (no-op when either is -1).
  void depend(int before, int after) {
    if (before < 0 || after < 0) return;
    tasks_[static_cast<std::size_t>(before)].successors.push_back(after);
    ++tasks_[static_cast<std::size_t>(after)].pending;
  }
  int last_on(int rank, Stream stream) {
    const auto& t = stream_of(rank, stream).tasks;
    return t.empty() ? -1 : t.back();
  }

  RankState& rank(int r) { return ranks_[static_cast<std::size_t>(r)]; }
  Task& task(int id) { return tasks_[static_cast<std::size_t>(id)]; }
  const std::vector<Task>& tasks() const { return tasks_; }
  std::int64_t events_processed() const { return events_; }

  void run() {
    if (network_) network_->resize(tasks_.size());
    for (RankState& r : ranks_) r.memory.push_back({0, r.static_bytes});
    for (std::size_t s = 0; s < streams_.size(); ++s) try_start(s, -1);
    while (!queue_.empty()) {
      Event e = queue_.pop();
      now_s_ = e.time_s;
      switch (e.kind) {
        case EventKind::kTaskEnd:
          finish(e.task);
          break;
        case EventKind::kLatencyEnd:
          enter_network(e.task);
          break;
        case EventKind::kFlowDrain:
          if (!network_->is_current(e.task, e.version)) continue;
          network_->finish(e.task, now_s_, queue_);
          finish(e.task);
          break;
      }
      ++events_;
    }
    for (const Task& t : tasks_) {
      if (t.end_s < 0) {
        throw std::logic_error("simulator: the task graph deadlocked at \"" + t.name + "\"");
      }
    }
  }

 private:
  StreamState& stream_of(int rank, Stream stream) {
    return streams_[static_cast<std::size_t>(rank) * kStreamCount +
                    static_cast<std::size_t>(stream)];
  }
  std::size_t stream_index(const Task& t) const {
    return static_cast<std::size_t>(t.rank) * kStreamCount + static_cast<std::size_t>(t.queue);
  }

  void try_start(std::size_t stream, int trigger) {
    StreamState& s = streams_[stream];
    if (s.busy || s.next >= s.order.size()) return;
    int id = s.order[s.next];
    Task& t = tasks_[static_cast<std::size_t>(id)];
    if (t.pending > 0) return;
    s.busy = true;
    ++s.next;
    t.start_s = now_s_;
    t.released_by = trigger;
    RankState& r = rank(t.rank);
    if (t.stream == Stream::kCompute) charge_wait(t, r);
    if (t.allocate_bytes != 0) change_memory(r, t.allocate_bytes);
    if (t.flow.empty()) {
      queue_.push(now_s_ + t.duration_s, EventKind::kTaskEnd, id);
    } else if (t.flow.latency_s > 0) {
      queue_.push(now_s_ + t.flow.latency_s, EventKind::kLatencyEnd, id);
    } else {
      enter_network(id);
    }
  }

  void enter_network(int id) {
    const Task& t = tasks_[static_cast<std::size_t>(id)];
    if (t.flow.hop_bytes <= 0) {
      queue_.push(now_s_, EventKind::kTaskEnd, id);
    } else {
      network_->start(id, t.flow.shape, t.flow.hop_bytes, now_s_, queue_);
    }
  }

  void finish(int id) {
    Task& t = tasks_[static_cast<std::size_t>(id)];
    t.end_s = now_s_;
    const std::size_t own = stream_index(t);
    streams_[own].busy = false;
    RankState& r = rank(t.rank);
    r.finish_s = std::max(r.finish_s, now_s_);
    if (t.stream == Stream::kCompute) {
      double d = t.end_s - t.start_s;
      r.busy_s += d;
      r.phases_s[static_cast<std::size_t>(t.phase)] += d;
      r.last_compute_end_s = now_s_;
      if (t.pipeline) {
        r.pipeline_busy_s += d;
        r.pipeline_end_s = now_s_;
      }
    }
    if (t.free_bytes != 0) change_memory(r, -t.free_bytes);
    for (int next : t.successors) {
      Task& n = tasks_[static_cast<std::size_t>(next)];
      if (--n.pending == 0) try_start(stream_index(n), id);
    }
    try_start(own, id);
  }

  // A compute task starts after a gap: the part of the gap covered by the chain of communication
  // tasks that released it is exposed communication of their kinds, the rest is bubble.
  void charge_wait(const Task& t, RankState& r) {
    const double gap_start = r.last_compute_end_s;
    const double gap = now_s_ - gap_start;
    if (gap <= 0) return;
    double cursor = now_s_;
    double charged = 0;
    for (int b = t.released_by; b >= 0 && cursor > gap_start;) {
      const Task& c = tasks_[static_cast<std::size_t>(b)];
      if (c.stream == Stream::kCompute) break;
      double from = std::max(c.start_s, gap_start);
      double to = std::min(c.end_s, cursor);
      if (to > from) {
        r.exposed_s[static_cast<std::size_t>(c.stream)] += to - from;
        const Phase phase = c.stream == Stream::kDataParallel && t.phase == Phase::kBackward
                                ? Phase::kBackward
                                : c.phase;
        r.phases_s[static_cast<std::size_t>(phase)] += to - from;
        charged += to - from;
      }
      cursor = std::min(cursor, c.start_s);
      b = c.released_by;
    }
    r.bubble_s += gap - charged;
    r.phases_s[static_cast<std::size_t>(Phase::kPipelineWait)] += gap - charged;
  }

  void change_memory(RankState& r, double delta_bytes) {
    r.activation_bytes += delta_bytes;
    r.peak_activation_bytes = std::max(r.peak_activation_bytes, r.activation_bytes);
    double total = r.static_bytes + r.activation_bytes;
    if (r.memory.size() > 1 && r.memory.back().time_s == now_s_) {
      r.memory.back().bytes = total;
    } else {
      r.memory.push_back({now_s_, total});
    }
  }

  Network* network_;
  std::vector<Task> tasks_;
  std::vector<StreamState> streams_;
  std::vector<RankState> ranks_;
  EventQueue queue_;
  double now_s_ = 0;
  std::int64_t events_ = 0;
};

// ---- Flows of a plan ----------------------------------------------------------------------------

enum class Group { kTensor, kData };

// Builds (and caches) the network shapes of a plan's collectives and transfers: every group of
// the stage, or every rank pair between two stages, as one flow.
class Comms {
 public:
  Comms(const profiles::Topology& topology, Network& network, std::vector<int> device_of_rank,
        int dp, int tp, std::array<double, 4> factors)
      : factors_(factors),
        topology_(topology),
        network_(network),
        device_of_rank_(std::move(device_of_rank)),
        dp_(dp),
        tp_(tp),
        touched_count_(static_cast<std::size_t>(topology.link_count()), 0) {}

  // `count` collectives of `bytes` each over every `group` of `stage`, lumped into one flow.
  FlowSpec collective(Collective c, Group group, int stage, double bytes, double count = 1) {
    const int n = group == Group::kTensor ? tp_ : dp_;
    if (n <= 1 || bytes <= 0 || count <= 0) return {};
    const ShapeInfo& s = shape(group == Group::kTensor ? 0 : 1, stage, -1);
    double dn = n;
    double hops = c == Collective::kAllReduce ? 2 * (dn - 1) : dn - 1;
    double share = c == Collective::kAllReduce ? 2 * (dn - 1) / dn : (dn - 1) / dn;
    const double f = factors_[static_cast<std::size_t>(c)];
    return FlowSpec{s.id, count * hops * s.latency_s * f, count * share * bytes * f};
  }

  // Every rank of stage `from` sends `bytes` to its peer of stage `to`.
  FlowSpec p2p(int from, int to, double bytes) {
    if (bytes <= 0) return {};
    const ShapeInfo& s = shape(2, from, to);
    const double f = factors_[static_cast<std::size_t>(Collective::kP2p)];
    return FlowSpec{s.id, s.latency_s * f, bytes * f};
  }

 private:
  struct ShapeInfo {
    int id = -1;
    double latency_s = 0;
  };

  const ShapeInfo& shape(int kind, int stage, int peer) {
    auto key = std::make_tuple(kind, stage, peer);
    auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;
    const int per_stage = dp_ * tp_;
    const int base = stage * per_stage;
    std::vector<std::pair<int, int>> hops;  // (rank, rank)
    auto ring = [&](const std::vector<int>& ranks) {
      if (ranks.size() < 2) return;
      for (std::size_t i = 0; i < ranks.size(); ++i) {
        hops.emplace_back(ranks[i], ranks[(i + 1) % ranks.size()]);
      }
    };
    if (kind == 0) {
      for (int d = 0; d < dp_; ++d) {
        std::vector<int> g(static_cast<std::size_t>(tp_));
        for (int i = 0; i < tp_; ++i) g[static_cast<std::size_t>(i)] = base + d * tp_ + i;
        ring(g);
      }
    } else if (kind == 1) {
      for (int t = 0; t < tp_; ++t) {
        std::vector<int> g(static_cast<std::size_t>(dp_));
        for (int i = 0; i < dp_; ++i) g[static_cast<std::size_t>(i)] = base + t + i * tp_;
        ring(g);
      }
    } else {
      for (int i = 0; i < per_stage; ++i) hops.emplace_back(base + i, peer * per_stage + i);
    }
    ShapeInfo info;
    double latency_us = 0;
    std::vector<int> touched;
    for (auto [ra, rb] : hops) {
      int a = device_of_rank_[static_cast<std::size_t>(ra)];
      int b = device_of_rank_[static_cast<std::size_t>(rb)];
      profiles::PathMetrics m = topology_.route(a, b);
      latency_us = std::max(latency_us, m.latency_us);
      for (int l : topology_.route_links(a, b)) {
        if (touched_count_[static_cast<std::size_t>(l)]++ == 0) touched.push_back(l);
      }
    }
    std::sort(touched.begin(), touched.end());
    Network::Shape loads;
    for (int l : touched) {
      loads.emplace_back(l, touched_count_[static_cast<std::size_t>(l)]);
      touched_count_[static_cast<std::size_t>(l)] = 0;
    }
    info.id = network_.add_shape(std::move(loads));
    info.latency_s = latency_us * 1e-6;
    return cache_.emplace(key, info).first->second;
  }

  std::array<double, 4> factors_;  // measured / modelled time, by Collective
  const profiles::Topology& topology_;
  Network& network_;
  std::vector<int> device_of_rank_;
  int dp_;
  int tp_;
  std::vector<int> touched_count_;
  std::map<std::tuple<int, int, int>, ShapeInfo> cache_;
};

// ---- The step as a task graph -------------------------------------------------------------------

// A tensor-parallel flow with what its slice name says.
struct TpSpec {
  FlowSpec flow;
  double count = 0;
  double bytes = 0;
};

struct ChunkSpec {
  StageRange range;
  double forward_s = 0;  // compute only
  double backward_s = 0;
  TpSpec tp_forward;
  TpSpec tp_backward;
  double activation_bytes = 0;
  double gradient_bytes = 0;
};

struct StepSpec {
  int pp = 1;
  int virtual_stages = 1;
  int ranks_per_stage = 1;  // dp * tp
  int dp = 1;
  ZeroPolicy zero;
  std::int64_t micro_batches = 1;
  Schedule schedule = Schedule::k1F1B;
  double bucket_bytes = 0;
  double p2p_bytes = 0;
  double p2p_all_gather_bytes = 0;
  bool cpu = false;  // CPU ranks: communication does not overlap compute (Task::queue)
  std::vector<ChunkSpec> chunks;
  std::vector<double> optimizer_s;            // per pipeline rank
  std::vector<double> zero_grad_s;            // per pipeline rank: the step's first task
  std::vector<double> post_all_gather_bytes;  // per pipeline rank (ZeRO-1/2)
  double step_sync_s = 0;                     // the step's scalar all-reduces (StepTerms)
};

// One pass as the task graph indexes it: the chunk is global (the index into StepSpec::chunks).
struct Op {
  bool forward = true;
  std::int64_t micro_batch = 0;
  int chunk = 0;
};

std::string bytes_text(double bytes) {
  static constexpr const char* kUnits[] = {"B", "kB", "MB", "GB", "TB"};
  int u = 0;
  while (bytes >= 1000 && u < 4) {
    bytes /= 1000;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g %s", bytes, kUnits[u]);
  return buf;
}

std::string layers_text(const StageRange& r) {
  return r.first_layer == r.last_layer
             ? "L" + std::to_string(r.first_layer)
             : "L" + std::to_string(r.first_layer) + "-" + std::to_string(r.last_layer);
}

// Adds the tasks of one step to `engine` (pipeline rank r is engine rank r).
class StepBuilder {
 public:
  StepBuilder(const StepSpec& spec, Engine& engine, Comms* comms, bool names)
      : spec_(spec), engine_(engine), comms_(comms), names_(names) {}

  void build() {
    const int chunks = static_cast<int>(spec_.chunks.size());
    const std::size_t ops =
        2 * static_cast<std::size_t>(spec_.micro_batches) * static_cast<std::size_t>(chunks);
    op_tasks_.assign(ops, OpTasks{});
    for (int r = 0; r < spec_.pp; ++r) build_rank(r);
    // Inputs: a chunk's forward needs the previous chunk's output, a backward the next chunk's
    // gradient.
    for (std::int64_t mb = 0; mb < spec_.micro_batches; ++mb) {
      for (int c = 0; c < chunks; ++c) {
        if (c > 0) connect(at(true, mb, c - 1), at(true, mb, c));
        if (c + 1 < chunks) connect(at(false, mb, c + 1), at(false, mb, c));
      }
    }
  }

 private:
  struct OpTasks {
    int first = -1;  // the first task that needs the op's input
    int recv = -1;   // the receiving group's all-gather of the input
    int send = -1;   // the transfer of the op's output
    int done = -1;   // the op's last task on its rank
  };

  OpTasks& at(bool forward, std::int64_t mb, int chunk) {
    std::size_t i =
        (static_cast<std::size_t>(forward ? 0 : 1) * static_cast<std::size_t>(spec_.micro_batches) +
         static_cast<std::size_t>(mb)) *
            spec_.chunks.size() +
        static_cast<std::size_t>(chunk);
    return op_tasks_[i];
  }

  void connect(const OpTasks& producer, const OpTasks& consumer) {
    int from = producer.send >= 0 ? producer.send : producer.done;
    if (consumer.recv >= 0) {
      engine_.depend(from, consumer.recv);
      engine_.depend(consumer.recv, consumer.first);
    } else {
      engine_.depend(from, consumer.first);
    }
  }

  int compute(int rank, Phase phase, double duration_s, bool pipeline, std::string name) {
    Task t;
    t.rank = rank;
    t.stream = Stream::kCompute;
    t.phase = phase;
    t.duration_s = duration_s;
    t.pipeline = pipeline;
    if (names_) t.name = std::move(name);
    return engine_.add(std::move(t));
  }

  int flow(int rank, Stream stream, Phase phase, const FlowSpec& f, std::string name,
           int peer = -1) {
    if (f.empty()) return -1;
    Task t;
    t.rank = rank;
    t.stream = stream;
    t.phase = phase;
    t.queue = spec_.cpu && (stream == Stream::kDataParallel || stream == Stream::kZero)
                  ? Stream::kCompute
                  : stream;
    t.flow = f;
    t.peer_rank = peer;
    if (names_) t.name = std::move(name);
    return engine_.add(std::move(t));
  }

  // `before` -> `task` when both exist; returns the later of the two for chaining.
  int chain(int before, int task) {
    if (task < 0) return before;
    engine_.depend(before, task);
    return task;
  }

  void build_rank(int r) {
    const int chunks = static_cast<int>(spec_.chunks.size());
    int prev = -1;  // the previous op's last task: the compute stream waits for it
    if (comms_ && spec_.dp > 1 && spec_.zero.gathers_before_forward) {
      // ZeRO-3: the stage's parameters are gathered before the step's first forward pass.
      const double bytes = spec_.post_all_gather_bytes[static_cast<std::size_t>(r)];
      prev = flow(r, Stream::kZero, Phase::kOther,
                  comms_->collective(Collective::kAllGather, Group::kData, r, bytes),
                  "all-gather zero params " + bytes_text(bytes));
    }
    const double zero_grad_s =
        spec_.zero_grad_s.empty() ? 0 : spec_.zero_grad_s[static_cast<std::size_t>(r)];
    if (zero_grad_s > 0) {
      const int zeroing = compute(r, Phase::kOther, zero_grad_s, false, "zero gradients");
      engine_.depend(prev, zeroing);
      prev = zeroing;
    }
    for (const PipelineOp& step_op :
         pipeline_order(spec_.schedule, spec_.pp, r, spec_.micro_batches, spec_.virtual_stages)) {
      const Op op{step_op.pass == PassKind::kForward, step_op.micro_batch,
                  global_chunk(step_op.chunk, spec_.pp, r)};
      const ChunkSpec& c = spec_.chunks[static_cast<std::size_t>(op.chunk)];
      OpTasks& ot = at(op.forward, op.micro_batch, op.chunk);
      const std::string mb = "mb" + std::to_string(op.micro_batch);
      const std::string what = (op.forward ? "F " : "B ") + mb + " " + layers_text(c.range);
      const Phase pass = op.forward ? Phase::kForward : Phase::kBackward;
      const bool has_input = op.forward ? op.chunk > 0 : op.chunk + 1 < chunks;
      if (has_input && comms_ && spec_.p2p_all_gather_bytes > 0) {
        ot.recv = flow(r, Stream::kPipeline, Phase::kPipelineWait,
                       comms_->collective(Collective::kAllGather, Group::kTensor, r,
                                          spec_.p2p_all_gather_bytes),
                       "all-gather " + std::string(op.forward ? "act " : "grad ") + mb);
      }
      int last = -1;
      if (!op.forward && comms_ && spec_.dp > 1 && c.gradient_bytes > 0 &&
          (spec_.zero.reduces_every_micro_batch || op.micro_batch == spec_.micro_batches - 1)) {
        last = bucketed_backward(r, c, what, prev, ot);
      } else {
        int t = compute(r, pass, op.forward ? c.forward_s : c.backward_s, true, what);
        engine_.depend(prev, t);
        ot.first = t;
        last = t;
      }
      if (op.forward) {
        engine_.task(ot.first).allocate_bytes = c.activation_bytes;
      } else {
        engine_.task(last).free_bytes = c.activation_bytes;
      }
      const TpSpec& tp = op.forward ? c.tp_forward : c.tp_backward;
      last = chain(last, flow(r, Stream::kTensorParallel, pass, tp.flow,
                              "allreduce tp " + what + " (" +
                                  std::to_string(static_cast<long long>(tp.count)) + "x " +
                                  bytes_text(tp.bytes) + ")"));
      const int next_chunk = op.forward ? op.chunk + 1 : op.chunk - 1;
      if (comms_ && next_chunk >= 0 && next_chunk < chunks) {
        const int to = next_chunk % spec_.pp;
        ot.send = flow(
            r, Stream::kPipeline, Phase::kPipelineWait, comms_->p2p(r, to, spec_.p2p_bytes),
            std::string(op.forward ? "send act " : "send grad ") + mb, to * spec_.ranks_per_stage);
        last = chain(last, ot.send);
      }
      ot.done = last;
      prev = last;
    }
    // The optimizer step after every gradient reduction, then ZeRO-1/2's parameter all-gather.
    int opt = -1;
    const double opt_s =
        spec_.optimizer_s.empty() ? 0 : spec_.optimizer_s[static_cast<std::size_t>(r)];
    if (opt_s > 0) {
      opt = compute(r, Phase::kOptimizer, opt_s, false, "optimizer step");
      engine_.task(opt).optimizer = true;
      engine_.depend(prev, opt);
      engine_.depend(engine_.last_on(r, Stream::kDataParallel), opt);
    }
    int gather = -1;
    if (comms_ && spec_.zero.gathers_after_step) {
      double bytes = spec_.post_all_gather_bytes[static_cast<std::size_t>(r)];
      gather = flow(r, Stream::kZero, Phase::kOptimizer,
                    comms_->collective(Collective::kAllGather, Group::kData, r, bytes),
                    "all-gather zero params " + bytes_text(bytes));
      engine_.depend(opt >= 0 ? opt : prev, gather);
    }
    // The rank's step ends when every one of its streams is done, then sums the step's scalars.
    int lasts[kStreamCount];
    for (int s = 0; s < kStreamCount; ++s) lasts[s] = engine_.last_on(r, static_cast<Stream>(s));
    int end = compute(r, Phase::kOther, spec_.step_sync_s, false,
                      spec_.step_sync_s > 0 ? "step scalars all-reduced" : "step end");
    for (int t : lasts) engine_.depend(t, end);
    engine_.depend(prev, end);
    engine_.depend(gather, end);
  }

  // A backward pass cut where its gradients fill a bucket; each bucket is all-reduced on the dp
  // stream as soon as it is full.
  int bucketed_backward(int r, const ChunkSpec& c, const std::string& what, int prev, OpTasks& ot) {
    const double total = c.gradient_bytes;
    const auto buckets = static_cast<std::int64_t>(std::ceil(total / spec_.bucket_bytes));
    int last = prev;
    for (std::int64_t j = 0; j < buckets; ++j) {
      double bytes =
          std::min(spec_.bucket_bytes, total - static_cast<double>(j) * spec_.bucket_bytes);
      int seg = compute(r, Phase::kBackward, c.backward_s * bytes / total, true, what);
      engine_.depend(last, seg);
      if (j == 0) ot.first = seg;
      // ZeRO-2/3's executor reduces each micro-batch's buckets inside its backward pass.
      int bucket = flow(r, Stream::kDataParallel,
                        spec_.zero.reduces_every_micro_batch ? Phase::kBackward : Phase::kGradients,
                        comms_->collective(Collective::kAllReduce, Group::kData, r, bytes),
                        "allreduce dp " + bytes_text(bytes));
      engine_.depend(seg, bucket);
      last = seg;
    }
    return last;
  }

  const StepSpec& spec_;
  Engine& engine_;
  Comms* comms_;
  bool names_;
  std::vector<OpTasks> op_tasks_;
};

// ---- Results ------------------------------------------------------------------------------------

// The schedule's own bubble, from a run without communication: (end of the last forward or
// backward - ideal) / ideal, the ideal being the busiest rank's forward and backward compute.
double pipeline_bubble(Engine& engine, int pp) {
  double ideal = 0;
  double pipeline = 0;
  for (int r = 0; r < pp; ++r) {
    ideal = std::max(ideal, engine.rank(r).pipeline_busy_s);
    pipeline = std::max(pipeline, engine.rank(r).pipeline_end_s);
  }
  return ideal > 0 ? pipeline / ideal - 1 : 0;
}

// The same schedule with the same compute, communication free (no flows, no optimizer).
double replay_bubble(const StepSpec& spec) {
  StepSpec bare;
  bare.pp = spec.pp;
  bare.virtual_stages = spec.virtual_stages;
  bare.micro_batches = spec.micro_batches;
  bare.schedule = spec.schedule;
  for (const ChunkSpec& c : spec.chunks) {
    ChunkSpec k;
    k.range = c.range;
    k.forward_s = c.forward_s;
    k.backward_s = c.backward_s;
    bare.chunks.push_back(k);
  }
  Engine engine(bare.pp, nullptr);
  StepBuilder(bare, engine, nullptr, false).build();
  engine.run();
  return pipeline_bubble(engine, bare.pp);
}

SimulationResult collect(Engine& engine, const StepSpec& spec, int ranks_per_stage,
                         bool record_trace, double bubble_fraction) {
  SimulationResult out;
  out.ranks_per_stage = ranks_per_stage;
  out.world_size = spec.pp * ranks_per_stage;
  out.events_processed = engine.events_processed();
  for (int r = 0; r < spec.pp; ++r) {
    out.step_time_s = std::max(out.step_time_s, engine.rank(r).finish_s);
  }
  out.bubble_fraction = bubble_fraction;
  for (int r = 0; r < spec.pp; ++r) {
    RankState& s = engine.rank(r);
    RankTimeline t;
    t.rank = r * ranks_per_stage;
    t.pipeline_rank = r;
    t.busy_s = s.busy_s;
    t.idle_s = out.step_time_s - s.busy_s;
    t.finish_s = s.finish_s;
    t.exposed_communication_s.tp = s.exposed_s[static_cast<int>(Stream::kTensorParallel)];
    t.exposed_communication_s.pp = s.exposed_s[static_cast<int>(Stream::kPipeline)];
    t.exposed_communication_s.dp = s.exposed_s[static_cast<int>(Stream::kDataParallel)];
    t.exposed_communication_s.zero = s.exposed_s[static_cast<int>(Stream::kZero)];
    t.bubble_s = s.bubble_s + (out.step_time_s - s.finish_s);
    t.phases_s = s.phases_s;
    t.phases_s[static_cast<std::size_t>(Phase::kGradients)] += out.step_time_s - s.finish_s;
    t.static_memory_bytes = s.static_bytes;
    t.peak_activation_bytes = s.peak_activation_bytes;
    t.peak_memory_bytes = s.static_bytes + s.peak_activation_bytes;
    t.memory = std::move(s.memory);
    ExposedCommunication& e = out.exposed_communication_s;
    e.tp = std::max(e.tp, t.exposed_communication_s.tp);
    e.pp = std::max(e.pp, t.exposed_communication_s.pp);
    e.dp = std::max(e.dp, t.exposed_communication_s.dp);
    e.zero = std::max(e.zero, t.exposed_communication_s.zero);
    out.ranks.push_back(std::move(t));
  }
  for (const Task& t : engine.tasks()) {
    if (t.optimizer) {
      out.ranks[static_cast<std::size_t>(t.rank)].optimizer_s = t.end_s - t.start_s;
    }
  }
  if (record_trace) {
    for (const Task& t : engine.tasks()) {
      if (t.end_s <= t.start_s) continue;
      out.slices.push_back(TraceSlice{t.rank * ranks_per_stage, t.stream, t.name, t.start_s,
                                      t.end_s - t.start_s, t.peer_rank});
    }
    std::sort(out.slices.begin(), out.slices.end(), [](const TraceSlice& a, const TraceSlice& b) {
      return std::tie(a.rank, a.stream, a.start_s, a.name) <
             std::tie(b.rank, b.stream, b.start_s, b.name);
    });
  }
  out.prediction.step_time_s = out.step_time_s;
  out.prediction.bubble_fraction = out.bubble_fraction;
  out.prediction.exposed_communication_s = out.exposed_communication_s;
  out.prediction.source = "simulation";
  return out;
}

// The tasks' inputs for one chunk: its compute from the lowering, its tensor-parallel all-reduces
// (every entry's, in sequence order) lumped into one flow per pass.
ChunkSpec chunk_spec(Comms& comms, const StepTerms& terms, const StageRange& range,
                     const ChunkCost& k, double state_bytes) {
  ChunkSpec out;
  out.range = range;
  out.forward_s = k.compute_s.forward_s;
  out.backward_s = k.compute_s.backward_s;
  out.activation_bytes = k.activation_bytes;
  out.gradient_bytes = k.num_parameters * state_bytes;
  const int r = k.pipeline_rank;
  auto add = [&](TpSpec& tp, const TensorParallelAllReduces& ar, double times) {
    if (times <= 0) return;
    FlowSpec f =
        comms.collective(Collective::kAllReduce, Group::kTensor, r, ar.bytes, times * ar.count);
    if (f.empty()) return;
    tp.flow.shape = f.shape;
    tp.flow.latency_s += f.latency_s;
    tp.flow.hop_bytes += f.hop_bytes;
    tp.count += times * ar.count;
    tp.bytes = std::max(tp.bytes, ar.bytes);
  };
  auto add_entry = [&](const EntryTerms& e, double times) {
    add(out.tp_forward, e.forward_tp, times);
    add(out.tp_backward, e.backward_tp, times);
  };
  if (k.content.embedding) add_entry(terms.embedding, 1);
  add_entry(terms.layer, k.content.num_layers);
  if (k.content.head) add_entry(terms.head, 1);
  return out;
}

}  // namespace

SimulationResult simulate(const CostModel& cost, const Job& job, const Strategy& s,
                          const std::vector<StageRange>& stages, const SimulationOptions& options) {
  const profiles::ModelSpec& m = cost.model();
  if (auto why = check_strategy(m, cost.cluster().device_count(), job, s)) {
    throw std::invalid_argument(*why);
  }
  if (auto why = check_partition(m, s, stages)) throw std::invalid_argument(*why);

  const StepTerms terms = cost.step_terms(job, s);
  const int world = s.world_size();
  const int per_stage = s.dp * s.tp;
  const int chunks = s.pp * s.virtual_stages;
  const double state_bytes = element_bytes(job.precision) == 2 ? 2 : 4;

  Network network(link_capacities_bytes_per_s(cost.topology()));
  std::vector<int> device_of_rank(cost.device_of_rank().begin(),
                                  cost.device_of_rank().begin() + world);
  Comms comms(
      cost.topology(), network, device_of_rank, s.dp, s.tp,
      {cost.collective_factor(Collective::kAllReduce),
       cost.collective_factor(Collective::kReduceScatter),
       cost.collective_factor(Collective::kAllGather), cost.collective_factor(Collective::kP2p)});

  StepSpec spec;
  spec.pp = s.pp;
  spec.virtual_stages = s.virtual_stages;
  spec.ranks_per_stage = per_stage;
  spec.dp = s.dp;
  spec.zero = zero_policy(s.zero);
  spec.micro_batches = s.num_micro_batches;
  spec.schedule = s.schedule;
  spec.bucket_bytes = cost.options().dp_bucket_bytes;
  spec.p2p_bytes = terms.p2p_bytes;
  spec.p2p_all_gather_bytes = terms.p2p_all_gather_bytes;
  spec.cpu = cost.cluster().device.kind == profiles::DeviceKind::kCpu;

  const std::vector<ChunkCost> lowered = lower_chunks(m, s, terms, stages);
  const std::vector<StageLoad> load = stage_loads(lowered, s.pp);
  for (int c = 0; c < chunks; ++c) {
    spec.chunks.push_back(chunk_spec(comms, terms, stages[static_cast<std::size_t>(c)],
                                     lowered[static_cast<std::size_t>(c)], state_bytes));
  }

  std::vector<MemoryBreakdown> memory(static_cast<std::size_t>(s.pp));
  for (int r = 0; r < s.pp; ++r) {
    const StageLoad& l = load[static_cast<std::size_t>(r)];
    memory[static_cast<std::size_t>(r)] = cost.stage_memory(job, s, r, l);
    double shard = l.parameters / (spec.zero.shards_optimizer_states ? s.dp : 1);
    spec.optimizer_s.push_back(shard * terms.optimizer_s_per_parameter);
    spec.zero_grad_s.push_back(zeroed_gradient_parameters(s, spec.cpu, l.parameters) *
                               terms.zero_grad_s_per_parameter);
    spec.post_all_gather_bytes.push_back(l.parameters * state_bytes);
  }
  spec.step_sync_s = terms.step_sync_s;

  Engine engine(s.pp, &network);
  for (int r = 0; r < s.pp; ++r) {
    const MemoryBreakdown& mem = memory[static_cast<std::size_t>(r)];
    engine.rank(r).static_bytes = mem.total() - mem.activations;
  }
  StepBuilder(spec, engine, &comms, options.record_trace).build();
  if (options.max_tasks > 0 &&
      static_cast<std::int64_t>(engine.tasks().size()) > options.max_tasks) {
    SimulationResult skipped;
    skipped.skipped = true;
    skipped.tasks = static_cast<std::int64_t>(engine.tasks().size());
    return skipped;
  }
  engine.run();

  SimulationResult out =
      collect(engine, spec, per_stage, options.record_trace, replay_bubble(spec));
  for (int g = 0; g < world; ++g) {
    out.device_names.push_back(
        cost.topology().device_name(device_of_rank[static_cast<std::size_t>(g)]));
  }
  Prediction& p = out.prediction;
  for (int r = 0; r < s.pp; ++r) {
    RankTimeline& t = out.ranks[static_cast<std::size_t>(r)];
    t.activation_bytes_per_micro_batch = load[static_cast<std::size_t>(r)].activations;
    MemoryBreakdown mem = memory[static_cast<std::size_t>(r)];
    mem.activations = t.peak_activation_bytes;
    p.memory_by_stage.push_back(mem);
    p.peak_memory_bytes = std::max(p.peak_memory_bytes, t.peak_memory_bytes);
    p.optimizer_s = std::max(p.optimizer_s, t.optimizer_s);
  }
  const double seq = static_cast<double>(job.seq_len);
  p.samples_per_s = static_cast<double>(job.global_batch) / p.step_time_s;
  p.tokens_per_s = p.samples_per_s * seq;
  const double per_gpu = p.step_time_s * world * 1e12;
  p.model_tflops_per_gpu = model_flops_per_step(m, job.global_batch, job.seq_len) / per_gpu;
  p.hardware_tflops_per_gpu =
      hardware_flops_per_step(m, job.global_batch, job.seq_len, s.recompute) / per_gpu;
  p.mfu = p.model_tflops_per_gpu / cost.cluster().device.peak_tflops.of(job.precision);
  return out;
}

SimulationResult simulate_schedule(const std::vector<StageTime>& chunks, int pp,
                                   std::int64_t micro_batches, Schedule schedule,
                                   int virtual_stages, const SimulationOptions& options) {
  if (pp < 1 || virtual_stages < 1 || micro_batches < 1 ||
      chunks.size() != static_cast<std::size_t>(pp) * virtual_stages) {
    throw std::invalid_argument("simulate_schedule: expected pp * virtual_stages chunk times");
  }
  if (auto why = check_schedule(schedule, pp, micro_batches, virtual_stages)) {
    throw std::invalid_argument("simulate_schedule: " + *why);
  }
  StepSpec spec;
  spec.pp = pp;
  spec.virtual_stages = virtual_stages;
  spec.micro_batches = micro_batches;
  spec.schedule = schedule;
  for (std::size_t c = 0; c < chunks.size(); ++c) {
    ChunkSpec k;
    k.range = {static_cast<int>(c), static_cast<int>(c)};
    k.forward_s = chunks[c].forward_s;
    k.backward_s = chunks[c].backward_s;
    spec.chunks.push_back(k);
  }
  Engine engine(pp, nullptr);
  StepBuilder(spec, engine, nullptr, options.record_trace).build();
  engine.run();
  SimulationResult out =
      collect(engine, spec, 1, options.record_trace, pipeline_bubble(engine, pp));
  for (int r = 0; r < pp; ++r) out.device_names.push_back("stage" + std::to_string(r));
  return out;
}

std::vector<double> simulate_transfers(const profiles::Cluster& cluster,
                                       const std::vector<Transfer>& transfers) {
  const profiles::Topology topology(cluster);
  Network network(link_capacities_bytes_per_s(topology));
  Engine engine(static_cast<int>(transfers.size()), &network);
  std::vector<int> flows;
  for (std::size_t i = 0; i < transfers.size(); ++i) {
    const Transfer& x = transfers[i];
    if (x.from_device < 0 || x.to_device < 0 || x.from_device >= topology.device_count() ||
        x.to_device >= topology.device_count()) {
      throw std::invalid_argument("simulate_transfers: transfer " + std::to_string(i) +
                                  " names a device out of range");
    }
    Network::Shape shape;
    for (int l : topology.route_links(x.from_device, x.to_device)) shape.emplace_back(l, 1);
    FlowSpec f{network.add_shape(std::move(shape)),
               topology.route(x.from_device, x.to_device).latency_us * 1e-6, x.bytes};
    Task wait;
    wait.rank = static_cast<int>(i);
    wait.duration_s = x.start_s;
    int w = engine.add(std::move(wait));
    Task t;
    t.rank = static_cast<int>(i);
    t.stream = Stream::kPipeline;
    t.queue = Stream::kPipeline;
    t.flow = f;
    int id = engine.add(std::move(t));
    engine.depend(w, id);
    flows.push_back(id);
  }
  engine.run();
  std::vector<double> out;
  out.reserve(flows.size());
  for (int id : flows) out.push_back(engine.tasks()[static_cast<std::size_t>(id)].end_s);
  return out;
}

}  // namespace loom::costmodel
