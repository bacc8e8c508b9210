// The event-driven simulator: agreement with the closed forms where they are exact, link
// contention, activation memory per schedule, deterministic Chrome traces, and agreement with
// estimate() on realistic plans.
#include <catch2/catch.hpp>
#include <cmath>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "costmodel/comm.hpp"
#include "costmodel/memory.hpp"
#include "costmodel/pipeline.hpp"
#include "costmodel/sim_events.hpp"
#include "costmodel/simulator.hpp"
#include "costmodel/trace.hpp"
#include "profiles/cluster.hpp"
#include "profiles/loader.hpp"

using namespace loom;
using namespace loom::costmodel;

namespace {

Strategy make(int dp, int tp, int pp, int zero, std::int64_t b, std::int64_t m,
              Schedule schedule = Schedule::k1F1B, int v = 1) {
  Strategy s;
  s.dp = dp;
  s.tp = tp;
  s.pp = pp;
  s.zero = zero;
  s.micro_batch = b;
  s.num_micro_batches = m;
  s.schedule = schedule;
  s.virtual_stages = v;
  return s;
}

Job job_of(const Strategy& s, std::int64_t seq) {
  return Job{s.dp * s.micro_batch * s.num_micro_batches, seq, Precision::kBf16, "adamw"};
}

std::vector<StageRange> even(const CostModel& cost, const Strategy& s) {
  return even_partition(cost.model(), s.pp * s.virtual_stages);
}

bool close(double a, double b, double relative = 1e-9) {
  return std::abs(a - b) <= relative * std::max(std::abs(a), std::abs(b));
}

// One node of four GPUs wired by explicit links only.
profiles::Cluster tiny_cluster(std::vector<profiles::ExplicitLink> links) {
  profiles::Cluster c = profiles::load_cluster("dgx-a100-80g");
  c.name = "tiny";
  c.nodes = 1;
  c.devices_per_node = 4;
  c.inter_node.reset();
  c.links = std::move(links);
  return c;
}

// gpu0, gpu1 -> sw0 == 10 GB/s == sw1 <- gpu2, gpu3: traffic from {0,1} to {2,3} shares sw0-sw1.
profiles::Cluster shared_link_cluster() {
  return tiny_cluster({{"node0/gpu0", "node0/sw0", 100, 1, "nvlink"},
                       {"node0/gpu1", "node0/sw0", 100, 1, "nvlink"},
                       {"node0/sw0", "node0/sw1", 10, 1, "pcie"},
                       {"node0/sw1", "node0/gpu2", 100, 1, "nvlink"},
                       {"node0/sw1", "node0/gpu3", 100, 1, "nvlink"}});
}

// gpu0 - gpu2 and gpu1 - gpu3 each over a link of their own (10 GB/s, 3 us).
profiles::Cluster separate_links_cluster() {
  return tiny_cluster({{"node0/gpu0", "node0/gpu2", 10, 3, "nvlink"},
                       {"node0/gpu1", "node0/gpu3", 10, 3, "nvlink"},
                       {"node0/gpu0", "node0/gpu1", 100, 1, "nvlink"},
                       {"node0/gpu2", "node0/gpu3", 100, 1, "nvlink"}});
}

// A cluster on which communication costs nothing measurable.
profiles::Cluster free_network(std::int64_t nodes) {
  profiles::Cluster c = profiles::with_nodes(profiles::load_cluster("dgx-a100-80g"), nodes, "test");
  c.intra_node = {"free", 1e12, 0, std::nullopt, std::nullopt};
  c.inter_node = profiles::LinkClass{"free", 1e12, 0, std::nullopt, std::nullopt};
  c.collective_launch_us = 0;  // NCCL's own latency terms remain (a few microseconds a call)
  return c;
}

const TraceSlice* first_slice(const SimulationResult& r, int rank, const std::string& prefix) {
  for (const TraceSlice& s : r.slices) {
    if (s.rank == rank && s.name.rfind(prefix, 0) == 0) return &s;
  }
  return nullptr;
}

}  // namespace

TEST_CASE("the event queue orders by time, then by scheduling order", "[simulator]") {
  using sim::EventKind;
  sim::EventQueue q;
  q.push(2.0, EventKind::kTaskEnd, 1);
  q.push(1.0, EventKind::kTaskEnd, 2);
  q.push(2.0, EventKind::kLatencyEnd, 3);
  q.push(1.0, EventKind::kFlowDrain, 4, 7);
  std::vector<int> order;
  while (!q.empty()) order.push_back(q.pop().task);
  CHECK(order == std::vector<int>{2, 4, 1, 3});
}

TEST_CASE("uniform stages without communication give the closed forms", "[simulator]") {
  for (int p : {1, 2, 4, 8}) {
    for (std::int64_t m : {1, 2, 4, 8, 16, 32}) {
      std::vector<StageTime> ranks(static_cast<std::size_t>(p), StageTime{0.010, 0.020});
      for (Schedule schedule : {Schedule::kGpipe, Schedule::k1F1B}) {
        SimulationResult r = simulate_schedule(ranks, p, m, schedule, 1, SimulationOptions{false});
        INFO(to_string(schedule) << " pp=" << p << " m=" << m);
        CHECK(close(r.step_time_s, pipeline_time_s(ranks, m, schedule, 1)));
        CHECK(std::abs(r.bubble_fraction - bubble_fraction(ranks, m, schedule, 1)) < 1e-9);
      }
      if (p < 2 || m % p != 0) continue;
      for (int v : {2, 3, 4}) {
        std::vector<StageTime> chunks(static_cast<std::size_t>(p * v),
                                      StageTime{0.010 / v, 0.020 / v});
        SimulationResult r =
            simulate_schedule(chunks, p, m, Schedule::kInterleaved, v, SimulationOptions{false});
        INFO("interleaved pp=" << p << " m=" << m << " v=" << v);
        CHECK(close(r.step_time_s, pipeline_time_s(ranks, m, Schedule::kInterleaved, v)));
        CHECK(std::abs(r.bubble_fraction - bubble_fraction(ranks, m, Schedule::kInterleaved, v)) <
              1e-9);
      }
    }
  }
}

TEST_CASE("1F1B's first stage runs Megatron's warm-up, steady state and cool-down", "[simulator]") {
  // pp = 3, m = 4, F = 1, B = 2: stage 0 does F0 F1 F2 (warm-up 2 plus the first steady F),
  // then B0 F3 B1 B2 B3.
  std::vector<StageTime> ranks(3, StageTime{1, 2});
  SimulationResult r = simulate_schedule(ranks, 3, 4, Schedule::k1F1B, 1);
  std::vector<std::string> names;
  for (const TraceSlice& s : r.slices) {
    if (s.rank == 0) names.push_back(s.name.substr(0, s.name.find(' ', 2)));
  }
  CHECK(names == std::vector<std::string>{"F mb0", "F mb1", "F mb2", "B mb0", "F mb3", "B mb1",
                                          "B mb2", "B mb3"});
}

TEST_CASE("one replica without a pipeline plays exactly what estimate() adds up", "[simulator]") {
  // pp = 1 and dp = 1: m (forward + backward + tensor-parallel all-reduces) + optimizer.
  CostModel cost(profiles::load_model("bert-large"), profiles::load_cluster("dgx-a100-80g"));
  for (int tp : {1, 2, 8}) {
    Strategy s = make(1, tp, 1, 0, 4, 8);
    Job job = job_of(s, 512);
    Prediction e = cost.estimate(job, s, even(cost, s));
    SimulationResult r = simulate(cost, job, s, even(cost, s));
    INFO("tp=" << tp);
    CHECK(close(r.step_time_s, e.step_time_s));
    CHECK(std::abs(r.exposed_communication_s.tp - e.exposed_communication_s.tp) < 1e-9);
    CHECK(r.exposed_communication_s.pp == 0);
    CHECK(r.bubble_fraction == 0);
    CHECK(close(r.prediction.optimizer_s, e.optimizer_s));
  }
}

TEST_CASE("a lone all-reduce takes its alpha-beta time", "[simulator]") {
  // pp = 1, tp = 1 and one bucket: the gradients are all-reduced once, after the backward pass.
  profiles::Cluster cluster = profiles::load_cluster("dgx-a100-80g");
  CostOptions options;
  options.dp_bucket_bytes = 1e15;
  CostModel cost(profiles::load_model("bert-large"), cluster, options);
  for (int dp : {4, 8, 16}) {  // inside a node, one node, two nodes
    Strategy s = make(dp, 1, 1, 0, 4, 2);
    Job job = job_of(s, 512);
    SimulationResult r = simulate(cost, job, s, even(cost, s));
    std::vector<const TraceSlice*> reductions;
    for (const TraceSlice& x : r.slices) {
      if (x.stream == Stream::kDataParallel) reductions.push_back(&x);
    }
    REQUIRE(reductions.size() == 1);
    const double gradient_bytes = r.prediction.memory_by_stage[0].parameter_bytes;  // 2 bytes each
    const double expected = collective_time_s(Collective::kAllReduce, gradient_bytes, dp,
                                              cost.group_links().group(s.world_size(), dp, s.tp));
    INFO("dp=" << dp);
    CHECK(close(reductions[0]->duration_s, expected));
    // Nothing hides it, as estimate() says when the bucket is the whole gradient.
    Prediction e = cost.estimate(job, s, even(cost, s));
    CHECK(close(r.exposed_communication_s.dp, e.exposed_communication_s.dp));
    CHECK(close(r.step_time_s, e.step_time_s));
  }
}

TEST_CASE("transfers sharing a link split its bandwidth, separate links do not",
          "[simulator][contention]") {
  const double bytes = 1e8;  // 10 ms at 10 GB/s
  SECTION("shared link") {
    profiles::Cluster c = shared_link_cluster();
    const double latency = 3e-6;  // three hops of 1 us
    double alone = simulate_transfers(c, {{0, 2, bytes, 0}})[0];
    CHECK(close(alone, latency + 0.01));
    std::vector<double> both = simulate_transfers(c, {{0, 2, bytes, 0}, {1, 3, bytes, 0}});
    CHECK(close(both[0] - latency, 2 * (alone - latency)));
    CHECK(close(both[1] - latency, 2 * (alone - latency)));
    // Opposite directions of a full-duplex link do not interfere.
    std::vector<double> opposite = simulate_transfers(c, {{0, 2, bytes, 0}, {3, 1, bytes, 0}});
    CHECK(close(opposite[0], alone));
    CHECK(close(opposite[1], alone));
    // The second starts half-way: the first gets half the link from then on, and the second
    // the whole link once the first is done.
    std::vector<double> staggered = simulate_transfers(c, {{0, 2, bytes, 0}, {1, 3, bytes, 0.005}});
    CHECK(close(staggered[0], latency + 0.015));
    CHECK(close(staggered[1], 0.005 + latency + 0.015));
  }
  SECTION("separate links") {
    profiles::Cluster c = separate_links_cluster();
    double alone = simulate_transfers(c, {{0, 2, bytes, 0}})[0];
    CHECK(close(alone, 3e-6 + 0.01));
    std::vector<double> both = simulate_transfers(c, {{0, 2, bytes, 0}, {1, 3, bytes, 0}});
    CHECK(close(both[0], alone));
    CHECK(close(both[1], alone));
  }
  SECTION("a device out of range is refused") {
    CHECK_THROWS_AS(simulate_transfers(shared_link_cluster(), {{0, 4, bytes, 0}}),
                    std::invalid_argument);
  }
}

TEST_CASE("pipeline sends of data-parallel replicas contend on a shared link",
          "[simulator][contention]") {
  // pp = 2 on four GPUs: stage 0 on gpu0 (and gpu1 with dp = 2), stage 1 on gpu2 (and gpu3).
  const profiles::ModelSpec model = profiles::load_model("bert-large");
  auto send_time = [&](const profiles::Cluster& c, int dp) {
    std::vector<int> device_of_rank =
        dp == 1 ? std::vector<int>{0, 2, 1, 3} : std::vector<int>{0, 1, 2, 3};
    CostModel cost(model, c, CostOptions{}, device_of_rank);
    Strategy s = make(dp, 1, 2, 0, 8, 4);
    SimulationResult r = simulate(cost, job_of(s, 512), s, even(cost, s));
    const TraceSlice* send = first_slice(r, 0, "send act mb0");
    REQUIRE(send != nullptr);
    CHECK(send->peer_rank == dp);  // the representative of stage 1
    return send->duration_s;
  };
  const double latency = 3e-6;
  double one = send_time(shared_link_cluster(), 1);
  double two = send_time(shared_link_cluster(), 2);
  CHECK(close(two - latency, 2 * (one - latency)));
  double one_apart = send_time(separate_links_cluster(), 1);
  double two_apart = send_time(separate_links_cluster(), 2);
  CHECK(close(one_apart, two_apart));
}

TEST_CASE("activation memory in flight follows the schedule", "[simulator][memory]") {
  CostModel cost(profiles::load_model("bert-large"), profiles::load_cluster("dgx-a100-80g"));
  const int pp = 4;
  const std::int64_t m = 8;
  for (Schedule schedule : {Schedule::kGpipe, Schedule::k1F1B}) {
    Strategy s = make(1, 1, pp, 0, 4, m, schedule);
    SimulationResult r = simulate(cost, job_of(s, 512), s, even(cost, s));
    REQUIRE(r.ranks.size() == static_cast<std::size_t>(pp));
    for (const RankTimeline& t : r.ranks) {
      const double in_flight =
          activation_micro_batches_in_flight(schedule, pp, t.pipeline_rank, m, 1);
      INFO(to_string(schedule) << " stage " << t.pipeline_rank);
      CHECK(close(t.peak_activation_bytes, in_flight * t.activation_bytes_per_micro_batch));
      CHECK(close(t.peak_memory_bytes, t.static_memory_bytes + t.peak_activation_bytes));
      // Memory starts at the static bytes and ends there once every backward has freed its
      // activations.
      REQUIRE(t.memory.size() >= 2);
      CHECK(t.memory.front().time_s == 0);
      CHECK(close(t.memory.front().bytes, t.static_memory_bytes));
      CHECK(std::abs(t.memory.back().bytes - t.static_memory_bytes) < 1e-6 * t.static_memory_bytes);
    }
    if (schedule == Schedule::k1F1B) {
      // At most pp - stage micro-batches: the first stage holds the most.
      CHECK(r.ranks[0].peak_activation_bytes / r.ranks[0].activation_bytes_per_micro_batch ==
            Approx(4));
      CHECK(r.ranks[3].peak_activation_bytes / r.ranks[3].activation_bytes_per_micro_batch ==
            Approx(1));
    }
    // estimate() charges the same activations.
    Prediction e = cost.estimate(job_of(s, 512), s, even(cost, s));
    for (int k = 0; k < pp; ++k) {
      CHECK(close(r.prediction.memory_by_stage[static_cast<std::size_t>(k)].total(),
                  e.memory_by_stage[static_cast<std::size_t>(k)].total()));
    }
    CHECK(close(r.prediction.peak_memory_bytes, e.peak_memory_bytes));
  }
  SECTION("interleaved: Megatron's warm-up of chunk micro-batches") {
    // Rank r keeps (pp - r - 1) * 2 + (v - 1) * pp + 1 chunk-micro-batches alive.
    Strategy s = make(1, 1, pp, 0, 4, m, Schedule::kInterleaved, 2);
    SimulationResult r = simulate(cost, job_of(s, 512), s, even(cost, s));
    for (const RankTimeline& t : r.ranks) {
      double in_flight =
          activation_micro_batches_in_flight(Schedule::kInterleaved, pp, t.pipeline_rank, m, 2);
      INFO("stage " << t.pipeline_rank);
      // Chunks of one rank differ a little (the embedding, the head): within 2 %.
      CHECK(t.peak_activation_bytes / t.activation_bytes_per_micro_batch ==
            Approx(in_flight).epsilon(0.02));
    }
  }
  SECTION("interleaved with m == pp: Megatron warms up every micro-batch") {
    // Megatron-LM runs all m * v forwards first when m == pp, so every stage holds all m, as
    // activation_micro_batches_in_flight says.
    Strategy s = make(1, 1, pp, 0, 4, pp, Schedule::kInterleaved, 2);
    SimulationResult r = simulate(cost, job_of(s, 512), s, even(cost, s));
    for (const RankTimeline& t : r.ranks) {
      CHECK(t.peak_activation_bytes == Approx(pp * t.activation_bytes_per_micro_batch));
      CHECK(activation_micro_batches_in_flight(Schedule::kInterleaved, pp, t.pipeline_rank, pp,
                                               2) == pp);
    }
  }
}

TEST_CASE("the Chrome trace is deterministic JSON with every rank", "[simulator][trace]") {
  CostModel cost(profiles::load_model("bert-large"), profiles::load_cluster("dgx-a100-80g"));
  Strategy s = make(2, 2, 2, 1, 4, 4);
  Job job = job_of(s, 512);
  std::string a = chrome_trace_json(simulate(cost, job, s, even(cost, s)));
  std::string b = chrome_trace_json(simulate(cost, job, s, even(cost, s)));
  CHECK(a == b);

  nlohmann::json trace = nlohmann::json::parse(a);
  REQUIRE(trace.contains("traceEvents"));
  std::set<int> named, with_slices;
  std::set<std::string> threads;
  bool saw_send = false;
  bool saw_counter = false;
  for (const nlohmann::json& e : trace["traceEvents"]) {
    const std::string ph = e.at("ph").get<std::string>();
    const int pid = e.at("pid").get<int>();
    if (ph == "M" && e.at("name") == "process_name") {
      named.insert(pid);
      CHECK(e["args"]["name"].get<std::string>().rfind(
                "rank " + std::to_string(pid) + " (node0/gpu", 0) == 0);
    }
    if (ph == "M" && e.at("name") == "thread_name") threads.insert(e["args"]["name"]);
    if (ph == "X") {
      with_slices.insert(pid);
      CHECK(e.at("ts").is_number());
      CHECK(e.at("dur").get<double>() > 0);
      CHECK(e.at("tid").get<int>() < kStreamCount);
      const std::string name = e.at("name");
      if (name.rfind("send act mb0 -> rank ", 0) == 0) {
        saw_send = true;
        if (pid == 1) CHECK(name == "send act mb0 -> rank 5");  // dp 0, tp 1 of stage 0
      }
    }
    if (ph == "C") saw_counter = e["args"]["bytes"].is_number_integer();
  }
  CHECK(named.size() == 8);
  CHECK(with_slices.size() == 8);
  CHECK(threads == std::set<std::string>{"compute", "comm tp", "comm pp", "comm dp", "comm zero"});
  CHECK(saw_send);
  CHECK(saw_counter);
}

TEST_CASE("a big plan's trace lists every rank, slices on the representatives",
          "[simulator][trace]") {
  profiles::Cluster c = profiles::with_nodes(profiles::load_cluster("dgx-a100-80g"), 16, "test");
  CostModel cost(profiles::load_model("bert-large"), c);
  Strategy s = make(32, 2, 2, 0, 2, 4);
  SimulationResult r = simulate(cost, job_of(s, 512), s, even(cost, s));
  REQUIRE(r.world_size == 128);
  nlohmann::json trace = nlohmann::json::parse(chrome_trace_json(r, TraceOptions{64, false}));
  std::set<int> named, with_slices;
  for (const nlohmann::json& e : trace["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "process_name") named.insert(e["pid"].get<int>());
    if (e["ph"] == "X") with_slices.insert(e["pid"].get<int>());
  }
  CHECK(named.size() == 128);
  CHECK(with_slices == std::set<int>{0, 64});
}

TEST_CASE("realistic plans land near estimate()", "[simulator]") {
  SECTION("bert-large on 8 A100s, pp = 2, dp = 4") {
    CostModel cost(profiles::load_model("bert-large"), profiles::load_cluster("dgx-a100-80g"));
    for (Schedule schedule : {Schedule::kGpipe, Schedule::k1F1B}) {
      for (int zero : {0, 1, 2, 3}) {
        Strategy s = make(4, 1, 2, zero, 8, 8, schedule);
        Job job = job_of(s, 512);
        Prediction e = cost.estimate(job, s, even(cost, s));
        SimulationResult r = simulate(cost, job, s, even(cost, s));
        INFO(to_string(schedule) << " zero " << zero << ": estimate " << e.step_time_s
                                 << " s, simulation " << r.step_time_s << " s");
        CHECK(r.step_time_s == Approx(e.step_time_s).epsilon(0.15));
        CHECK(r.prediction.source == "simulation");
        CHECK(r.prediction.step_time_s == r.step_time_s);
        CHECK(r.prediction.samples_per_s * r.step_time_s == Approx(job.global_batch));
        CHECK(r.prediction.mfu == Approx(e.mfu * e.step_time_s / r.step_time_s));
        CHECK(r.bubble_fraction == Approx(e.bubble_fraction).epsilon(0.05));
        CHECK(r.events_processed > 0);
        for (const RankTimeline& t : r.ranks) {
          CHECK(t.busy_s > 0);
          CHECK(t.idle_s >= 0);
          CHECK(close(t.busy_s + t.idle_s, r.step_time_s));
        }
        // The static memory is estimate()'s.
        for (std::size_t k = 0; k < 2; ++k) {
          CHECK(close(r.prediction.memory_by_stage[k].parameter_bytes,
                      e.memory_by_stage[k].parameter_bytes));
          CHECK(close(r.prediction.memory_by_stage[k].optimizer_bytes,
                      e.memory_by_stage[k].optimizer_bytes));
          CHECK(close(r.prediction.memory_by_stage[k].buffer_bytes,
                      e.memory_by_stage[k].buffer_bytes));
        }
        CHECK(prediction_to_json(r.prediction)["source"] == "simulation");
      }
    }
  }
  SECTION("GPT-3 175B on 1024 A100s, tp = 8, pp = 16, dp = 8") {
    profiles::Cluster c = profiles::with_nodes(profiles::load_cluster("dgx-a100-80g"), 128, "test");
    CostModel cost(profiles::load_model("gpt3-175b"), c);
    for (Schedule schedule : {Schedule::k1F1B, Schedule::kInterleaved}) {
      Strategy s = make(8, 8, 16, 1, 1, 96, schedule, schedule == Schedule::kInterleaved ? 2 : 1);
      Job job = job_of(s, 2048);
      Prediction e = cost.estimate(job, s, even(cost, s));
      SimulationResult r = simulate(cost, job, s, even(cost, s), SimulationOptions{false});
      INFO(to_string(schedule) << ": estimate " << e.step_time_s << " s, simulation "
                               << r.step_time_s << " s");
      CHECK(r.step_time_s == Approx(e.step_time_s).epsilon(0.15));
      CHECK(r.slices.empty());
      CHECK(r.ranks.size() == 16);
      CHECK(r.device_names.size() == 1024);
      CHECK(r.exposed_communication_s.tp > 0);
      CHECK(r.exposed_communication_s.pp > 0);
    }
  }
}

TEST_CASE("free communication leaves the schedule's compute", "[simulator]") {
  // Communication that costs nothing: none is exposed, and the step is estimate()'s up to the
  // closed form's approximation of uneven stages (the embedding and the head).
  CostModel cost(profiles::load_model("bert-large"), free_network(1));
  for (Schedule schedule : {Schedule::kGpipe, Schedule::k1F1B, Schedule::kInterleaved}) {
    int v = schedule == Schedule::kInterleaved ? 2 : 1;
    Strategy s = make(2, 1, 4, 0, 4, 8, schedule, v);
    SimulationResult r = simulate(cost, job_of(s, 512), s, even(cost, s));
    INFO(to_string(schedule));
    // The gradient all-reduce over dp = 2 inside a node is NCCL's ring LL at its latency floor,
    // 6.6 + 2 x 1.0 = 8.6 us (tuning.cc's base latency and PCIe step latency: the link kind
    // "free" is not NVLink), the bytes free.
    CHECK(r.exposed_communication_s.dp == Approx(8.6e-6).epsilon(1e-6));
    CHECK(r.exposed_communication_s.pp < 1e-9);
    CHECK(r.exposed_communication_s.tp == 0);
    Prediction e = cost.estimate(job_of(s, 512), s, even(cost, s));
    CHECK(r.step_time_s == Approx(e.step_time_s).epsilon(0.02));
  }
}

TEST_CASE("the simulator refuses what estimate() refuses", "[simulator]") {
  CostModel cost(profiles::load_model("bert-large"), profiles::load_cluster("dgx-a100-80g"));
  Strategy s = make(4, 1, 2, 0, 8, 5, Schedule::kInterleaved, 2);  // m % pp != 0
  CHECK_THROWS_AS(simulate(cost, job_of(s, 512), s, even(cost, s)), std::invalid_argument);
  CHECK_THROWS_AS(simulate_schedule({{1, 2}}, 2, 4, Schedule::k1F1B, 1), std::invalid_argument);
}

TEST_CASE("a rank's step splits into loom train's phases", "[simulator][phases]") {
  auto phase = [](const RankTimeline& t, Phase p) {
    return t.phases_s[static_cast<std::size_t>(p)];
  };
  SECTION("1F1B, pp = 3, m = 4, F = 1, B = 2: busy 12 of 18 on every rank") {
    // The last stage starts after two forwards and finishes 2 B before the step ends; the
    // middle one 1 B before. What is not compute is waiting on the pipeline before a rank's
    // last task, and the gradient phase's wait for the other ranks after it.
    std::vector<StageTime> ranks(3, StageTime{1, 2});
    SimulationResult r = simulate_schedule(ranks, 3, 4, Schedule::k1F1B, 1);
    REQUIRE(r.step_time_s == 18);
    const double gradients[] = {0, 2, 4};
    for (int k = 0; k < 3; ++k) {
      const RankTimeline& t = r.ranks[static_cast<std::size_t>(k)];
      INFO("pipeline rank " << k);
      CHECK(phase(t, Phase::kForward) == 4);
      CHECK(phase(t, Phase::kBackward) == 8);
      CHECK(phase(t, Phase::kGradients) == gradients[k]);
      CHECK(phase(t, Phase::kPipelineWait) == 6 - gradients[k]);
      CHECK(phase(t, Phase::kOptimizer) == 0);
    }
  }
  SECTION("one replica: compute, its tp all-reduces and the optimizer step") {
    CostModel cost(profiles::load_model("bert-large"), profiles::load_cluster("dgx-a100-80g"));
    for (int tp : {1, 8}) {
      Strategy s = make(1, tp, 1, 0, 4, 8);
      Job job = job_of(s, 512);
      Prediction e = cost.estimate(job, s, even(cost, s));
      SimulationResult r = simulate(cost, job, s, even(cost, s));
      const RankTimeline& t = r.ranks[0];
      INFO("tp=" << tp);
      CHECK(close(phase(t, Phase::kOptimizer), e.optimizer_s));
      CHECK(phase(t, Phase::kPipelineWait) == 0);
      CHECK(phase(t, Phase::kGradients) == 0);
      CHECK(close(phase(t, Phase::kForward) + phase(t, Phase::kBackward) + phase(t, Phase::kOther),
                  r.step_time_s - e.optimizer_s));
      double forward_tp = 0;
      double forward_compute = 0;
      for (const TraceSlice& x : r.slices) {
        if (x.name.rfind("allreduce tp F", 0) == 0) forward_tp += x.duration_s;
        if (x.name.rfind("F ", 0) == 0) forward_compute += x.duration_s;
      }
      CHECK((tp == 1) == (forward_tp == 0));
      CHECK(close(phase(t, Phase::kForward), forward_compute + forward_tp));
    }
  }
  SECTION("every plan's phases add up to its step time") {
    CostModel cost(profiles::load_model("bert-large"), profiles::load_cluster("dgx-a100-80g"));
    for (const Strategy& s :
         {make(4, 1, 2, 1, 8, 8), make(2, 2, 2, 3, 4, 4, Schedule::kGpipe),
          make(1, 2, 4, 0, 2, 8, Schedule::kInterleaved, 2), make(8, 1, 1, 2, 8, 2)}) {
      SimulationResult r = simulate(cost, job_of(s, 512), s, even(cost, s));
      for (const RankTimeline& t : r.ranks) {
        double sum = 0;
        for (double x : t.phases_s) {
          CHECK(x >= 0);
          sum += x;
        }
        INFO(describe(s) << " rank " << t.rank);
        CHECK(close(sum, r.step_time_s, 1e-9));
      }
      if (s.pp > 1) CHECK(phase(r.ranks[0], Phase::kPipelineWait) > 0);
    }
  }
}

TEST_CASE("a CPU rank's cores take in each pipeline transfer, a GPU's do not", "[simulator]") {
  // pp = 2, four micro-batches: the second stage receives four activations, the first four
  // gradients. On CPU ranks Gloo receives on the cores the compute uses: each transfer keeps the
  // receiver's compute stream busy for the transfer's time alone (what estimate() adds to each
  // pass), beginning when the sender's pass ends. NCCL's transfers on GPUs run beside the compute.
  const profiles::ModelSpec model = profiles::load_model("tiny-bert");
  const Strategy s = make(1, 1, 2, 0, 4, 4);
  Job job = job_of(s, 64);
  for (const char* name : {"local-cpu", "dgx-a100-80g"}) {
    const profiles::Cluster cluster = profiles::load_cluster(name);
    const bool cpu = cluster.device.kind == profiles::DeviceKind::kCpu;
    job.precision = cpu ? Precision::kFp32 : Precision::kBf16;
    const CostModel cost(model, cluster);
    const double p2p_s = cost.step_terms(job, s).p2p_s;
    REQUIRE(p2p_s > 0);
    const SimulationResult r = simulate(cost, job, s, even(cost, s), SimulationOptions{true});
    int activations = 0;
    int gradients = 0;
    for (const TraceSlice& slice : r.slices) {
      if (slice.name.rfind("receive ", 0) != 0) continue;
      CHECK(slice.stream == Stream::kCompute);
      CHECK(close(slice.duration_s, p2p_s));
      (slice.rank == 1 ? activations : gradients) += 1;
      CHECK(slice.name.rfind(slice.rank == 1 ? "receive act" : "receive grad", 0) == 0);
    }
    INFO(name);
    CHECK(activations == (cpu ? 4 : 0));
    CHECK(gradients == (cpu ? 4 : 0));
  }
}
