#include "costmodel/simulator.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>

#include "costmodel/comm.hpp"
#include "costmodel/layers.hpp"
#include "costmodel/lowering.hpp"
#include "costmodel/optimizer.hpp"
#include "costmodel/runtime.hpp"
#include "costmodel/sim_engine.hpp"
#include "costmodel/sim_network.hpp"
#include "costmodel/sim_step.hpp"
#include "costmodel/zero.hpp"
#include "profiles/topology.hpp"

namespace loom::costmodel {

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

using sim::ChunkSpec;
using sim::Comms;
using sim::Engine;
using sim::FlowSpec;
using sim::Group;
using sim::Network;
using sim::RankState;
using sim::StepSpec;
using sim::Task;
using sim::TpSpec;

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

// The tasks' inputs for one chunk: its compute from the lowering, its tensor-parallel collectives
// (every entry's, in sequence order) lumped into one flow per pass.
ChunkSpec chunk_spec(Comms& comms, const StepTerms& terms, const StageRange& range,
                     const ChunkCost& k, double state_bytes, const Job& job, const Strategy& s,
                     const profiles::ModelSpec& m) {
  ChunkSpec out;
  out.range = range;
  out.forward_s = k.compute_s.forward_s;
  out.backward_s = k.compute_s.backward_s;
  out.activation_bytes = k.activation_bytes;
  out.gradient_bytes = k.num_parameters * state_bytes;
  out.forward_gather_bytes =
      (k.num_parameters - forward_ungathered_num_parameters(job, m, s, k.lookup_num_parameters)) *
      state_bytes;
  out.lookup_mask_bytes = lookup_mask_bytes(job, m, s, k.lookup_num_parameters);
  out.backward_gather_bytes =
      (k.num_parameters - backward_ungathered_num_parameters(job, k.lookup_num_parameters)) *
      state_bytes;
  const int r = k.pipeline_rank;
  auto add = [&](TpSpec& tp, const TensorParallelCollectives& list, double times) {
    if (times <= 0) return;
    for (const TensorParallelCollective& c : list) {
      FlowSpec f = comms.collective(c.collective, Group::kTensor, r, c.bytes, times * c.count);
      if (f.empty()) continue;
      tp.flow.shape = f.shape;
      tp.flow.latency_s += f.latency_s;
      tp.flow.hop_bytes += f.hop_bytes;
      tp.count += times * c.count;
      tp.bytes = std::max(tp.bytes, c.bytes);
      if (c.collective != Collective::kAllReduce) tp.kind = "all-gather/reduce-scatter";
    }
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

std::vector<double> SimulationResult::idle_shares() const {
  std::vector<double> out;
  if (skipped || !(step_time_s > 0)) return out;
  for (const RankTimeline& r : ranks) out.push_back(r.idle_s / step_time_s);
  return out;
}

double SimulationResult::mean_idle_share() const {
  const std::vector<double> shares = idle_shares();
  if (shares.empty()) return 0;
  double sum = 0;
  for (const double x : shares) sum += x;
  return sum / static_cast<double>(shares.size());
}

SimulationResult simulate(const CostModel& cost, const Job& job, const Strategy& s,
                          const std::vector<StageRange>& stages, const SimulationOptions& options) {
  const profiles::ModelSpec& m = cost.model();
  if (auto why = check_strategy(m, cost.cluster().device_count(), job, s)) {
    throw std::invalid_argument(*why);
  }
  if (auto why = check_partition(m, s, stages)) throw std::invalid_argument(*why);

  const StepTerms terms = cost.step_terms(job, s);
  const int world = s.world_size();
  // The cp ranks of a sample reduce gradients as data-parallel ranks (gradient_view); the
  // compute terms above are the rank's share of the sequence.
  const Strategy g = gradient_view(s);
  const int per_stage = g.dp * g.tp;
  const int chunks = s.pp * s.virtual_stages;
  const double state_bytes = state_element_bytes(job);
  // The gradients' width on the wire is the runtime's (fp32 main grads in Megatron-LM, FSDP's fp32
  // reduce_dtype). The collectives are played in Loom's executor's order for every runtime; the
  // other runtimes' overlap rules are the estimate's (runtime.hpp).
  const double reduce_bytes = runtime_rules(job.runtime).reduce_bytes_per_parameter(job);

  Network network(sim::link_capacities_bytes_per_s(cost.topology()));
  std::vector<int> device_of_rank(cost.device_of_rank().begin(),
                                  cost.device_of_rank().begin() + world);
  Comms comms(
      cost.topology(), network, device_of_rank, g.dp, g.tp,
      {cost.collective_factor(Collective::kAllReduce),
       cost.collective_factor(Collective::kReduceScatter),
       cost.collective_factor(Collective::kAllGather), cost.collective_factor(Collective::kP2p)});

  StepSpec spec;
  spec.pp = s.pp;
  spec.virtual_stages = s.virtual_stages;
  spec.ranks_per_stage = per_stage;
  spec.dp = g.dp;
  spec.zero = zero_policy(s.zero);
  spec.micro_batches = s.num_micro_batches;
  spec.schedule = s.schedule;
  spec.bucket_bytes = cost.options().dp_bucket_bytes;
  spec.p2p_bytes = terms.p2p_bytes;
  spec.p2p_all_gather_bytes = terms.p2p_all_gather_bytes;
  spec.cpu = cost.cluster().device.kind == profiles::DeviceKind::kCpu;
  if (spec.cpu) spec.p2p_receive_s = terms.p2p_s;

  const std::vector<ChunkCost> lowered = lower_chunks(m, s, terms, stages);
  const std::vector<StageLoad> load = stage_loads(lowered, s.pp);
  for (int c = 0; c < chunks; ++c) {
    spec.chunks.push_back(chunk_spec(comms, terms, stages[static_cast<std::size_t>(c)],
                                     lowered[static_cast<std::size_t>(c)], reduce_bytes, job, g,
                                     m));
  }

  std::vector<MemoryBreakdown> memory(static_cast<std::size_t>(s.pp));
  for (int r = 0; r < s.pp; ++r) {
    const StageLoad& l = load[static_cast<std::size_t>(r)];
    memory[static_cast<std::size_t>(r)] = cost.stage_memory(terms, job, s, r, l);
    double shard = l.num_parameters / (spec.zero.shards_optimizer_states ? g.dp : 1);
    spec.optimizer_s.push_back(optimizer_step_s(
        {terms.optimizer_s_per_parameter, terms.optimizer_s_per_tensor}, shard, l.num_tensors));
    spec.zero_grad_s.push_back(zeroed_gradient_parameters(g, spec.cpu, l.num_parameters) *
                               terms.zero_grad_s_per_parameter);
    spec.post_all_gather_bytes.push_back(l.num_parameters * state_bytes);
  }
  spec.step_sync_s = terms.step_sync_s;

  Engine engine(s.pp, &network);
  for (int r = 0; r < s.pp; ++r) {
    const MemoryBreakdown& mem = memory[static_cast<std::size_t>(r)];
    engine.rank(r).static_bytes = mem.total() - mem.activation_bytes;
  }
  sim::build_step(spec, engine, &comms, options.record_trace);
  if (options.max_tasks > 0 &&
      static_cast<std::int64_t>(engine.tasks().size()) > options.max_tasks) {
    SimulationResult skipped;
    skipped.skipped = true;
    skipped.tasks = static_cast<std::int64_t>(engine.tasks().size());
    return skipped;
  }
  engine.run();

  SimulationResult out =
      collect(engine, spec, per_stage, options.record_trace, sim::replay_bubble(spec));
  for (int g = 0; g < world; ++g) {
    out.device_names.push_back(
        cost.topology().device_name(device_of_rank[static_cast<std::size_t>(g)]));
  }
  Prediction& p = out.prediction;
  for (int r = 0; r < s.pp; ++r) {
    RankTimeline& t = out.ranks[static_cast<std::size_t>(r)];
    t.activation_bytes_per_micro_batch = load[static_cast<std::size_t>(r)].activation_bytes;
    MemoryBreakdown mem = memory[static_cast<std::size_t>(r)];
    mem.activation_bytes = t.peak_activation_bytes;
    p.memory_by_stage.push_back(mem);
    p.peak_memory_bytes = std::max(p.peak_memory_bytes, t.peak_memory_bytes);
    p.optimizer_s = std::max(p.optimizer_s, t.optimizer_s);
  }
  set_throughput(m, cost.cluster(), job, s, &p);
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
  sim::build_step(spec, engine, nullptr, options.record_trace);
  engine.run();
  SimulationResult out =
      collect(engine, spec, 1, options.record_trace, sim::pipeline_bubble(engine, pp));
  for (int r = 0; r < pp; ++r) out.device_names.push_back("stage" + std::to_string(r));
  return out;
}

std::vector<double> simulate_transfers(const profiles::Cluster& cluster,
                                       const std::vector<Transfer>& transfers) {
  const profiles::Topology topology(cluster);
  Network network(sim::link_capacities_bytes_per_s(topology));
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
