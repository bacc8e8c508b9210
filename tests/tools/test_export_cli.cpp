// End-to-end tests of `loom train --output` and `loom export` (docs/README.md): a one-rank run and
// a dp2 run started by `loom launch` each write a Hugging Face folder that `loom logits` scores
// alike, `loom export` of their checkpoints gives the same model.safetensors, and bad input is
// refused (exit 2, one line, nothing written).
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/tools/cli_sandbox.hpp"

namespace fs = std::filesystem;
using Catch::Contains;
using Catch::StartsWith;
using loom::test::CliResult;
using loom::test::CliSandbox;

namespace {

// The tiny model of these tests: its vocabulary (100) holds the synthetic one (63 tokens).
constexpr const char* kModelJson = R"({
  "format": "loom-model/1", "name": "micro-bert", "family": "encoder", "model_type": "bert",
  "layers": 1, "hidden": 16, "heads": 2, "ffn_hidden": 32, "vocab": 100, "max_positions": 64,
  "type_vocab": 2, "num_labels": 2})";

// Plans of the tiny model, global batch 8 of micro-batches of 4, seq 32: plan1.json for one CPU
// rank (2 micro-batches) and plan2.json for dp = 2 (one micro-batch per rank).
void write_plans(const CliSandbox& box) {
  box.write("model.json", kModelJson);
  nlohmann::json cluster = nlohmann::json::parse(
      loom::test::read_all(fs::path(LOOM_SOURCE_DIR) / "profiles/clusters/local-cpu.json"));
  for (int devices : {1, 2}) {
    cluster["name"] = "cpu-" + std::to_string(devices);
    cluster["devices_per_node"] = devices;
    box.write("cluster-" + std::to_string(devices) + ".json", cluster.dump(2));
    const std::string n = std::to_string(devices);
    std::string args = "plan --model model.json --cluster cluster-" + n;
    args += ".json --dp " + n;
    args += " --global-batch 8 --seq-len 32 --precision fp32 --micro-batch 4 -o plan" + n;
    args += ".json";
    const CliResult r = box.loom(args);
    INFO("loom plan: " << r.err);
    REQUIRE(r.exit_code == 0);
  }
}

std::vector<std::vector<double>> logits_of(const CliSandbox& box, const std::string& folder) {
  const CliResult r = box.loom("logits --init " + folder + " --ids ids.json");
  INFO("loom logits: " << r.err);
  REQUIRE(r.exit_code == 0);
  return nlohmann::json::parse(r.out).at("logits").get<std::vector<std::vector<double>>>();
}

const std::string kTrain = " --data synthetic:400 --steps 3 --dropout 0 --seed 5 --json";

}  // namespace

TEST_CASE("loom train --output and loom export write the same Hugging Face folder",
          "[tools][cli][export]") {
  CliSandbox box("export");
  write_plans(box);
  box.write("ids.json", R"({"input_ids": [[2, 10, 11, 12, 3], [2, 20, 21, 3, 0]],
    "attention_mask": [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]})");

  const CliResult one = box.loom("train plan1.json --checkpoint ck1 --output out1" + kTrain);
  INFO("one rank: " << one.err);
  REQUIRE(one.exit_code == 0);
  const CliResult two =
      box.loom("launch --nproc 2 --master-port " + loom::test::free_port() +
               " -- loom train plan2.json --checkpoint ck2 --output out2" + kTrain);
  INFO("dp2: " << two.err);
  REQUIRE(two.exit_code == 0);

  // The dp2 folder scores as the one-rank folder (the same batches, no dropout).
  const auto a = logits_of(box, "out1");
  const auto b = logits_of(box, "out2");
  REQUIRE(a.size() == 2);
  REQUIRE(b.size() == 2);
  for (std::size_t i = 0; i < 2; ++i) {
    for (std::size_t k = 0; k < 2; ++k) CHECK(std::abs(a[i][k] - b[i][k]) <= 1e-5);
  }
  const nlohmann::json config = nlohmann::json::parse(box.read("out2/config.json"));
  CHECK(config.at("architectures")[0] == "BertForSequenceClassification");
  CHECK(config.at("id2label").size() == 2);

  // loom export of each checkpoint (the folder, or its step folder) is --output, byte for byte.
  for (const auto& [checkpoint, output] :
       {std::pair{"ck1", "out1"}, std::pair{"ck2/step-00000003", "out2"}}) {
    INFO(checkpoint);
    const CliResult r = box.loom(std::string("export ") + checkpoint + " -o exported");
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    CHECK(box.read("exported/model.safetensors") ==
          box.read(std::string(output) + "/model.safetensors"));
    CHECK(box.read("exported/config.json") == box.read(std::string(output) + "/config.json"));
  }
}

TEST_CASE("loom export refuses what is no checkpoint", "[tools][cli][export][errors]") {
  CliSandbox box("export-errors");
  fs::create_directories(box.work() / "empty");
  for (const char* checkpoint : {"empty", "missing"}) {
    const CliResult r = box.loom(std::string("export ") + checkpoint + " -o out");
    INFO(r.err);
    CHECK(r.exit_code == 2);
    CHECK(loom::test::line_count(r.err) == 1);
    CHECK_THAT(r.err, StartsWith("loom export: error: ") && Contains(checkpoint) &&
                          Contains("trainer_state.json"));
    CHECK_FALSE(fs::exists(box.work() / "out"));
  }
}
