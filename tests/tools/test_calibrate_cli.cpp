// loom calibrate (docs/calibrate.md): bad rows of RUNS one line each, exit 2 when nothing is
// usable, and a calibrated cluster that loom reads back with its record.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>

#include "profiles/loader.hpp"
#include "tests/tools/cli_sandbox.hpp"

using Catch::Contains;

namespace {

class Sandbox : public loom::test::CliSandbox {
 public:
  Sandbox() : CliSandbox("test-calibrate") {}
};

// One 8-GPU MPT row on A100 80GB as published (bench/published/mpt_llm_foundry.json).
const std::string kRow =
    R"j({"id": "mpt-a100-80-1b-s2048-g8-mb8-ga4", "model": {"name": "MPT-1b", "family": )j"
    R"j("decoder", "layers": 24, "hidden": 2048, "heads": 16, "ffn_hidden": 8192, "vocab": )j"
    R"j(50368, "seq_len": 2048}, "gpus": 8, "gpu": "A100-80GB", "dp": 8, "tp": 1, "pp": 1, )j"
    R"j("zero": 3, "micro_batch": 8, "grad_accum": 4, "global_batch": 256, "precision": )j"
    R"j("bf16", "recompute": "none", "attention": "flash", "framework": "MosaicML Composer + )j"
    R"j(PyTorch FSDP (llm-foundry)", "measured": {"tokens_per_s_per_gpu": 21000}})j";

}  // namespace

TEST_CASE("calibrate lists each bad row and fails when none is usable", "[calibrate]") {
  Sandbox box;
  box.write("runs.jsonl", std::string(R"({"id": "x", "gpu": "TPU"})") + "\n{bad\n" +
                              R"({"measured": {"step_time_s": 0.5}})" + "\n");
  const auto r = box.loom("calibrate runs.jsonl --cluster dgx-a100-80g -o out.json");
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.out, Contains("skipped 3 rows:\n"));
  CHECK_THAT(r.out, Contains("  runs.jsonl line 1 (x): neither a published row"));
  CHECK_THAT(r.out, Contains("  runs.jsonl line 2: runs.jsonl: not valid JSON"));
  CHECK_THAT(r.out, Contains("  runs.jsonl line 3: a loom validate record without its plan"));
  CHECK(r.err ==
        "loom calibrate: error: runs.jsonl: expected at least one usable measured row for "
        "A100-SXM4-80GB (3 skipped, reasons above)\n");
  CHECK_FALSE(std::filesystem::exists(box.work() / "out.json"));
}

TEST_CASE("calibrate writes a cluster loom plans with, with its record", "[calibrate]") {
  Sandbox box;
  box.write("runs.json", "[" + kRow + "]");
  const auto r =
      box.loom("calibrate runs.json --cluster dgx-a100-80g -o a100.json --date 2026-11-25");
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.out, Contains("on 1 usable rows of 1 file\n"));
  CHECK_THAT(r.out, Contains("device.fragmentation"));
  CHECK_THAT(r.out, Contains("not informed"));
  CHECK_THAT(r.out, Contains("\nwrote a100.json\n"));
  const nlohmann::json cluster = nlohmann::json::parse(box.read("a100.json"));
  const nlohmann::json& record = cluster.at("calibration");
  CHECK(record.at("rows") == 1);
  CHECK(record.at("files") == nlohmann::json::array({"runs.json"}));
  CHECK(record.at("date") == "2026-11-25");
  CHECK(record.at("parameters").at("device.achievable_tflops.bf16").at("start") == 271.2);
  const auto plan = box.loom(
      "plan --model gpt2 --cluster a100.json --gpus 8 --global-batch 16 --seq-len 1024 -o p.json");
  CHECK(plan.exit_code == 0);
}

TEST_CASE("calibrate --runtime writes a calibration that loom plan applies by name",
          "[calibrate]") {
  Sandbox box;
  box.write("runs.json", "[" + kRow + "]");  // a Composer (FSDP) row on A100 80GB
  const auto r = box.loom(
      "calibrate runs.json --cluster dgx-a100-80g --runtime fsdp --name mine -o mine.json "
      "--stack \"Composer FSDP\" --date 2026-12-06");
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.out,
             Contains("wrote mine.json (calibration mine of runtime fsdp on A100-SXM4-80GB)"));
  const nlohmann::json c = nlohmann::json::parse(box.read("mine.json"));
  CHECK(c.at("format") == "loom-calibration/1");
  CHECK(c.at("runtime") == "fsdp");
  CHECK(c.at("device") == "A100-SXM4-80GB");
  CHECK(c.at("stack") == "Composer FSDP");
  CHECK(c.at("record").at("rows") == 1);
  // Fitted from the hardware values: the GEMM ceiling's start is the file's 271.2, and the value
  // stays inside its 0.9-1.1 range.
  const nlohmann::json& bf16 = c.at("record").at("parameters").at("device.achievable_tflops.bf16");
  CHECK(bf16.at("start") == 271.2);
  CHECK(c.at("parameters").at("device.achievable_tflops.bf16") >= 0.9 * 271.2 - 0.05);
  const std::string plan =
      "plan --model gpt2 --cluster dgx-a100-80g --gpus 8 --global-batch 16 --seq-len 1024 ";
  const auto fsdp = box.loom(plan + "--runtime fsdp --calibration mine.json");
  INFO(fsdp.err);
  CHECK(fsdp.exit_code == 0);
  CHECK_THAT(fsdp.out, Contains("\ncalibration mine\n"));
  // Without --calibration the shipped one of the runtime and device; none for Megatron-LM there.
  CHECK_THAT(box.loom(plan + "--runtime fsdp").out, Contains("\ncalibration fsdp-a100-80g\n"));
  CHECK_THAT(box.loom(plan + "--runtime megatron").out,
             Contains("\ncalibration none: the cluster's hardware values alone\n"));
  const auto other = box.loom(plan + "--runtime megatron --calibration mine.json");
  CHECK(other.exit_code == 2);
  CHECK(other.err ==
        "loom plan: error: --calibration: a calibration of the plan's runtime, megatron "
        "(--runtime), or none; mine is of runtime fsdp\n");
}

TEST_CASE("calibrate refuses a malformed date", "[calibrate]") {
  Sandbox box;
  box.write("runs.json", "[" + kRow + "]");
  const auto r = box.loom("calibrate runs.json --cluster dgx-a100-80g -o a.json --date 25/11/2026");
  CHECK(r.exit_code == 2);
  CHECK(r.err == "loom calibrate: error: --date: expected YYYY-MM-DD, found 25/11/2026\n");
}

TEST_CASE("calibrate keeps --fix parameters and refuses an unknown name", "[calibrate]") {
  Sandbox box;
  box.write("runs.json", "[" + kRow + "]");
  const auto r = box.loom(
      "calibrate runs.json --cluster dgx-a100-80g -o a.json --fix device.achievable_tflops.bf16");
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.out, Contains("fixed\n"));
  const nlohmann::json cluster = nlohmann::json::parse(box.read("a.json"));
  const nlohmann::json& bf16 =
      cluster.at("calibration").at("parameters").at("device.achievable_tflops.bf16");
  CHECK(bf16.at("fixed") == true);
  // The shipped file's value, which one row would otherwise move.
  const double shipped = loom::profiles::load_cluster("dgx-a100-80g").device.achievable_tflops.bf16;
  CHECK(bf16.at("value") == shipped);
  CHECK(cluster.at("device").at("achievable_tflops").at("bf16") == shipped);
  const auto bad = box.loom("calibrate runs.json --cluster dgx-a100-80g -o b.json --fix bf16");
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.err, Contains("loom calibrate: error: --fix: a parameter of dgx-a100-80g ("));
  CHECK_THAT(bad.err, Contains("device.memory_efficiency"));
  CHECK_THAT(bad.err, Contains("), found bf16\n"));
  CHECK_FALSE(std::filesystem::exists(box.work() / "b.json"));
}
