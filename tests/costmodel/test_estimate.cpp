#include <catch2/catch.hpp>
#include <random>

#include "costmodel/compute.hpp"
#include "costmodel/estimate.hpp"
#include "costmodel/layers.hpp"
#include "profiles/loader.hpp"

using namespace loom;
using namespace loom::costmodel;

namespace {

Strategy make(int dp, int tp, int pp, int zero, std::int64_t b, std::int64_t m,
              Schedule schedule = Schedule::k1F1B, Recompute recompute = Recompute::kNone,
              int v = 1) {
  Strategy s;
  s.dp = dp;
  s.tp = tp;
  s.pp = pp;
  s.zero = zero;
  s.micro_batch = b;
  s.num_micro_batches = m;
  s.schedule = schedule;
  s.recompute = recompute;
  s.virtual_stages = v;
  return s;
}

Prediction run(const CostModel& cost, const Job& job, const Strategy& s) {
  return cost.estimate(job, s, even_partition(cost.model(), s.pp * s.virtual_stages));
}

Job job_of(const Strategy& s, std::int64_t seq) {
  return Job{s.dp * s.micro_batch * s.num_micro_batches, seq, Precision::kBf16, "adamw"};
}

}  // namespace

TEST_CASE("a prediction is self-consistent", "[estimate]") {
  CostModel cost(profiles::load_model("bert-large"), profiles::load_cluster("dgx-a100-80g"));
  Strategy s = make(4, 8, 1, 1, 4, 32);
  Job job = job_of(s, 512);
  Prediction p = run(cost, job, s);
  CHECK(p.step_time_s > 0);
  CHECK(p.samples_per_s * p.step_time_s == Approx(512));
  CHECK(p.tokens_per_s == Approx(p.samples_per_s * 512));
  double flops = model_flops_per_step(cost.model(), 512, 512);
  CHECK(p.model_tflops_per_gpu == Approx(flops / p.step_time_s / 32 / 1e12));
  CHECK(p.mfu == Approx(p.model_tflops_per_gpu / 312));
  CHECK(p.mfu < 0.8);  // the matrix efficiency bounds it
  REQUIRE(p.memory_by_stage.size() == 1);
  CHECK(p.peak_memory_bytes == Approx(p.memory_by_stage[0].total()));
  CHECK(p.bubble_fraction == 0);
  CHECK(p.exposed_communication_s.tp > 0);  // tp = 8 all-reduces sit on the critical path
  CHECK(p.exposed_communication_s.pp == 0);
}

TEST_CASE("GPT-3 175B on 1024 A100s lands near the published throughput", "[estimate]") {
  // Narayanan et al. 2021, Table 1: GPT-3 175B, (t, p) = (8, 8), 1024 GPUs, batch 1536, reached
  // 138 TFLOP/s per GPU (44 % of peak) with full recomputation (their FLOP count includes it).
  profiles::Cluster c = profiles::with_nodes(profiles::load_cluster("dgx-a100-80g"), 128, "test");
  CostModel cost(profiles::load_model("gpt3-175b"), c);
  Strategy s = make(16, 8, 8, 0, 1, 96, Schedule::kInterleaved, Recompute::kFull, 2);
  Prediction p = run(cost, job_of(s, 2048), s);
  CHECK(p.hardware_tflops_per_gpu > 0.6 * 138);
  CHECK(p.hardware_tflops_per_gpu < 1.4 * 138);
  CHECK(p.peak_memory_bytes < 80.0 * 1024 * 1024 * 1024);
}

TEST_CASE("properties over random strategies", "[estimate][property]") {
  profiles::Cluster c = profiles::with_nodes(profiles::load_cluster("dgx-a100-80g"), 16, "test");
  CostModel bert(profiles::load_model("bert-large"), c);
  std::mt19937 rng(42);
  auto pick = [&](std::initializer_list<int> values) {
    std::vector<int> v(values);
    return v[std::uniform_int_distribution<std::size_t>(0, v.size() - 1)(rng)];
  };
  for (int i = 0; i < 400; ++i) {
    int tp = pick({1, 2, 4});
    int pp = pick({1, 2, 4});
    int dp = pick({1, 2, 4});
    int zero = pick({0, 1, 2, 3});
    int b = pick({1, 2, 4, 8});
    int m = pick({1, 2, 4, 8});
    Schedule schedule = pick({0, 1}) ? Schedule::k1F1B : Schedule::kGpipe;
    Recompute rc = static_cast<Recompute>(pick({0, 1, 2}));
    Strategy s = make(dp, tp, pp, zero, b, m, schedule, rc);
    Prediction base = run(bert, job_of(s, 512), s);

    // More tensor parallelism: less memory per GPU.
    Strategy more_tp = s;
    more_tp.tp = tp * 2;
    CHECK(run(bert, job_of(more_tp, 512), more_tp).peak_memory_bytes < base.peak_memory_bytes);

    // More micro-batches of the same size: a smaller bubble (when there is a pipeline).
    Strategy more_m = s;
    more_m.num_micro_batches = m * 2;
    Prediction pm = run(bert, job_of(more_m, 512), more_m);
    if (pp > 1) CHECK(pm.bubble_fraction < base.bubble_fraction);
    if (pp == 1) CHECK(pm.bubble_fraction == 0);

    // A higher ZeRO stage never needs more model-state memory (with dp > 1, strictly less).
    if (zero < 3) {
      Strategy more_zero = s;
      more_zero.zero = zero + 1;
      Prediction pz = run(bert, job_of(more_zero, 512), more_zero);
      double states = base.memory_by_stage[0].parameter_bytes +
                      base.memory_by_stage[0].gradient_bytes +
                      base.memory_by_stage[0].optimizer_bytes;
      double states_z = pz.memory_by_stage[0].parameter_bytes +
                        pz.memory_by_stage[0].gradient_bytes +
                        pz.memory_by_stage[0].optimizer_bytes;
      if (dp > 1) CHECK(states_z < states);
      if (dp == 1) CHECK(states_z == Approx(states));
    }

    // More recomputation: fewer activation bytes, more hardware FLOPs per step.
    if (rc != Recompute::kFull) {
      Strategy more_rc = s;
      more_rc.recompute = static_cast<Recompute>(static_cast<int>(rc) + 1);
      Prediction pr = run(bert, job_of(more_rc, 512), more_rc);
      CHECK(pr.memory_by_stage[0].activation_bytes < base.memory_by_stage[0].activation_bytes);
      CHECK(pr.hardware_tflops_per_gpu * pr.step_time_s >
            base.hardware_tflops_per_gpu * base.step_time_s);
    }

    // GPipe keeps every micro-batch alive: never less activation memory than 1F1B.
    if (schedule == Schedule::k1F1B) {
      Strategy gpipe = s;
      gpipe.schedule = Schedule::kGpipe;
      CHECK(run(bert, job_of(gpipe, 512), gpipe).memory_by_stage[0].activation_bytes >=
            base.memory_by_stage[0].activation_bytes);
    }
  }
}

TEST_CASE("a strategy that does not divide is refused with the reason", "[estimate]") {
  CostModel cost(profiles::load_model("bert-large"), profiles::load_cluster("dgx-a100-80g"));
  Strategy s = make(1, 3, 1, 0, 1, 1);
  REQUIRE_THROWS_WITH(run(cost, job_of(s, 128), s), Catch::Contains("16 attention heads"));
  Strategy big = make(64, 1, 1, 0, 1, 1);
  REQUIRE_THROWS_WITH(run(cost, job_of(big, 128), big), Catch::Contains("32 devices"));
}

TEST_CASE("a CPU rank's threads speed its roofline by Amdahl's law", "[estimate]") {
  DeviceRates one;
  one.matrix_flops_per_s = 1e11;
  one.memory_bytes_per_s = 1e10;
  one.thread_serial_fraction = 0.85;
  // 2 / (1 + 0.85) = 1.0810...
  CHECK(scaled_rates(one, 2).matrix_flops_per_s == Approx(1e11 * 2 / 1.85));
  CHECK(scaled_rates(one, 2).memory_bytes_per_s == Approx(1e10 * 2 / 1.85));
  CHECK(scaled_rates(one, 1).matrix_flops_per_s == Approx(1e11));
  one.thread_serial_fraction = 0;
  CHECK(scaled_rates(one, 4).matrix_flops_per_s == Approx(4e11));
}

