// Context parallelism (costmodel/context_parallel.hpp): the key/value block and the ring's exposed
// time in closed form, what cp divides and what it shards in the estimate, the strategy's JSON and
// refusals, the rank layout, the search over cp and Megatron-LM's flag.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "costmodel/context_parallel.hpp"
#include "costmodel/estimate.hpp"
#include "planner/emit.hpp"
#include "planner/plan.hpp"
#include "planner/search.hpp"
#include "profiles/loader.hpp"

using namespace loom;
using namespace loom::costmodel;

namespace {

Job megatron_job(std::int64_t global_batch, std::int64_t seq_len) {
  Job job{global_batch, seq_len, Precision::kBf16, "adamw"};
  job.runtime = Runtime::kMegatron;
  return job;
}

Strategy flash(int dp, int tp, int pp, int cp, std::int64_t micro_batches) {
  Strategy s;
  s.dp = dp;
  s.tp = tp;
  s.pp = pp;
  s.cp = cp;
  s.zero = 1;
  s.num_micro_batches = micro_batches;
  s.attention = Attention::kFlash;
  return s;
}

}  // namespace

TEST_CASE("one ring step sends a rank's keys and values", "[context_parallel]") {
  const profiles::ModelSpec llama = profiles::load_model("llama3-8b");  // 8 kv heads of 128
  // 2 x 8192 / 2 tokens x 1 sample x 8 heads x 128 x 2 bytes = 16 MiB; tp 4 holds 2 heads.
  CHECK(context_parallel_block_bytes(llama, 1, 8192, 2, 1, 2) == 16.0 * 1024 * 1024);
  CHECK(context_parallel_block_bytes(llama, 1, 8192, 2, 4, 2) == 4.0 * 1024 * 1024);
  CHECK(context_parallel_block_bytes(llama, 2, 32768, 8, 1, 2) == 2.0 * 4096 * 2 * 8 * 128 * 2);
}

TEST_CASE("the ring's sends add what one attention block cannot hide", "[context_parallel]") {
  // cp 4: 3 steps. Forward blocks of 4 ms / 4 = 1 ms beside 2 ms sends add 1 ms each; backward
  // blocks of 2.5 ms beside 4 ms (keys, values and their gradients) add 1.5 ms each.
  const ContextParallelExposure slow = context_parallel_exposure(2e-3, 4e-3, 10e-3, 4, 0);
  CHECK(slow.forward_s == Approx(3e-3));
  CHECK(slow.backward_s == Approx(4.5e-3));
  // A 0.5 ms send beside a 1 ms block, compute 20 % slower meanwhile: 0.5 x 0.2 / 1.2 ms a step.
  const ContextParallelExposure hidden = context_parallel_exposure(0.5e-3, 4e-3, 10e-3, 4, 0.2);
  CHECK(hidden.forward_s == Approx(3 * 0.5e-3 * 0.2 / 1.2));
  CHECK(hidden.backward_s == Approx(3 * 1e-3 * 0.2 / 1.2));
  const ContextParallelExposure none = context_parallel_exposure(2e-3, 4e-3, 10e-3, 1, 0.2);
  CHECK(none.forward_s == 0);
  CHECK(none.backward_s == 0);
}

TEST_CASE("cp divides a layer's activations and shards states over dp x cp", "[context_parallel]") {
  const CostModel cost(profiles::load_model("llama3-8b"), profiles::load_cluster("dgx-h100"));
  const Job job = megatron_job(64, 8192);
  // A rank of cp 2 keeps what a rank keeps for half the sequence.
  const SequenceCosts cp2 = cost.sequence_costs(job, flash(4, 1, 1, 2, 16));
  const SequenceCosts half = cost.sequence_costs(megatron_job(64, 4096), flash(4, 1, 1, 1, 16));
  const SequenceCosts whole = cost.sequence_costs(job, flash(4, 1, 1, 1, 16));
  CHECK(cp2.layer.activation_bytes == half.layer.activation_bytes);
  CHECK(cp2.layer.activation_bytes == Approx(whole.layer.activation_bytes / 2).epsilon(1e-12));
  CHECK(cp2.head.activation_bytes == half.head.activation_bytes);
  // The linear layers see half the tokens; the attention core half the whole grid; the ring adds
  // its sends: more than the half sequence's layer, less than the whole one's.
  CHECK(cp2.layer.forward_s > half.layer.forward_s);
  CHECK(cp2.layer.forward_s < whole.layer.forward_s);
  // Megatron's distributed optimizer shards over the 8 ranks of dp 4 x cp 2 as over dp 8.
  const Prediction p = cost.estimate(job, flash(4, 1, 1, 2, 16), even_partition(cost.model(), 1));
  const Prediction dp8 = cost.estimate(megatron_job(128, 8192), flash(8, 1, 1, 1, 16),
                                       even_partition(cost.model(), 1));
  CHECK(p.memory_by_stage[0].optimizer_bytes == dp8.memory_by_stage[0].optimizer_bytes);
  CHECK(p.memory_by_stage[0].gradient_bytes == dp8.memory_by_stage[0].gradient_bytes);
  CHECK(p.memory_by_stage[0].parameter_bytes == dp8.memory_by_stage[0].parameter_bytes);
  // Model FLOPs count the whole sequence on all 8 GPUs.
  CHECK(p.tokens_per_s == Approx(64.0 * 8192 / p.step_time_s));
}

TEST_CASE("cp is written to plan JSON only when it splits sequences", "[context_parallel]") {
  Strategy s = flash(2, 2, 1, 1, 4);
  CHECK_FALSE(strategy_to_json(s).contains("cp"));
  s.cp = 4;
  const nlohmann::json j = strategy_to_json(s);
  CHECK(j.at("cp") == 4);
  CHECK(strategy_from_json(j, "plan.json", "strategy") == s);
  CHECK(describe(s).find(" cp=4") != std::string::npos);
  CHECK(s.world_size() == 16);
}

TEST_CASE("cp's refusals name what it needs", "[context_parallel]") {
  const profiles::ModelSpec llama = profiles::load_model("llama3-8b");
  Strategy s = flash(1, 1, 1, 4, 8);
  CHECK_FALSE(check_strategy(llama, 8, megatron_job(8, 8192), s));
  CHECK(*check_strategy(llama, 8, megatron_job(8, 8196), s) ==
        "context parallelism cuts each sequence into 2*cp chunks: cp=4 needs seq_len=8196 to be "
        "a multiple of 8");
  s.attention = Attention::kMath;
  CHECK(check_strategy(llama, 8, megatron_job(8, 8192), s)->find("needs attention=flash") !=
        std::string::npos);
  s.attention = Attention::kFlash;
  Job loom = megatron_job(8, 8192);
  loom.runtime = Runtime::kLoom;
  CHECK(*check_strategy(llama, 8, loom, s) ==
        "runtime loom: context parallelism (cp=4) is Megatron-Core's with TransformerEngine's "
        "attention: use runtime megatron or nemo, or cp 1");
  CHECK(*check_strategy(llama, 2, megatron_job(8, 8192), s) ==
        "dp*tp*pp*cp = 1*1*1*4 = 4 ranks, but the cluster has 2 devices");
}

TEST_CASE("ranks are laid out tp, then cp, then dp, then pp", "[context_parallel]") {
  const profiles::Cluster cluster = profiles::load_cluster("dgx-h100");
  const std::vector<planner::RankPlacement> ranks =
      planner::megatron_placement(flash(2, 2, 2, 2, 2), cluster);
  REQUIRE(ranks.size() == 16);
  // Rank 6 = tp 0 + 2 x (cp 1 + 2 x (dp 1 + 2 x pp 0)); rank 13 = 1 + 2 x (0 + 2 x (1 + 2 x 1)).
  CHECK(ranks[6].tp == 0);
  CHECK(ranks[6].cp == 1);
  CHECK(ranks[6].dp == 1);
  CHECK(ranks[6].pp == 0);
  CHECK(ranks[13].tp == 1);
  CHECK(ranks[13].cp == 0);
  CHECK(ranks[13].dp == 1);
  CHECK(ranks[13].pp == 1);
}

TEST_CASE("the search tries cp where the runtime runs it, and Megatron-LM gets its flag",
          "[context_parallel]") {
  const CostModel cost(profiles::load_model("llama3-8b"),
                       profiles::with_devices(profiles::load_cluster("dgx-h100"), 8, "--gpus"));
  planner::SearchOptions o;
  o.top = 50;
  o.simulate = false;
  const Job job = megatron_job(128, 8192);
  const planner::SearchResult megatron = planner::search(cost, job, o);
  REQUIRE_FALSE(megatron.plans.empty());
  bool any_cp = false;
  for (const planner::Plan& p : megatron.plans) any_cp = any_cp || p.strategy.cp > 1;
  CHECK(any_cp);
  Job loom = job;
  loom.runtime = Runtime::kLoom;
  for (const planner::Plan& p : planner::search(cost, loom, o).plans) CHECK(p.strategy.cp == 1);
  // A sequence that 2 cp chunks cannot cut still plans, at cp 1.
  const planner::SearchResult odd = planner::search(cost, megatron_job(128, 2049), o);
  REQUIRE_FALSE(odd.plans.empty());
  for (const planner::Plan& p : odd.plans) CHECK(p.strategy.cp == 1);
  // Pinned: every plan splits its sequences over 4 ranks.
  o.cp = 4;
  const planner::SearchResult pinned = planner::search(cost, job, o);
  REQUIRE_FALSE(pinned.plans.empty());
  for (const planner::Plan& p : pinned.plans) CHECK(p.strategy.cp == 4);
  const std::string args = planner::emit_plan(pinned.plans[0], Runtime::kMegatron);
  CHECK(args.find("--context-parallel-size 4") != std::string::npos);
  CHECK_THROWS_WITH(planner::emit_plan(pinned.plans[0], Runtime::kDeepspeed),
                    Catch::Contains("context parallelism (cp=4) is Megatron-Core's"));
}
