// End-to-end tests of the `loom` binary (docs/README.md): exit codes, stdout and stderr.
//
// Every command runs in a fresh temporary folder, so relative paths such as "nope/model.json" and
// outputs such as PLAN.json never touch the source tree.
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>

#include "profiles/loader.hpp"
#include "tests/tools/cli_sandbox.hpp"
#include "tools/commands.hpp"
#include "tools/stderr_filter.hpp"

namespace fs = std::filesystem;
using Catch::Contains;
using Catch::StartsWith;

namespace {

using RunResult = loom::test::CliResult;
using loom::test::read_all;

// A temporary folder for one test, removed at the end (tests/tools/cli_sandbox.hpp).
class Sandbox : public loom::test::CliSandbox {
 public:
  Sandbox() : CliSandbox("test-cli") {}
};

const std::string kBertPlan =
    "plan --model bert-large --cluster dgx-a100-80g --global-batch 512 --seq-len 512 --tp 8 "
    "--pp 1 --zero 1 --micro-batch 4 --schedule 1f1b --recompute selective --sp off";

using loom::test::line_count;

// Bad input: exit code 2, nothing on stdout, one line on stderr "loom plan: error: ...".
void require_plan_error(const RunResult& r) {
  INFO("stdout: " << r.out);
  INFO("stderr: " << r.err);
  CHECK(r.exit_code == 2);
  CHECK(r.out.empty());
  CHECK(line_count(r.err) == 1);
  CHECK_THAT(r.err, StartsWith("loom plan: error: "));
}

}  // namespace

TEST_CASE("loom demo plans a small encoder on this machine", "[tools][cli]") {
  Sandbox box;
  RunResult r = box.loom("demo");
  INFO("stderr: " << r.err);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.out, Contains("step time"));
  CHECK_THAT(r.out, Contains("tiny-bert"));
  CHECK(r.err.empty());
  // The commands it prints as its equivalent: the plan over the ranks it trains on, and a launch
  // of that many ranks with its data and settings.
  const std::string plan =
      "plan --model tiny-bert --cluster local-cpu --gpus 2 --global-batch 16 --seq-len 64 "
      "--precision fp32 --micro-batch 8 -o plan.json";
  CHECK_THAT(r.out,
             Contains("\nequivalent:\n  loom " + plan +
                      "\n  loom launch --nproc 2 -- loom train plan.json --data synthetic:1200 "
                      "--validation-fraction 0.2 --steps 80 --lr 0.001 --warmup-steps 4 "
                      "--eval-every 40\n"));
  CHECK_THAT(r.out, Contains("training 80 steps on 2 ranks, 960 synthetic reviews (240 held out)"));
  // That plan command plans what the demo ran.
  auto strategy_line = [](const std::string& text) {
    const std::size_t at = text.find("\nstrategy ");
    return at == std::string::npos ? std::string()
                                   : text.substr(at + 1, text.find('\n', at + 1) - at - 1);
  };
  const RunResult planned = box.loom(plan);
  REQUIRE(planned.exit_code == 0);
  CHECK(strategy_line(planned.out) ==
        "strategy dp=2 tp=1 pp=1 zero=1 micro-batch=8 micro-batches=1 recompute=none "
        "attention=math");
  CHECK(strategy_line(planned.out) == strategy_line(r.out));
}

TEST_CASE("loom plan --json prints one JSON document", "[tools][cli]") {
  Sandbox box;
  RunResult r = box.loom(kBertPlan + " --json");
  INFO("stderr: " << r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.err.empty());
  nlohmann::json doc;
  REQUIRE_NOTHROW(doc = nlohmann::json::parse(r.out));
  CHECK(doc.at("searched") == 1);
  CHECK(doc.at("feasible") == 1);
  CHECK(doc.at("search_time_s").is_number());
  REQUIRE(doc.at("plans").is_array());
  REQUIRE(doc.at("plans").size() == 1);
  const nlohmann::json& plan = doc["plans"][0];
  CHECK(plan.at("format") == "loom-plan/1");
  CHECK(plan.at("model").at("name") == "bert-large");
  CHECK(plan.at("cluster").at("name") == "dgx-a100-80g");
  CHECK(plan.at("job").at("global_batch") == 512);
  CHECK(plan.at("job").at("seq_len") == 512);
  const nlohmann::json& s = plan.at("strategy");
  CHECK(s.at("dp") == 4);
  CHECK(s.at("tp") == 8);
  CHECK(s.at("pp") == 1);
  CHECK(s.at("zero") == 1);
  CHECK(s.at("micro_batch") == 4);
  CHECK(s.at("num_micro_batches") == 512 / (4 * 4));
  CHECK(s.at("schedule") == "1f1b");
  CHECK(s.at("recompute") == "selective");
  CHECK(plan.at("ranks").size() == 32);
  const nlohmann::json& p = plan.at("predicted");
  CHECK(p.at("source") == "simulation");
  CHECK(p.at("step_time_s").get<double>() > 0);
  CHECK(p.at("peak_memory_bytes").get<double>() > 0);
  CHECK(p.at("peak_memory_bytes").get<double>() < 85899345920.0);
  CHECK(p.at("mfu").get<double>() > 0);
  CHECK(p.at("mfu").get<double>() < 1);
}

TEST_CASE("loom plan prints a readable plan by default", "[tools][cli]") {
  Sandbox box;
  RunResult r = box.loom(kBertPlan);
  INFO("stderr: " << r.err);
  CHECK(r.exit_code == 0);
  CHECK(r.err.empty());
  CHECK_THAT(r.out, Contains("step time"));
  CHECK_THAT(r.out, Contains("bert-large"));
  CHECK_FALSE(nlohmann::json::accept(r.out));  // text, not JSON
}

TEST_CASE("loom plan -o writes the plan file", "[tools][cli]") {
  Sandbox box;
  RunResult r = box.loom(kBertPlan + " -o PLAN.json");
  INFO("stderr: " << r.err);
  REQUIRE(r.exit_code == 0);
  REQUIRE(fs::exists(box.work() / "PLAN.json"));
  nlohmann::json plan;
  REQUIRE_NOTHROW(plan = nlohmann::json::parse(read_all(box.work() / "PLAN.json")));
  CHECK(plan.at("format") == "loom-plan/1");
  CHECK(plan.at("strategy").at("dp") == 4);
  CHECK(plan.at("strategy").at("tp") == 8);
  CHECK(plan.at("predicted").at("source") == "simulation");
  // Written through a temporary file and a rename: nothing else is left behind.
  std::size_t files = 0;
  for (const auto& entry : fs::directory_iterator(box.work())) {
    CAPTURE(entry.path().string());
    ++files;
  }
  CHECK(files == 1);
}

TEST_CASE("loom plan --help", "[tools][cli]") {
  Sandbox box;
  RunResult r = box.loom("plan --help");
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.out, Contains("--model"));
  CHECK_THAT(r.out, Contains("--global-batch"));
  CHECK(r.err.empty());
}

TEST_CASE("loom plan: unknown model name", "[tools][cli][errors]") {
  Sandbox box;
  RunResult r = box.loom(
      "plan --model bert-huge --cluster dgx-a100-80g --global-batch 512 --seq-len 512 --tp 8 "
      "--pp 1 --zero 1 --micro-batch 4");
  require_plan_error(r);
  CHECK_THAT(r.err, Contains("--model") && Contains("bert-huge"));
  for (const std::string& name : loom::profiles::builtin_model_names()) {
    CHECK_THAT(r.err, Contains(name));
  }
}

TEST_CASE("loom plan: missing model file", "[tools][cli][errors]") {
  Sandbox box;
  RunResult r = box.loom(
      "plan --model nope/model.json --cluster dgx-a100-80g --global-batch 512 --seq-len 512 "
      "--tp 8 --pp 1 --zero 1 --micro-batch 4");
  require_plan_error(r);
  CHECK_THAT(r.err, Contains("nope/model.json") && Contains("cannot read"));
}

TEST_CASE("loom plan: model file with bad JSON", "[tools][cli][errors]") {
  Sandbox box;
  box.write("model.json", "{\n  \"format\": \"loom-model/1\",\n  \"name\": bert\n}\n");
  RunResult r = box.loom(
      "plan --model model.json --cluster dgx-a100-80g --global-batch 512 --seq-len 512 --tp 8 "
      "--pp 1 --zero 1 --micro-batch 4");
  require_plan_error(r);
  CHECK_THAT(r.err, Contains("model.json") && Contains("not valid JSON") && Contains("line 3"));
}

TEST_CASE("loom plan: model file with a bad field", "[tools][cli][errors]") {
  Sandbox box;
  nlohmann::json model = nlohmann::json::parse(R"({
    "format": "loom-model/1", "name": "m", "family": "encoder", "layers": 4, "hidden": 256,
    "heads": 3, "ffn_hidden": 1024, "vocab": 1000, "max_positions": 128})");
  box.write("m.json", model.dump(2));
  RunResult r = box.loom(
      "plan --model m.json --cluster dgx-a100-80g --global-batch 512 --seq-len 128 --tp 8 "
      "--pp 1 --zero 1 --micro-batch 4");
  require_plan_error(r);
  CHECK_THAT(r.err, Contains("m.json") && Contains("$.heads") && Contains("divisor"));
}

TEST_CASE("loom plan: unknown flag", "[tools][cli][errors]") {
  Sandbox box;
  RunResult r = box.loom(kBertPlan + " --frobnicate");
  require_plan_error(r);
  CHECK_THAT(r.err, Contains("--frobnicate"));
}

TEST_CASE("a misspelt flag is named, with the nearest real one", "[tools][cli][errors]") {
  Sandbox box;
  // Before the required --global-batch is reported missing: its misspelling is the cause.
  RunResult r =
      box.loom("plan --model bert-large --cluster dgx-a100-80g --global-bach 512 --seq-len 512");
  require_plan_error(r);
  CHECK_THAT(r.err, Contains("unknown option --global-bach; did you mean --global-batch?"));
  r = box.loom(
      "plan --model bert-large --cluster dgx-a100-80g --gpu 2 --global-batch 8 "
      "--seq-len 128");
  require_plan_error(r);
  CHECK_THAT(r.err, Contains("unknown option --gpu; did you mean --gpus?"));
  r = box.loom(
      "plan --model bert-large --cluster dgx-a100-80g --global-batch=8 --seq-len 128 "
      "--tensor-parallel 2");
  require_plan_error(r);
  CHECK_THAT(r.err, Contains("unknown option --tensor-parallel") && !Contains("did you mean"));
  // Commands of the LibTorch binary check the same way; flags after -- belong to the command
  // that loom launch starts.
  r = box.loom("train plan.json --data synthetic:40 --step 3");
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.err, StartsWith("loom train: error: unknown option --step; did you mean --steps?"));
  r = box.loom("launch --nproc 1 -- loom train nope.json --data synthetic:40 --steps 1");
  CHECK_THAT(r.err, !Contains("unknown option"));
}

TEST_CASE("loom plan: tensor parallelism that does not divide the heads", "[tools][cli][errors]") {
  Sandbox box;
  // 3 nodes x 8 = 24 devices, so tp=3 leaves dp=8 and only the model is at fault.
  RunResult r = box.loom(
      "plan --model bert-large --cluster dgx-a100-80g --nodes 3 --global-batch 512 --seq-len 512 "
      "--tp 3 --pp 1 --zero 1 --micro-batch 4");
  require_plan_error(r);
  CHECK_THAT(r.err, Contains("tp=3") && Contains("16") && Contains("heads"));
}

// On 32 devices tp=3 also fails to divide the device count; the command reports that first
// ("--dp: cannot be derived"), although no device count makes tp=3 work for 16 heads.
TEST_CASE("loom plan: --tp 3 for bert-large on 32 devices names the heads",
          "[tools][cli][errors]") {
  Sandbox box;
  RunResult r = box.loom(
      "plan --model bert-large --cluster dgx-a100-80g --global-batch 512 --seq-len 512 --tp 3 "
      "--pp 1 --zero 1 --micro-batch 4");
  require_plan_error(r);
  CHECK_THAT(r.err, Contains("heads"));
}

TEST_CASE("loom plan: ZeRO stage out of range", "[tools][cli][errors]") {
  Sandbox box;
  RunResult r = box.loom(
      "plan --model bert-large --cluster dgx-a100-80g --global-batch 512 --seq-len 512 --tp 8 "
      "--pp 1 --zero 7 --micro-batch 4");
  require_plan_error(r);
  CHECK_THAT(r.err, Contains("--zero") && Contains("7"));
}

TEST_CASE("loom plan: global batch not divisible", "[tools][cli][errors]") {
  Sandbox box;
  RunResult r = box.loom(
      "plan --model bert-large --cluster dgx-a100-80g --global-batch 510 --seq-len 512 --tp 8 "
      "--pp 1 --zero 1 --micro-batch 4");
  require_plan_error(r);
  CHECK_THAT(r.err, Contains("--global-batch") && Contains("16") && Contains("510"));
}

TEST_CASE("loom plan: a single-node cluster asked for two nodes", "[tools][cli][errors]") {
  Sandbox box;
  RunResult r = box.loom(
      "plan --model bert-base --cluster h100-x1 --nodes 2 --global-batch 8 --seq-len 128 --tp 1 "
      "--pp 1 --zero 0 --micro-batch 4");
  require_plan_error(r);
  CHECK_THAT(r.err, Contains("--nodes") && Contains("inter_node"));
}

TEST_CASE("loom plan: a strategy that does not fit in memory", "[tools][cli][errors]") {
  Sandbox box;
  RunResult r = box.loom(
      "plan --model gpt3-175b --cluster h100-x1 --tp 1 --pp 1 --zero 0 --micro-batch 1 "
      "--global-batch 1 --seq-len 2048 -o PLAN.json");
  require_plan_error(r);
  CHECK_THAT(r.err, Contains("does not fit") && Contains("GiB"));
  CHECK_FALSE(fs::exists(box.work() / "PLAN.json"));  // nothing half-written
}

TEST_CASE("loom plan --stages pins the seed's naive split", "[tools][cli]") {
  Sandbox box;
  RunResult r = box.loom(
      "plan --model bert-base --cluster v100-32g-2x-pcie --global-batch 32 --seq-len 512 "
      "--precision fp16 --stages 0-0,1-13 --micro-batch 32 --zero 0 --recompute none --json");
  INFO("stderr: " << r.err);
  REQUIRE(r.exit_code == 0);
  nlohmann::json doc = nlohmann::json::parse(r.out);
  const nlohmann::json& plan = doc.at("plans").at(0);
  CHECK(plan.at("strategy").at("pp") == 2);
  CHECK(plan.at("stages").at(0).at("last_layer") == 0);
  CHECK(plan.at("stages").at(1).at("first_layer") == 1);
  CHECK(plan.at("stages").at(1).at("last_layer") == 13);
  CHECK(doc.at("evaluated").get<int>() <= doc.at("searched").get<int>());
}

TEST_CASE("loom plan refuses a malformed or impossible --stages", "[tools][cli]") {
  Sandbox box;
  const std::string base =
      "plan --model bert-base --cluster v100-32g-2x-pcie --global-batch 32 --seq-len 512 ";
  RunResult syntax = box.loom(base + "--stages 0-0,1");
  require_plan_error(syntax);
  CHECK_THAT(syntax.err, Contains("--stages"));
  RunResult coverage = box.loom(base + "--stages 0-0,1-12");
  require_plan_error(coverage);
  CHECK_THAT(coverage.err, Contains("--stages") && Contains("0..13"));
  RunResult count = box.loom(base + "--stages 0-0,1-13 --pp 1");
  require_plan_error(count);
  CHECK_THAT(count.err, Contains("--pp"));
}

TEST_CASE("loom simulate plays a plan and writes a Chrome trace", "[tools][cli]") {
  Sandbox box;
  REQUIRE(box.loom("plan --model bert-large --cluster dgx-a100-80g --global-batch 512 --seq-len "
                   "512 --tp 2 --pp 2 -o plan.json")
              .exit_code == 0);
  RunResult r = box.loom("simulate plan.json --trace trace.json");
  INFO("stderr: " << r.err);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.out, Contains("step time") && Contains("events in"));
  nlohmann::json trace = nlohmann::json::parse(read_all(box.work() / "trace.json"));
  std::set<int> ranks;
  for (const nlohmann::json& e : trace.at("traceEvents")) {
    if (e.at("ph") == "M" && e.at("name") == "process_name") ranks.insert(e.at("pid").get<int>());
  }
  CHECK(ranks.size() == 32);
  RunResult j = box.loom("simulate plan.json --json");
  REQUIRE(j.exit_code == 0);
  nlohmann::json predicted = nlohmann::json::parse(j.out);
  CHECK(predicted.at("source") == "simulation");
  CHECK(predicted.at("step_time_s").get<double>() > 0);
  box.write("bad.json", "{\"format\": \"loom-plan/1\"}");
  RunResult bad = box.loom("simulate bad.json");
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.err, StartsWith("loom simulate: error: bad.json: $.loom_version"));
}

// Gloo's per-group INFO line (verbatim from Debian's libgloo 2025-09) is dropped; everything else,
// its warnings and loom's own "[rank N]" lines included, passes unchanged and in order, and a
// progress line rewritten with '\r' passes at once, before its line ends.
TEST_CASE("the stderr filter drops Gloo's INFO lines and nothing else", "[tools][cli]") {
  std::ostringstream err;
  {
    const loom::tools::GlooInfoFilter filter(err);
    err << "[./gloo/transport/tcp/context.cc:243] INFO Rank 0 is connected to 1. Expected "
           "number of connected peers is: 1\n";
    err << "\r[#####] step 3/10" << std::flush;
    CHECK(err.str() == "\r[#####] step 3/10");
    err << "\n[rank 1] loom train: error: lost rank 0\n";
    err << "[gloo/transport/tcp/pair.cc:538] WARN Read error\n";
    err << "[./gloo/transport/tcp/context.cc:243] INFO Rank 1 is connected to 1.\n";
    err << "[held";
    CHECK(err.str().find("[held") == std::string::npos);
  }
  CHECK(err.str() ==
        "\r[#####] step 3/10\n[rank 1] loom train: error: lost rank 0\n"
        "[gloo/transport/tcp/pair.cc:538] WARN Read error\n[held");
  CHECK(loom::tools::GlooInfoFilter::is_gloo_info("[gloo/x.cc:1] INFO y"));
  CHECK_FALSE(loom::tools::GlooInfoFilter::is_gloo_info("[rank 0] gloo/x.cc INFO y"));
  CHECK_FALSE(loom::tools::GlooInfoFilter::is_gloo_info("[gloo/x.cc:1] ERROR y"));
}

TEST_CASE("An error message is printed as one line", "[tools][cli][errors]") {
  using loom::tools::one_line;
  CHECK(one_line("--model: \"a\nb\" is not a model") == "--model: \"a<U+000A>b\" is not a model");
  CHECK(one_line("tab\there, bell\x07") == "tab<U+0009>here, bell<U+0007>");
  // LibTorch's errors carry a backtrace after the message.
  CHECK(one_line("dropout probability has to be between 0 and 1, but got nan\nException raised "
                 "from _dropout_impl at ...\nframe #0: ...") ==
        "dropout probability has to be between 0 and 1, but got nan");
  CHECK(one_line("cannot write x\n\n") == "cannot write x");
  CHECK(one_line("plain") == "plain");
}
