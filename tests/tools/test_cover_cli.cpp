// A profile that covers the plan, end to end on this machine's CPU: loom plan, simulate and
// validate say each point a profile lacks (here a dp=2 plan's one thread per rank against a
// profile taken at two), and loom profile --for measures exactly the plan's points, after which
// nothing is left to say.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "costmodel/layers.hpp"
#include "profiles/loader.hpp"
#include "profiles/profile.hpp"
#include "tests/tools/cli_sandbox.hpp"

using Catch::Contains;
using loom::test::CliResult;
using loom::test::CliSandbox;
using nlohmann::json;

namespace {

const char* const kDp2Plan =
    "plan --model tiny-bert --cluster local-cpu --global-batch 8 --seq-len 16 --precision fp32 "
    "--dp 2 --tp 1 --pp 1 --zero 0 --micro-batch 4";

const char* const kLayerLine =
    "extrapolated: encoder layer b=4 s=16 tp=1 recompute=none threads=1: threads scaled from "
    "b=4 s=16 tp=1 recompute=none threads=2";

}  // namespace

TEST_CASE(
    "plan, simulate and validate say the points a profile lacks, and a profile made with --for "
    "none",
    "[tools][profile][cover]") {
  CliSandbox box("cover");
  REQUIRE(box.loom("profile --model tiny-bert --seq-len 16 --micro-batch 4 --threads 2 "
                   "--repeats 2 -o two-threads.json")
              .exit_code == 0);
  const CliResult planned =
      box.loom(std::string(kDp2Plan) + " --profile two-threads.json -o p.json");
  INFO(planned.err);
  REQUIRE(planned.exit_code == 0);
  CHECK_THAT(planned.err, Contains(kLayerLine));
  // The embedding, the layer, the head, the optimizer's flat loop at one thread, and the two
  // collectives on the cluster's link (no link measured).
  const json plan = json::parse(box.read("p.json"));
  REQUIRE(plan.at("extrapolated").size() == 6);
  CHECK(plan.at("extrapolated")[1].at("how") == "threads scaled");
  CHECK(plan.at("extrapolated")[3].at("what") == "optimizer");
  CHECK(plan.at("extrapolated")[4].at("how") == "cluster link");

  const CliResult simulated = box.loom("simulate p.json --profile two-threads.json --json");
  REQUIRE(simulated.exit_code == 0);
  CHECK_THAT(simulated.err, Contains(kLayerLine));
  CHECK(json::parse(simulated.out).at("extrapolated") == plan.at("extrapolated"));

  // Exactly the plan's points, measured by its two ranks side by side.
  const CliResult profiled = box.loom("profile --for p.json --repeats 2 -o for.json");
  INFO(profiled.err);
  REQUIRE(profiled.exit_code == 0);
  const loom::profiles::Profile p =
      loom::profiles::load_profile((box.work() / "for.json").string());
  REQUIRE(p.layers.size() == 3);  // embedding, layer, head at b=4 s=16 with 1 thread
  for (const auto& m : p.layers) {
    CHECK(m.micro_batch == 4);
    CHECK(m.seq_len == 16);
    CHECK(m.threads == 1);
  }
  REQUIRE(p.optimizer.size() == 1);  // the flat loop of several ranks
  CHECK(p.optimizer[0].flat);
  // The gradient's all-reduce and the step statistics' (520 bytes) over the two ranks.
  REQUIRE(p.links.size() == 2);
  CHECK(p.links[0].bytes == 520);
  CHECK(p.links[0].collective == "allreduce");

  const CliResult validated =
      box.loom("validate p.json --profile for.json --steps 3 --warmup 1 --json");
  INFO(validated.err);
  REQUIRE(validated.exit_code == 0);
  CHECK_THAT(validated.err, !Contains("extrapolated:"));
  CHECK(json::parse(validated.out).at("extrapolated") == json::array());

  // The options that choose points are the plan's to choose.
  const CliResult both = box.loom("profile --for p.json --model tiny-bert -o x.json");
  CHECK(both.exit_code == 2);
}

TEST_CASE("loom profile --for a tp plan times its ranks' layers together, as one chain",
          "[tools][profile][cover]") {
  CliSandbox box("cover-tp");
  REQUIRE(box.loom("plan --model tiny-bert --cluster local-cpu --global-batch 8 --seq-len 16 "
                   "--precision fp32 --dp 1 --tp 2 --pp 1 --micro-batch 4 -o tp.json")
              .exit_code == 0);
  const CliResult profiled = box.loom("profile --for tp.json --repeats 2 -o for.json");
  INFO(profiled.err);
  REQUIRE(profiled.exit_code == 0);
  const loom::profiles::Profile p =
      loom::profiles::load_profile((box.work() / "for.json").string());
  REQUIRE(p.layers.size() == 3);
  const loom::profiles::LayerMeasurement& layer = p.layers[1];
  REQUIRE(layer.kind == loom::profiles::LayerKind::kEncoderLayer);
  CHECK(layer.tp == 2);
  CHECK(layer.tp_communication);
  CHECK(layer.chained_layers == 4);  // tiny-bert's 4 layers
  CHECK(p.layers[0].chained_layers == 1);
  // The chain is reported per layer: one layer's shard of fp32 parameters, as the cost model
  // counts it, and about one layer's kept activations at tp=2.
  const loom::profiles::ModelSpec tiny = loom::profiles::load_model("tiny-bert");
  const auto counts = loom::costmodel::count_parameters(tiny);
  CHECK(layer.parameter_bytes == loom::costmodel::element_bytes(loom::costmodel::Precision::kFp32) *
                                     counts.transformer_layer.per_rank(2));
  loom::costmodel::ActivationShape shape{16, 4, tiny.hidden, tiny.heads, tiny.ffn_hidden, 4};
  const double formula = loom::costmodel::transformer_layer_activation_bytes(
      shape, 2, false, loom::costmodel::Recompute::kNone);
  CHECK(static_cast<double>(layer.activation_bytes) == Approx(formula).epsilon(0.3));
}

TEST_CASE("loom profile --for a recomputing plan measures its embedding and head too",
          "[tools][profile][cover]") {
  // Recomputation changes the transformer layers only: the profile measures the embedding and
  // the head without it, and the plan reads them as measured.
  CliSandbox box("cover-recompute");
  REQUIRE(box.loom("plan --model tiny-bert --cluster local-cpu --global-batch 8 --seq-len 16 "
                   "--precision fp32 --dp 1 --tp 1 --pp 1 --micro-batch 4 --recompute full "
                   "-o p.json")
              .exit_code == 0);
  const CliResult profiled = box.loom("profile --for p.json --repeats 2 -o for.json");
  INFO(profiled.err);
  REQUIRE(profiled.exit_code == 0);
  const loom::profiles::Profile p =
      loom::profiles::load_profile((box.work() / "for.json").string());
  REQUIRE(p.layers.size() == 3);
  CHECK(p.layers[0].kind == loom::profiles::LayerKind::kEmbedding);
  CHECK(p.layers[0].recompute == "none");
  CHECK(p.layers[1].recompute == "full");
  CHECK(p.layers[2].kind == loom::profiles::LayerKind::kHead);
  const CliResult simulated = box.loom("simulate p.json --profile for.json --json");
  INFO(simulated.err);
  REQUIRE(simulated.exit_code == 0);
  CHECK(json::parse(simulated.out).at("extrapolated") == json::array());
}
