// loom tune end to end on this machine's CPUs: the top 2 plans of tiny-bert measured for 2 steps
// each through loom validate, the measured best written with its "tuned" record, --resume
// measuring nothing again, and bad arguments refused in one line.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/tools/cli_sandbox.hpp"

using loom::test::CliResult;
using loom::test::CliSandbox;
using loom::test::line_count;

namespace {

const std::string kTune =
    "tune --model tiny-bert --cluster local-cpu --global-batch 8 --seq-len 32";

}  // namespace

TEST_CASE("loom tune measures the top K, writes the measured best and resumes without running",
          "[tools][cli][tune]") {
  CliSandbox box("tune");
  const CliResult r = box.loom(kTune + " --top 2 --steps 2 --resume measured.json -o tuned.json");
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.err.find("measuring #1 of 2") != std::string::npos);
  CHECK(r.err.find("measuring #2 of 2") != std::string::npos);
  CHECK(r.out.find("regret of the predicted-first plan: ") != std::string::npos);
  CHECK(r.out.find("(each the median of steps 2-2;") != std::string::npos);
  const nlohmann::json plan = nlohmann::json::parse(box.read("tuned.json"));
  const nlohmann::json& tuned = plan.at("tuned");
  REQUIRE(tuned.at("candidates").size() == 2);
  CHECK(tuned.at("measured_rank") == 1);
  CHECK(tuned.at("steps") == 2);
  CHECK(tuned.at("warmup_steps") == 1);
  CHECK(tuned.at("measured_step_time_s").get<double>() > 0);
  const int best = tuned.at("predicted_rank").get<int>();
  CHECK(plan.at("strategy") == tuned.at("candidates")[best - 1].at("strategy"));
  // The tuned plan is a plan: loom simulate reads it.
  CHECK(box.loom("simulate tuned.json").exit_code == 0);

  // The measurements as the file has them, with #2 made the far faster: a resumed tune must pick
  // it from the file without running anything.
  nlohmann::json measured = nlohmann::json::parse(box.read("measured.json"));
  REQUIRE(measured.at("measurements").size() == 2);
  measured["measurements"][0]["step_time_s"] = 0.5;
  measured["measurements"][1]["step_time_s"] = 0.25;
  box.write("measured.json", measured.dump());
  const CliResult again =
      box.loom(kTune + " --top 2 --steps 2 --resume measured.json -o again.json");
  INFO(again.err);
  REQUIRE(again.exit_code == 0);
  CHECK(again.err.find("measuring") == std::string::npos);
  CHECK(again.out.find("(from --resume)") != std::string::npos);
  // (0.5 - 0.25) / 0.25 = 100 %.
  CHECK(again.out.find("regret of the predicted-first plan: 100.0 % (it measured 0.5000 s, the "
                       "best 0.2500 s)") != std::string::npos);
  const nlohmann::json again_plan = nlohmann::json::parse(box.read("again.json"));
  const nlohmann::json& retuned = again_plan.at("tuned");
  CHECK(retuned.at("predicted_rank") == 2);
  CHECK(retuned.at("regret").get<double>() == 1.0);

  // Measurements of another setting are refused, not mixed in.
  const CliResult other = box.loom(kTune + " --top 2 --steps 3 --resume measured.json");
  INFO(other.err);
  CHECK(other.exit_code == 2);
  CHECK(line_count(other.err) == 1);
  CHECK(other.err.find("loom tune: error: measured.json: $.setting: ") == 0);
}

TEST_CASE("loom tune lists a candidate that fails with its reason", "[tools][cli][tune]") {
  // LibTorch 1.13 on CPUs has no fused attention: loom train refuses a flash plan, so every
  // candidate fails and nothing is written.
  CliSandbox box("tune-fails");
  const CliResult r = box.loom(kTune + " --top 2 --steps 2 --attention flash -o tuned.json");
  if (r.exit_code == 0) return;  // a LibTorch 2 build runs it
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("  failed: ") != std::string::npos);
  CHECK(r.err.find("loom tune: error: no candidate ran (#1: ") != std::string::npos);
  CHECK(box.read("tuned.json").empty());
}

TEST_CASE("loom tune refuses bad arguments in one line", "[tools][cli][tune][errors]") {
  CliSandbox box("tune-errors");
  const struct {
    std::string args;
    std::string error;
  } rows[] = {
      {kTune + " --steps 2 --top 0", "loom tune: error: --top: expected a number > 0, found 0"},
      {kTune + " --top 2 --steps 2 --warmup 2",
       "loom tune: error: --warmup: fewer warm-up steps than --steps (2)"},
      {kTune + " --steps x", "loom tune: error: --steps: expected a number > 0, found \"x\""},
      {"tune --cluster local-cpu --global-batch 8 --seq-len 32",
       "loom tune: error: --model is "
       "required"},
  };
  for (const auto& row : rows) {
    const CliResult r = box.loom(row.args);
    INFO(row.args << "\n" << r.err);
    CHECK(r.exit_code == 2);
    CHECK(line_count(r.err) == 1);
    CHECK(r.err.rfind(row.error, 0) == 0);
    CHECK(r.out.empty());
  }
}
