// Full recomputation of only the first N layers of each chunk (Strategy::recompute_layers):
// every per-layer term is the share-weighted blend of the recomputing and the plain layer.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "costmodel/estimate.hpp"
#include "costmodel/layers.hpp"
#include "profiles/loader.hpp"

using namespace loom;
using namespace loom::costmodel;

namespace {

Strategy tp2_pp2(Recompute recompute, int recompute_layers) {
  Strategy s;
  s.dp = 2;
  s.tp = 2;
  s.pp = 2;
  s.micro_batch = 4;
  s.num_micro_batches = 8;
  s.recompute = recompute;
  s.recompute_layers = recompute_layers;
  return s;
}

double count_of(const TensorParallelCollectives& list) {
  double out = 0;
  for (const TensorParallelCollective& c : list) out += c.count;
  return out;
}

}  // namespace

TEST_CASE("the recomputing share of a chunk's layers", "[recompute-layers]") {
  Strategy s;
  CHECK(recompute_share(s, 24) == 0);  // no recomputation
  s.recompute = Recompute::kFull;
  CHECK(recompute_share(s, 24) == 1);  // every layer
  s.recompute_layers = 6;
  CHECK(recompute_share(s, 24) == 0.25);  // 6 of 24
  s.pp = 4;
  s.recompute_layers = 3;
  CHECK(recompute_share(s, 24) == 0.5);  // 3 of each chunk's 6
  s.pp = 5;
  s.recompute_layers = 2;
  CHECK(recompute_share(s, 24) == 0.4);  // 2 of the largest chunk's ceil(24 / 5) = 5
  s.recompute_layers = 9;
  CHECK(recompute_share(s, 24) == 1);  // more than a chunk holds: all of it
  s.pp = 2;
  s.virtual_stages = 2;
  s.recompute_layers = 3;
  CHECK(recompute_share(s, 24) == 0.5);  // 3 of each of the 4 chunks' 6
}

TEST_CASE("recomputing 3 of a stage's 12 layers blends a quarter of the full terms",
          "[recompute-layers]") {
  const CostModel cost(profiles::load_model("bert-large"), profiles::load_cluster("dgx-a100-80g"));
  const Job job{64, 512, Precision::kBf16, "adamw"};
  const Strategy none = tp2_pp2(Recompute::kNone, 0);
  const Strategy full = tp2_pp2(Recompute::kFull, 0);
  const Strategy part = tp2_pp2(Recompute::kFull, 3);
  REQUIRE(recompute_share(part, 24) == 0.25);
  const StepTerms n = cost.step_terms(job, none);
  const StepTerms f = cost.step_terms(job, full);
  const StepTerms p = cost.step_terms(job, part);
  auto quarter = [](double plain, double recomputing) { return 0.75 * plain + 0.25 * recomputing; };
  CHECK(p.costs.layer.forward_s ==
        Approx(quarter(n.costs.layer.forward_s, f.costs.layer.forward_s)));
  CHECK(p.costs.layer.backward_s ==
        Approx(quarter(n.costs.layer.backward_s, f.costs.layer.backward_s)));
  CHECK(p.costs.layer.activation_bytes ==
        Approx(quarter(n.costs.layer.activation_bytes, f.costs.layer.activation_bytes)));
  CHECK(p.costs.layer.backward_s > n.costs.layer.backward_s);
  CHECK(p.costs.layer.backward_s < f.costs.layer.backward_s);
  // Megatron's two backward all-reduces per layer, and two more where the forward replays.
  CHECK(count_of(n.layer.backward_tp) == 2);
  CHECK(count_of(f.layer.backward_tp) == 4);
  CHECK(count_of(p.layer.backward_tp) == Approx(2.5));
  CHECK(count_of(p.layer.forward_tp) == Approx(2));
  // The working set of a layer run again comes after the 9 plain layers freed theirs.
  CHECK(f.backward_temporary_bytes > 0);
  CHECK(f.backward_temporary_bytes < 9 * n.costs.layer.activation_bytes);
  // A plain layer's backward temporaries on a GPU: the unfused attention's gradients of Q, K, V
  // (3 x 2 x 512 x 4 x 1024 / 2) and of its fp32 scores (4 x 16 x 512^2 x 4 / 2).
  CHECK(n.backward_temporary_bytes == 6291456.0 + 33554432.0);
  CHECK(p.backward_temporary_bytes ==
        std::max(n.backward_temporary_bytes,
                 f.backward_temporary_bytes - 9 * n.costs.layer.activation_bytes));
  // The embedding and the head do not change.
  CHECK(p.costs.embedding.activation_bytes == n.costs.embedding.activation_bytes);
  CHECK(p.costs.head.backward_s == n.costs.head.backward_s);
  // Stage memory: 3 layers keep their inputs, 9 everything.
  const auto stages = even_partition(cost.model(), 2);
  const Prediction pn = cost.estimate(job, none, stages);
  const Prediction pf = cost.estimate(job, full, stages);
  const Prediction pp = cost.estimate(job, part, stages);
  CHECK(pp.memory_by_stage[0].activation_bytes ==
        Approx(quarter(pn.memory_by_stage[0].activation_bytes,
                       pf.memory_by_stage[0].activation_bytes)));
  CHECK(pp.peak_memory_bytes < pn.peak_memory_bytes);
  CHECK(pp.peak_memory_bytes > pf.peak_memory_bytes);
  CHECK(pp.step_time_s > pn.step_time_s);
  CHECK(pp.step_time_s < pf.step_time_s);
  // Hardware FLOPs count the extra forward of 6 of the 24 layers.
  const profiles::ModelSpec& m = cost.model();
  const double model = model_flops_per_step(m, 64, 512);
  CHECK(hardware_flops_per_step(m, 64, 512, Recompute::kFull, Attention::kMath,
                                SelectivePolicy::kAttentionCore, 0.25) -
            model ==
        Approx(6 * transformer_layer_forward_flops(m, 64, 512)));
}

TEST_CASE("recompute_layers in a plan: written when set, refused when it cannot apply",
          "[recompute-layers]") {
  const profiles::ModelSpec model = profiles::load_model("bert-large");
  const Job job{64, 512, Precision::kBf16, "adamw"};
  Strategy s = tp2_pp2(Recompute::kFull, 3);
  const nlohmann::json j = strategy_to_json(s);
  CHECK(j.at("recompute_layers") == 3);
  CHECK(strategy_from_json(j, "plan.json", "$.strategy") == s);
  CHECK_FALSE(strategy_to_json(tp2_pp2(Recompute::kFull, 0)).contains("recompute_layers"));
  CHECK_FALSE(check_strategy(model, 8, job, s).has_value());
  CHECK(describe(s).find("recompute=full recompute-layers=3") != std::string::npos);
  CHECK(recompute_cell(s) == "full(3)");
  s.recompute = Recompute::kSelective;
  CHECK(check_strategy(model, 8, job, s) ==
        "recompute_layers counts the layers that recompute in full: it needs recompute=full "
        "(found recompute=selective)");
  s.recompute = Recompute::kFull;
  s.recompute_layers = 25;
  CHECK(check_strategy(model, 8, job, s) ==
        "recompute_layers=25 must be between 1 and the 24 transformer layers (0 = every layer)");
  nlohmann::json bad = j;
  bad["recompute_layers"] = 0;
  CHECK_THROWS_WITH(strategy_from_json(bad, "plan.json", "$.strategy"),
                    Catch::Contains("plan.json") && Catch::Contains("recompute_layers"));
}
