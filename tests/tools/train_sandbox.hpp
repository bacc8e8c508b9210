// Shared by the `loom train` tests: a sandbox holding a tiny BERT (1 layer, hidden 16, so a
// training command takes well under a second) and one- and two-device CPU clusters, and the
// checks every train test makes of a run's output.
#pragma once

#include <catch2/catch.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/tools/cli_sandbox.hpp"

namespace loom::test {

// The tiny model of these tests: its vocabulary (100) holds the synthetic one (63 tokens).
constexpr const char* kMicroBertJson = R"({
  "format": "loom-model/1", "name": "micro-bert", "family": "encoder", "model_type": "bert",
  "layers": 1, "hidden": 16, "heads": 2, "ffn_hidden": 32, "vocab": 100, "max_positions": 64,
  "type_vocab": 2, "num_labels": 2})";

// A sandbox holding model.json, cluster-1.json (local-cpu with one device: one rank) and
// cluster-2.json (two devices). Its commands run without the calling environment's launcher
// variables, so that a test run under torchrun or Slurm still trains one process.
class TrainSandbox : public CliSandbox {
 public:
  TrainSandbox() : CliSandbox("test-train") {
    write("model.json", kMicroBertJson);
    nlohmann::json cluster = nlohmann::json::parse(
        read_all(std::filesystem::path(LOOM_SOURCE_DIR) / "profiles/clusters/local-cpu.json"));
    cluster["name"] = "cpu-1";
    cluster["devices_per_node"] = 1;
    write("cluster-1.json", cluster.dump(2));
    cluster["name"] = "cpu-2";
    cluster["devices_per_node"] = 2;
    write("cluster-2.json", cluster.dump(2));
  }

  // `ENV loom ARGS` in work(); `env` is a list of NAME=VALUE words (may be empty).
  CliResult loom(const std::string& args, const std::string& env = "") const {
    return CliSandbox::loom(args, kNoLauncher + env);
  }
  CliResult loom_piped(const std::string& args) const {
    return CliSandbox::loom_piped(args, kNoLauncher);
  }

  // `loom plan` of the tiny model for one rank (global batch 8 in 2 micro-batches of 4, seq 32)
  // into `output`; `extra` adds flags (for example another cluster).
  void plan(const std::string& extra = "--cluster cluster-1.json",
            const std::string& output = "plan.json") const {
    const CliResult r =
        loom("plan --model model.json " + extra +
             " --global-batch 8 --seq-len 32 --precision fp32 --micro-batch 4 -o " + output);
    INFO("loom plan: " << r.err);
    REQUIRE(r.exit_code == 0);
    REQUIRE(std::filesystem::exists(work() / output));
  }

 private:
  static constexpr const char* kNoLauncher =
      "env -u RANK -u WORLD_SIZE -u LOCAL_RANK -u SLURM_PROCID -u SLURM_NTASKS -u SLURM_LOCALID ";
};

// `train plan.json --data synthetic:400 FLAGS`.
inline std::string train_args(const std::string& flags) {
  return "train plan.json --data synthetic:400 " + flags;
}

// A successful run's stdout, parsed (the summary of docs/formats.md).
inline nlohmann::json parse_summary(const CliResult& r) {
  INFO("stdout: " << r.out);
  INFO("stderr: " << r.err);
  REQUIRE(r.exit_code == 0);
  nlohmann::json summary;
  REQUIRE_NOTHROW(summary = nlohmann::json::parse(r.out));
  return summary;
}

inline std::vector<double> losses_of(const nlohmann::json& summary) {
  return summary.at("losses").get<std::vector<double>>();
}

// Bad input: exit code 2, nothing on stdout, one line `loom train: error: ...` on stderr.
inline void require_train_error(const CliResult& r) {
  INFO("stdout: " << r.out);
  INFO("stderr: " << r.err);
  CHECK(r.exit_code == 2);
  CHECK(r.out.empty());
  CHECK(line_count(r.err) == 1);
  CHECK_THAT(r.err, Catch::StartsWith("loom train: error: "));
}

// The first line of a metrics file, parsed.
inline nlohmann::json first_line(const std::filesystem::path& path) {
  const std::string text = read_all(path);
  return nlohmann::json::parse(text.substr(0, text.find('\n')));
}

}  // namespace loom::test
