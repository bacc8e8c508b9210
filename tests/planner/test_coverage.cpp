// Coverage of a plan by its profile: the points the prediction needs (plan_points) and the ones
// the profile lacks (extrapolated_points), recorded in the plan and read back.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "costmodel/layers.hpp"
#include "planner/coverage.hpp"
#include "planner/plan.hpp"
#include "profiles/loader.hpp"

using namespace loom;
using profiles::LayerKind;

namespace {

profiles::LayerMeasurement point(const profiles::ModelSpec& m, LayerKind kind, int threads) {
  profiles::LayerMeasurement p;
  p.kind = kind;
  p.hidden = m.hidden;
  p.heads = m.heads;
  p.ffn_hidden = m.ffn_hidden;
  if (kind != LayerKind::kEncoderLayer) p.vocab = m.vocab;
  p.seq_len = 64;
  p.micro_batch = 8;
  p.threads = threads;
  p.forward_s = 0.01;
  p.backward_s = 0.02;
  p.activation_bytes = 1'000'000;
  return p;
}

// tiny-bert, dp=2 with micro-batches of 8 at sequence length 64 on local-cpu (2 cores: one
// thread per rank), predicted with `profile`.
planner::Plan dp2_plan(const profiles::Profile& profile) {
  const profiles::ModelSpec model = profiles::load_model("tiny-bert");
  const costmodel::CostModel cost =
      planner::calibrated_cost_model(model, profiles::load_cluster("local-cpu"),
                                     std::make_shared<const profiles::Profile>(profile), nullptr);
  costmodel::Strategy s;
  s.dp = 2;
  s.micro_batch = 8;
  s.num_micro_batches = 1;
  const costmodel::Job job{16, 64, profiles::Precision::kFp32, "adamw"};
  return planner::evaluate_strategy(cost, job, s);
}

profiles::Profile layers_at(const profiles::ModelSpec& model, int threads) {
  profiles::Profile p;
  p.device = "test";
  p.device_kind = profiles::DeviceKind::kCpu;
  p.precision = profiles::Precision::kFp32;
  for (LayerKind kind : {LayerKind::kEmbedding, LayerKind::kEncoderLayer, LayerKind::kHead}) {
    p.layers.push_back(point(model, kind, threads));
  }
  return p;
}

}  // namespace

TEST_CASE("the points of a dp=2 plan: its shape at one thread per rank and its collectives",
          "[coverage]") {
  const profiles::ModelSpec model = profiles::load_model("tiny-bert");
  const planner::PlanPoints points = planner::plan_points(dp2_plan(layers_at(model, 1)));
  REQUIRE(points.layers.size() == 3);
  CHECK(points.layers[1].first == "encoder layer");
  CHECK(points.layers[1].second.micro_batch == 8);
  CHECK(points.layers[1].second.seq_len == 64);
  CHECK(points.threads == 1);  // local-cpu's 2 cores shared by 2 ranks
  CHECK(points.flat);
  // The fp32 gradient of the whole model (under the 25 MiB bucket) over dp, and loom train's
  // loss and stop vote (65 doubles) over the world.
  REQUIRE(points.links.size() == 2);
  CHECK(points.links[0].group == "dp");
  CHECK(points.links[0].bytes == 4 * costmodel::count_parameters(model).total);
  CHECK(points.links[1].group == "world");
  CHECK(points.links[1].bytes == 520);
}

TEST_CASE("a plan that recomputes some layers needs the plain layer too", "[coverage]") {
  const profiles::ModelSpec model = profiles::load_model("tiny-bert");
  planner::Plan plan = dp2_plan(layers_at(model, 1));
  plan.strategy.recompute = costmodel::Recompute::kFull;
  plan.strategy.recompute_layers = 1;  // 1 of tiny-bert's 4 layers
  const planner::PlanPoints points = planner::plan_points(plan);
  REQUIRE(points.layers.size() == 4);
  CHECK(points.layers[1].first == "encoder layer");
  CHECK(points.layers[1].second.recompute == "full");
  CHECK(points.layers[2].first == "encoder layer (not recomputed)");
  CHECK(points.layers[2].second.recompute == "none");
  plan.strategy.recompute_layers = 4;  // every layer: the plain one is not needed
  CHECK(planner::plan_points(plan).layers.size() == 3);
}

TEST_CASE("with context parallelism a layer's point holds the rank's share of the sequence",
          "[coverage]") {
  const profiles::ModelSpec model = profiles::load_model("tiny-bert");
  planner::Plan plan = dp2_plan(layers_at(model, 1));
  plan.strategy.dp = 1;
  plan.strategy.cp = 2;
  const planner::PlanPoints points = planner::plan_points(plan);
  REQUIRE(points.layers.size() == 3);
  for (const auto& [what, query] : points.layers) {
    INFO(what);
    CHECK(query.seq_len == 32);  // 64 tokens over two ranks, as the cost model asks the profile
  }
}

TEST_CASE("a plan whose threads per rank the profile lacks records one line per point",
          "[coverage]") {
  const profiles::ModelSpec model = profiles::load_model("tiny-bert");
  profiles::Profile two_threads = layers_at(model, 2);
  two_threads.optimizer = {{1'000'000, 2, 0.004, false}};
  planner::Plan plan = dp2_plan(two_threads);
  const double predicted_s = plan.predicted.step_time_s;
  plan.extrapolated = planner::extrapolated_points(plan);
  // Three layer kinds scaled by threads, the optimizer's other loop and threads, and the two
  // collectives on the cluster's link (the profile has no links).
  REQUIRE(plan.extrapolated.size() == 6);
  CHECK(plan.extrapolated[0].text() ==
        "embedding b=8 s=64 tp=1 recompute=none threads=1: threads scaled from b=8 s=64 tp=1 "
        "recompute=none threads=2 (times roofline here / roofline there)");
  CHECK(plan.extrapolated[1].how == "threads scaled");
  CHECK(plan.extrapolated[2].what == "head");
  CHECK(plan.extrapolated[3].what == "optimizer");
  CHECK(plan.extrapolated[3].how == "scaled");
  CHECK(plan.extrapolated[4].what == "allreduce over dp");
  CHECK(plan.extrapolated[4].how == "cluster link");
  CHECK(plan.extrapolated[5].what == "allreduce over world");
  CHECK(plan.predicted.step_time_s == predicted_s);

  // Written as "extrapolated" and read back.
  const nlohmann::json j = planner::plan_to_json(plan);
  REQUIRE(j.at("extrapolated").size() == 6);
  CHECK(j.at("extrapolated")[4].at("how") == "cluster link");
  const planner::Plan back = planner::plan_from_json(j, "plan.json");
  CHECK(back.extrapolated == plan.extrapolated);
}

TEST_CASE("a plan whose points are all measured gets no line", "[coverage]") {
  const profiles::ModelSpec model = profiles::load_model("tiny-bert");
  profiles::Profile p = layers_at(model, 1);
  p.optimizer = {{1'000'000, 1, 0.006, true}};
  for (const costmodel::LinkQuery& q : planner::plan_points(dp2_plan(p)).links) {
    p.links.push_back({costmodel::profile_name(q.collective), q.ranks, q.bytes, 1e-3, q.scope});
  }
  planner::Plan plan = dp2_plan(p);
  CHECK(planner::extrapolated_points(plan).empty());
  // Without a profile there is nothing to say, and no key.
  plan.profile = nullptr;
  CHECK(planner::extrapolated_points(plan).empty());
  CHECK_FALSE(planner::plan_to_json(plan).contains("extrapolated"));
}
