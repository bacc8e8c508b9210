// End-to-end: a checkpoint of `loom launch` (dp2, two processes) resumed by `loom train` with a
// one-rank plan gives the one-rank run's losses; a plan whose devices cannot hold the model and
// another model are refused with one line.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tests/tools/cli_sandbox.hpp"

namespace fs = std::filesystem;
using Catch::Contains;
using loom::test::CliResult;
using loom::test::CliSandbox;

namespace {

std::string plan_args(int dp, const std::string& out) {
  return "plan --model tiny-bert --cluster local-cpu --global-batch 8 --seq-len 32 --dp " +
         std::to_string(dp) + " --tp 1 --pp 1 --zero 0 --micro-batch 2 --precision fp32 -o " + out;
}

const std::string kTrain = " --data synthetic:80 --dropout 0 --checkpoint ckpt --json";

}  // namespace

TEST_CASE("loom train --resume takes a dp2 launch's checkpoint into a one-rank plan",
          "[tools][reshard]") {
  const CliSandbox f("reshard");
  REQUIRE(f.loom(plan_args(2, "P2.json")).exit_code == 0);
  REQUIRE(f.loom(plan_args(1, "P1.json")).exit_code == 0);
  // Steps 1-2 of a 4-step run (its learning-rate schedule): the step-4 checkpoint removed.
  const CliResult first =
      f.loom("launch --nproc 2 --master-port " + loom::test::free_port() +
             " -- loom train P2.json --steps 4 --checkpoint-every 2 --comm-timeout 60" + kTrain);
  INFO("launch stderr: " << first.err);
  REQUIRE(first.exit_code == 0);
  REQUIRE(fs::exists(f.work() / "ckpt" / "step-00000002" / "rank-1.pt"));
  fs::remove_all(f.work() / "ckpt" / "step-00000004");

  {  // a plan whose devices cannot hold the model: refused with one line
    nlohmann::json plan = nlohmann::json::parse(loom::test::read_all(f.work() / "P1.json"));
    plan["cluster"]["device"]["memory_bytes"] = 50'000'000;
    std::ofstream(f.work() / "SMALL.json") << plan.dump(2);
    const CliResult r = f.loom("train SMALL.json --steps 4 --resume" + kTrain);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.err,
               Contains("SMALL.json") && Contains("pipeline stage 0 needs") && Contains("re-plan"));
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    CHECK_FALSE(fs::exists(f.work() / "ckpt" / "step-00000004"));
  }
  {  // another model: refused with one line
    nlohmann::json model = nlohmann::json::parse(
        loom::test::read_all(fs::path(LOOM_SOURCE_DIR) / "profiles/models/tiny-bert.json"));
    model["ffn_hidden"] = 256;
    std::ofstream(f.work() / "other-model.json") << model.dump(2);
    REQUIRE(f.loom("plan --model other-model.json --cluster local-cpu --global-batch 8 "
                   "--seq-len 32 --dp 1 --tp 1 --pp 1 --zero 0 --micro-batch 2 --precision fp32 "
                   "-o M.json")
                .exit_code == 0);
    const CliResult r = f.loom("train M.json --steps 4 --resume" + kTrain);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.err, Contains("trainer_state.json") && Contains("$.model"));
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  }
  {  // the checkpoint, untouched by the refusals, resumed in one rank
    const CliResult r = f.loom("train P1.json --steps 4 --resume" + kTrain);
    INFO("stderr: " << r.err);
    REQUIRE(r.exit_code == 0);
    const nlohmann::json summary = nlohmann::json::parse(r.out);
    CHECK(summary.at("resumed_from_step") == 2);
    REQUIRE(summary.at("losses").size() == 2);
    // As the one-rank run from the same seeded start, uninterrupted (no dropout).
    const CliResult whole =
        f.loom("train P1.json --steps 4 --data synthetic:80 --dropout 0 --json");
    REQUIRE(whole.exit_code == 0);
    const nlohmann::json losses = nlohmann::json::parse(whole.out).at("losses");
    REQUIRE(losses.size() == 4);
    for (int i = 0; i < 2; ++i) {
      const double expected = losses.at(i + 2).get<double>();
      CHECK(std::abs(summary.at("losses").at(i).get<double>() - expected) <=
            1e-5 * std::abs(expected));
    }
    // The one-rank checkpoint it wrote holds the Hugging Face model.
    CHECK(fs::exists(f.work() / "ckpt" / "step-00000004" / "model.safetensors"));
  }
}
