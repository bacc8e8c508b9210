// Layer-to-stage partition (balanced by time under memory) and rank-to-device mapping.
#include <catch2/catch.hpp>

#include "planner/mapping.hpp"
#include "planner/partition.hpp"
#include "planner/search.hpp"
#include "profiles/errors.hpp"
#include "profiles/loader.hpp"

using namespace loom;
using namespace loom::planner;
using costmodel::StageRange;
using costmodel::Strategy;

namespace {
Strategy pipeline(int pp, std::int64_t micro_batches) {
  Strategy s;
  s.pp = pp;
  s.dp = 1;
  s.tp = 1;
  s.micro_batch = 1;
  s.num_micro_batches = micro_batches;
  return s;
}
}  // namespace

TEST_CASE("balanced partition: GPT-2's heavy LM head takes the last stage alone",
          "[planner][partition]") {
  // The LM head is a 768 x 50257 matmul, V / (12 h) = 5.5 transformer layers of FLOPs. On A100's
  // 108 SMs a layer's 1024 x 768 products run at about 30 % of peak (few tiles, small k) where
  // an aligned 1024 x 50304 product would run at 70 %; but 50257 is not a whole number of 16-byte
  // vectors, so the head's products run at 0.35 of that rate (gemm.hpp), and with its fp32
  // cross-entropy the head takes 4 layers of time (1340 us against 332 us forward):
  // (embedding + 4) + 4 + 4 + head.
  profiles::Cluster four = profiles::with_nodes(
      profiles::datasheet_cluster(profiles::load_cluster("dgx-a100-80g")), 1, "test");
  four.devices_per_node = 4;
  // The kernels' time alone: at one sample per micro-batch the host's issue of the layers' kernels
  // would bound every stage alike (compute.hpp's host floor).
  four.device.host_launch_us = 0;
  four.device.host_pass_us = 0;
  costmodel::CostModel cost(profiles::load_model("gpt2"), four);
  costmodel::Job job{64, 1024, profiles::Precision::kBf16, "adamw"};
  job.half_model =
      true;  // bf16 kernels throughout (autocast's fp32 stream would weigh layers more)
  const Strategy s = pipeline(4, 64);
  auto balanced = balanced_partition(cost, job, s, 1e12);
  REQUIRE(balanced.has_value());
  const auto even = costmodel::even_partition(cost.model(), 4);
  CHECK(even == std::vector<StageRange>{{0, 3}, {4, 6}, {7, 9}, {10, 13}});
  CHECK(*balanced == std::vector<StageRange>{{0, 4}, {5, 8}, {9, 12}, {13, 13}});
  CHECK(cost.estimate(job, s, *balanced).step_time_s <
        0.65 * cost.estimate(job, s, even).step_time_s);
}

TEST_CASE("balanced partition: every stage within the memory limit, or none",
          "[planner][partition]") {
  costmodel::CostModel cost(
      profiles::load_model("bert-large"),
      profiles::datasheet_cluster(profiles::load_cluster("v100-32g-2x-pcie")));
  const costmodel::Job job{64, 512, profiles::Precision::kFp16, "adamw"};
  // 1F1B: stage 0 keeps two micro-batches of activations, stage 1 one.
  Strategy s = pipeline(2, 64);
  s.micro_batch = 8;
  s.num_micro_batches = 8;
  const auto unconstrained = balanced_partition(cost, job, s, 1e15);
  REQUIRE(unconstrained.has_value());
  const costmodel::Prediction loose = cost.estimate(job, s, *unconstrained);
  const double peak = loose.peak_memory_bytes;
  CHECK(loose.memory_by_stage[0].total() == peak);
  // With 85 % of that peak allowed the split must move layers to the lighter stage and still fit.
  const auto tight = balanced_partition(cost, job, s, 0.85 * peak);
  REQUIRE(tight.has_value());
  CHECK(tight->front().last_layer < unconstrained->front().last_layer);
  const costmodel::Prediction p = cost.estimate(job, s, *tight);
  CHECK(p.peak_memory_bytes <= 0.85 * peak);
  CHECK(p.step_time_s >= cost.estimate(job, s, *unconstrained).step_time_s);
  CHECK_FALSE(balanced_partition(cost, job, s, 0.3 * peak).has_value());
}

TEST_CASE("parse_stages reads the syntax of --stages", "[planner][partition]") {
  CHECK(parse_stages("0-0,1-13", "--stages") == std::vector<StageRange>{{0, 0}, {1, 13}});
  CHECK(parse_stages("0-25", "--stages") == std::vector<StageRange>{{0, 25}});
  for (const char* bad : {"", "0-", "-3", "0-0,,1-3", "a-b", "0:3", "0-0 1-3"}) {
    CHECK_THROWS_AS(parse_stages(bad, "--stages"), InputError);
  }
}

TEST_CASE("mapping: regular nodes keep rank r on device r", "[planner][mapping]") {
  for (const char* name : {"dgx-a100-80g", "v100-16g-4x-nvlink", "v100-32g-2x-pcie"}) {
    const profiles::Cluster c = profiles::load_cluster(name);
    const profiles::Topology t(c);
    Strategy s;
    s.tp = 2;
    s.dp = static_cast<int>(c.device_count() / 2);
    std::vector<int> m = map_ranks(t, c, s);
    for (std::size_t r = 0; r < m.size(); ++r) CHECK(m[r] == static_cast<int>(r));
  }
}

TEST_CASE("mapping: on an irregular node tp pairs follow the fast links", "[planner][mapping]") {
  // Two NVLink pairs wired crosswise: gpu0-gpu2 and gpu1-gpu3 fast, everything else over PCIe.
  profiles::Cluster c = profiles::datasheet_cluster(profiles::load_cluster("v100-16g-4x-nvlink"));
  c.name = "crossed-pairs";
  c.links = {
      {"node0/gpu0", "node0/gpu2", 50, 2, "nvlink"}, {"node0/gpu1", "node0/gpu3", 50, 2, "nvlink"},
      {"node0/gpu0", "node0/pcie", 12, 5, "pcie"},   {"node0/gpu1", "node0/pcie", 12, 5, "pcie"},
      {"node0/gpu2", "node0/pcie", 12, 5, "pcie"},   {"node0/gpu3", "node0/pcie", 12, 5, "pcie"}};
  const profiles::Topology t(c);
  Strategy s;
  s.tp = 2;
  s.dp = 2;
  CHECK(map_ranks(t, c, s) == std::vector<int>{0, 2, 1, 3});
  s.tp = 1;
  s.dp = 2;
  s.pp = 2;  // the innermost group is then dp
  CHECK(map_ranks(t, c, s) == std::vector<int>{0, 2, 1, 3});

  // The search places the plan that way and says so.
  costmodel::CostModel cost(profiles::load_model("bert-large"), c);
  SearchOptions o;
  o.tp = 2;
  o.pp = 1;
  const SearchResult r = search(cost, {32, 512, profiles::Precision::kFp16, "adamw"}, o);
  REQUIRE_FALSE(r.plans.empty());
  const Plan& p = r.plans.front();
  CHECK(p.ranks[1].device == "node0/gpu2");
  CHECK(p.ranks[2].device == "node0/gpu1");
  bool said = false;
  for (const std::string& w : p.why)
    said = said || w.find("tp groups placed on") != std::string::npos;
  CHECK(said);
  // And it is faster than device order.
  costmodel::CostModel identity(profiles::load_model("bert-large"), c);
  const Plan in_order = evaluate_strategy(identity, p.job, p.strategy, p.stages);
  CHECK(p.predicted.step_time_s < in_order.predicted.step_time_s);
}
