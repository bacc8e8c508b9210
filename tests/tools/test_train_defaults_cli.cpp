// End-to-end tests of what `loom train` does for a user without being asked: it warms up by
// default, resumes from a checkpoint's own tokenizer and says so, warns when the vocabulary does
// not fit the text, and names every obstacle of a plan made for other hardware at once.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/tools/train_sandbox.hpp"

namespace fs = std::filesystem;
using Catch::Contains;
using Catch::StartsWith;
using loom::test::first_line;
using loom::test::require_train_error;
using loom::test::train_args;
using loom::test::TrainSandbox;
using TrainRun = loom::test::CliResult;

TEST_CASE("loom train --resume needs no --init or --tokenizer again and says where it went on",
          "[tools][cli][train]") {
  TrainSandbox box;
  box.plan();
  // A WordPiece vocabulary of its own (not the synthetic one), read from a file: the checkpoint
  // keeps a copy, which --resume reads.
  std::string vocab = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n";
  for (const char* word : {"good", "bad", "film", "a", "great", "awful", "plot"}) {
    vocab += std::string(word) + "\n";
  }
  box.write("tok/vocab.txt", vocab);
  std::string csv = "text,label\n";
  for (int i = 0; i < 12; ++i) csv += "a good film,1\na bad plot,0\n";
  box.write("reviews.csv", csv);
  const TrainRun first =
      box.loom("train plan.json --data reviews.csv --tokenizer tok --steps 2 --checkpoint ck");
  INFO(first.err);
  REQUIRE(first.exit_code == 0);
  CHECK(fs::exists(box.work() / "ck" / "step-00000002" / "vocab.txt"));
  const TrainRun resumed =
      box.loom("train plan.json --data reviews.csv --steps 4 --checkpoint ck --resume");
  INFO(resumed.err);
  REQUIRE(resumed.exit_code == 0);
  CHECK_THAT(resumed.err, Contains("resumed from step 2 of 4 (the latest checkpoint in ck)"));
  CHECK_THAT(resumed.out, Contains("resumed from step 2 (the latest checkpoint in ck)"));
  // A fresh run of the same data without a tokenizer is still refused, naming --resume.
  const TrainRun fresh = box.loom("train plan.json --data reviews.csv --steps 1");
  require_train_error(fresh);
  CHECK_THAT(fresh.err, Contains("--tokenizer") && Contains("--resume"));
}

TEST_CASE("loom train warns when most tokens are unknown to the vocabulary",
          "[tools][cli][train]") {
  TrainSandbox box;
  box.plan();
  box.write("tok/vocab.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\ngood\nbad\n");
  std::string csv = "text,label\n";
  for (int i = 0; i < 12; ++i) csv += "a good film,1\na bad plot,0\n";
  box.write("reviews.csv", csv);
  const TrainRun unknown = box.loom("train plan.json --data reviews.csv --tokenizer tok --steps 1");
  INFO(unknown.err);
  REQUIRE(unknown.exit_code == 0);
  // Of "a good film" and "a bad plot", two words in three are unknown (22 of the 24 reviews
  // train; a tenth is held out for validation).
  CHECK_THAT(unknown.err, Contains("warning: 66.7 % of the tokens of the first 22 training "
                                   "reviews are the unknown token (id 1) of ") &&
                              Contains("vocab.txt"));
  // Synthetic reviews with their own vocabulary: no warning.
  const TrainRun known = box.loom(train_args("--steps 1"));
  REQUIRE(known.exit_code == 0);
  CHECK_THAT(known.err, !Contains("unknown token"));
}

TEST_CASE("loom train names every obstacle of a GPU plan on this machine at once",
          "[tools][cli][train][device]") {
  TrainSandbox box;
  // fp16 with the fused attention kernel: the CPU runs neither.
  const TrainRun plan = box.loom(
      "plan --model model.json --cluster dgx-a100-80g --dp 1 --tp 1 --pp 1 --global-batch 8 "
      "--seq-len 32 --micro-batch 4 --precision fp16 --attention flash -o gpu.json");
  REQUIRE(plan.exit_code == 0);
  const TrainRun r = box.loom("train gpu.json --data synthetic:400 --steps 2 --device cpu");
  require_train_error(r);
  CHECK_THAT(r.err, Contains("fp16 does not train on the CPU") &&
                        Contains("To train it here, all at once: re-plan with") &&
                        Contains("--precision fp32"));
  const TrainRun cuda = box.loom("train gpu.json --data synthetic:400 --steps 2");
  if (cuda.err.find("is a CPU build") != std::string::npos) {
    require_train_error(cuda);
    CHECK_THAT(cuda.err, Contains("; and $.job.precision: fp16 does not train on the CPU") &&
                             Contains("--precision fp32, and add --device cpu"));
  }
}

TEST_CASE("loom train warms up over a tenth of the steps unless told otherwise",
          "[tools][cli][train]") {
  TrainSandbox box;
  box.plan();
  REQUIRE(box.loom(train_args("--steps 20 --metrics m.jsonl")).exit_code == 0);
  std::vector<double> rates;
  std::ifstream in(box.work() / "m.jsonl");
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (!j.contains("eval")) rates.push_back(j.at("lr").get<double>());
  }
  REQUIRE(rates.size() == 20);
  // Two warm-up steps of 20: 0, then half the peak, then the peak decaying linearly to 0.
  CHECK(rates[0] == 0.0);
  CHECK(rates[1] == Approx(0.5e-3));
  CHECK(rates[2] == Approx(1e-3));
  CHECK(rates[3] == Approx(1e-3 * 17 / 18));
  REQUIRE(box.loom(train_args("--steps 20 --warmup-steps 0 --metrics n.jsonl")).exit_code == 0);
  CHECK(first_line(box.work() / "n.jsonl").at("lr") == 1e-3);
}

TEST_CASE("loom train --comm: gloo runs two CPU ranks, nccl on cpu is refused", "[cli][train]") {
  TrainSandbox box;
  box.plan();
  const TrainRun refused = box.loom(train_args("--steps 2 --comm nccl"));
  require_train_error(refused);
  CHECK_THAT(refused.err, Contains("--comm") && Contains("gloo for a run on cpu"));
  // On cuda --comm gloo stages through host memory; on cpu it is the default, and a launched
  // pair trains with it.
  const TrainRun r = box.loom(
      "plan --model model.json --cluster local-cpu --global-batch 8 --seq-len 32 "
      "--precision fp32 --dp 2 -o plan2.json");
  REQUIRE(r.exit_code == 0);
  const TrainRun two =
      box.loom("launch --nproc 2 --master-port " + loom::test::free_port() +
               " -- loom train plan2.json --data synthetic:400 --steps 2 --comm gloo");
  INFO(two.err);
  CHECK(two.exit_code == 0);
  CHECK_THAT(two.err, Contains("step 2/2"));
}
