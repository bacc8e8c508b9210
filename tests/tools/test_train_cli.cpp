// End-to-end tests of `loom train` (docs/README.md): a tiny plan for one CPU rank trained on
// synthetic reviews, the metrics file (docs/formats.md), checkpoints and --resume, --init, and
// the refusals of bad input (exit 2, one line `loom train: error: ...` naming the input).
//
// Every command runs in a fresh temporary folder, removed at the end. The model is tiny (1 layer,
// hidden 16), so each training command takes well under a second.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/tools/train_sandbox.hpp"

namespace fs = std::filesystem;
using Catch::Contains;
using Catch::StartsWith;
using loom::test::first_line;
using loom::test::line_count;
using loom::test::losses_of;
using loom::test::parse_summary;
using loom::test::read_all;
using loom::test::require_train_error;
using loom::test::train_args;
using loom::test::TrainSandbox;
using TrainRun = loom::test::CliResult;

TEST_CASE("loom train runs a one-rank plan and writes the metrics of docs/formats.md",
          "[tools][cli][train]") {
  TrainSandbox box;
  box.plan();
  const TrainRun r = box.loom(train_args("--steps 5 --warmup-steps 0 --metrics m.jsonl --json"));
  const nlohmann::json summary = parse_summary(r);
  // Five steps: a log line for each (about 20 per run at most) and one for the evaluation.
  CHECK(line_count(r.err) == 6);
  CHECK_THAT(r.err, StartsWith("step 1/5, epoch 0.02: loss "));
  CHECK(summary.at("steps") == 5);
  CHECK(losses_of(summary).size() == 5);
  CHECK(summary.at("final_loss").get<double>() == losses_of(summary).back());
  CHECK(summary.at("median_step_time_s").get<double>() > 0);
  CHECK(summary.at("samples_per_s").get<double>() > 0);
  CHECK(summary.at("precision") == "fp32");
  CHECK(summary.at("validation_accuracy").get<double>() >= 0);
  CHECK(summary.at("validation_accuracy").get<double>() <= 1);
  CHECK(summary.at("eval_split") == "validation");
  CHECK_FALSE(summary.contains("resumed_from_step"));

  // Five step lines with exactly the spec's fields, then one evaluation after the last step.
  std::ifstream in(box.work() / "m.jsonl");
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);) {
    REQUIRE_NOTHROW(lines.push_back(nlohmann::json::parse(line)));
  }
  REQUIRE(lines.size() == 6);
  const std::set<std::string> step_fields = {
      "step", "epoch", "loss", "lr", "samples_per_s", "step_time_s", "peak_memory_bytes", "rank",
      "time", "peak_rss_bytes",  // an extension: the process's resident peak next to
                                 // its tensors' peak
      "phases_s"};               // an extension: where the step's time went
  for (std::size_t i = 0; i < 5; ++i) {
    INFO("line " << i + 1 << ": " << lines[i].dump());
    std::set<std::string> keys;
    for (const auto& item : lines[i].items()) keys.insert(item.key());
    CHECK(keys == step_fields);
    CHECK(lines[i].at("step") == i + 1);
    CHECK(lines[i].at("epoch") == 0);
    CHECK(lines[i].at("loss").get<double>() == losses_of(summary)[i]);
    // From scratch the default --lr is 1e-3; no warm-up, then linear decay to 0 at step 5.
    CHECK(lines[i].at("lr").get<double>() == Approx(1e-3 * static_cast<double>(5 - i) / 5));
    CHECK(lines[i].at("samples_per_s").get<double>() > 0);
    CHECK(lines[i].at("step_time_s").get<double>() > 0);
    CHECK(lines[i].at("peak_memory_bytes").get<std::int64_t>() > 0);
    // Tensors are part of what the process holds, besides code and libraries.
    CHECK(lines[i].at("peak_rss_bytes").get<std::int64_t>() >
          lines[i].at("peak_memory_bytes").get<std::int64_t>());
    CHECK(lines[i].at("rank") == 0);
    // The phases add up to the step; one rank has no pipeline to wait for.
    const nlohmann::json& phases = lines[i].at("phases_s");
    CHECK(phases.size() == 6);
    double sum = 0;
    for (const auto& item : phases.items()) {
      CHECK(item.value().get<double>() >= 0);
      sum += item.value().get<double>();
    }
    CHECK(sum == Approx(lines[i].at("step_time_s").get<double>()).epsilon(1e-9));
    CHECK(phases.at("pipeline_wait") == 0);
    CHECK(phases.at("forward").get<double>() > 0);
    CHECK(phases.at("backward").get<double>() > 0);
    CHECK(phases.at("optimizer").get<double>() > 0);
    const std::string time = lines[i].at("time");
    CHECK(time.size() == 20);  // 2026-11-22T10:00:00Z
    CHECK(time[10] == 'T');
    CHECK(time.back() == 'Z');
  }
  const nlohmann::json& eval = lines[5];
  CHECK(eval.size() == 5);
  CHECK(eval.at("eval") == true);
  CHECK(eval.at("split") == "validation");
  CHECK(eval.at("step") == 5);
  CHECK(eval.at("accuracy").get<double>() == summary.at("validation_accuracy").get<double>());
  CHECK(eval.at("loss").get<double>() == summary.at("validation_loss").get<double>());

  // The human-readable summary by default.
  const TrainRun text = box.loom(train_args("--steps 2"));
  INFO("stderr: " << text.err);
  CHECK(text.exit_code == 0);
  // The default learning rate is said first, with the log lines.
  CHECK_THAT(text.err, StartsWith("lr 1e-3 (training from scratch; --init fine-tunes at 2e-5)\n"
                                  "step 1/2, "));
  // 400 reviews, 40 held out for validation.
  CHECK_THAT(text.out, StartsWith("trained 2 steps") && Contains("\nvalidation accuracy ") &&
                           Contains(" % (40 reviews), loss "));
  CHECK_FALSE(nlohmann::json::accept(text.out));
}

TEST_CASE("loom train --epochs runs whole passes over the training reviews",
          "[tools][cli][train]") {
  TrainSandbox box;
  box.plan();
  // 80 reviews, 8 held out: 72 training reviews are 9 steps of 8 per epoch.
  const nlohmann::json summary =
      parse_summary(box.loom("train plan.json --data synthetic:80 --epochs 2 --json"));
  CHECK(summary.at("steps") == 18);
  // Neither --steps nor --epochs: one epoch.
  CHECK(parse_summary(box.loom("train plan.json --data synthetic:80 --json")).at("steps") == 9);
}

TEST_CASE("loom train --checkpoint and --resume continue with the uninterrupted losses",
          "[tools][cli][train]") {
  TrainSandbox box;
  box.plan();
  // With warm-up longer than the run, the rate of step s is lr * s / warmup whatever --steps is,
  // so 5 steps, then --resume to 10, must repeat the 10-step run's losses bit for bit.
  const std::string common = train_args("--lr 1e-3 --warmup-steps 20 --seed 3 --json ");
  const nlohmann::json whole = parse_summary(box.loom(common + "--steps 10"));
  REQUIRE(losses_of(whole).size() == 10);

  const nlohmann::json head =
      parse_summary(box.loom(common + "--steps 5 --checkpoint ckpt --metrics m.jsonl"));
  REQUIRE(losses_of(head).size() == 5);
  const fs::path step5 = box.work() / "ckpt" / "step-00000005";
  for (const char* file : {"model.safetensors", "optimizer.pt", "rng.pt", "trainer_state.json"}) {
    CHECK(fs::exists(step5 / file));
  }

  const nlohmann::json tail =
      parse_summary(box.loom(common + "--steps 10 --checkpoint ckpt --resume --metrics m.jsonl "
                                      "--keep-checkpoints 1"));
  CHECK(tail.at("resumed_from_step") == 5);
  CHECK(tail.at("steps") == 10);
  const std::vector<double> resumed = losses_of(tail);
  REQUIRE(resumed.size() == 5);
  for (std::size_t i = 0; i < 5; ++i) {
    INFO("step " << i + 1);
    CHECK(losses_of(head)[i] == losses_of(whole)[i]);
    INFO("step " << i + 6);
    CHECK(resumed[i] == losses_of(whole)[i + 5]);  // bit-identical
  }
  CHECK(tail.at("validation_accuracy") == whole.at("validation_accuracy"));
  // --keep-checkpoints 1: only the newest checkpoint is kept.
  std::vector<std::string> folders;
  for (const auto& entry : fs::directory_iterator(box.work() / "ckpt")) {
    folders.push_back(entry.path().filename().string());
  }
  CHECK(folders == std::vector<std::string>{"step-00000010"});
  // The resumed run appended: steps 1-5, evaluation, steps 6-10, evaluation.
  std::ifstream in(box.work() / "m.jsonl");
  std::vector<int> steps;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    steps.push_back(j.contains("eval") ? -j.at("step").get<int>() : j.at("step").get<int>());
  }
  CHECK(steps == std::vector<int>{1, 2, 3, 4, 5, -5, 6, 7, 8, 9, 10, -10});

  // A checkpoint folder is a Hugging Face-style init checkpoint: training starts from its weights.
  const nlohmann::json fresh = parse_summary(box.loom(train_args("--steps 2 --json")));
  const nlohmann::json from_init =
      parse_summary(box.loom(train_args("--steps 2 --json --init ckpt/step-00000010")));
  CHECK(losses_of(from_init)[0] != losses_of(fresh)[0]);
}

TEST_CASE("loom train refuses a plan whose rank count is not the world size",
          "[tools][cli][train][errors]") {
  TrainSandbox box;
  box.plan();
  SECTION("WORLD_SIZE=2 with a one-rank plan") {
    const TrainRun r = box.loom(train_args("--steps 5"), "WORLD_SIZE=2 RANK=0");
    require_train_error(r);
    CHECK_THAT(r.err, Contains("plan.json") && Contains("$.strategy") && Contains("2 rank") &&
                          Contains("WORLD_SIZE"));
  }
  SECTION("a two-rank plan run as a single process") {
    box.plan("--cluster cluster-2.json --dp 2", "plan2.json");
    const TrainRun r = box.loom("train plan2.json --data synthetic:400 --steps 5");
    require_train_error(r);
    CHECK_THAT(r.err, Contains("plan2.json") && Contains("$.strategy") &&
                          Contains("dp*tp*pp = 2") && Contains("loom launch --nproc 2"));
  }
}

TEST_CASE("loom train refuses bad data", "[tools][cli][train][errors]") {
  TrainSandbox box;
  box.plan();
  box.write("vocab.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\ngood\nbad\n");
  SECTION("a missing folder") {
    const TrainRun r = box.loom("train plan.json --data aclImdb/ --steps 5");
    require_train_error(r);
    CHECK_THAT(r.err, Contains("aclImdb/") && Contains("no such file or folder"));
  }
  SECTION("an empty CSV") {
    box.write("empty.csv", "");
    const TrainRun r = box.loom("train plan.json --data empty.csv --tokenizer vocab.txt --steps 5");
    require_train_error(r);
    CHECK_THAT(r.err, Contains("empty.csv") && Contains("review,sentiment"));
  }
  SECTION("a CSV with another header") {
    box.write("reviews.csv", "comment,score\n\"a good film\",positive\n");
    const TrainRun r =
        box.loom("train plan.json --data reviews.csv --tokenizer vocab.txt --steps 5");
    require_train_error(r);
    CHECK_THAT(r.err, Contains("reviews.csv") && Contains("line 1") &&
                          Contains("review, text or sentence") && Contains("comment,score"));
  }
  SECTION("fewer reviews than one global batch") {
    const TrainRun r = box.loom("train plan.json --data synthetic:8 --steps 5");
    require_train_error(r);
    CHECK_THAT(r.err, Contains("synthetic:8") && Contains("global batch of 8"));
  }
  SECTION("a tokenizer larger than the model's vocabulary") {
    std::string big = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n";
    for (int i = 0; i < 200; ++i) big += "word" + std::to_string(i) + "\n";
    box.write("big-vocab.txt", big);
    const TrainRun r = box.loom(train_args("--steps 5 --tokenizer big-vocab.txt"));
    require_train_error(r);
    CHECK_THAT(r.err, Contains("big-vocab.txt") && Contains("100") && Contains("205"));
  }
}

TEST_CASE("loom train fine-tunes RoBERTa from vocab.json + merges.txt, evaluating on test/",
          "[tools][cli][train][bpe]") {
  TrainSandbox box;
  // A RoBERTa-shaped tiny model: positions start after the padding id 1, so 32 + 2 positions.
  box.write("model.json", R"({
    "format": "loom-model/1", "name": "micro-roberta", "family": "encoder",
    "model_type": "roberta", "layers": 1, "hidden": 16, "heads": 2, "ffn_hidden": 32,
    "vocab": 100, "max_positions": 34, "type_vocab": 1, "num_labels": 2})");
  box.plan();
  nlohmann::json vocab = {{"<s>", 0}, {"<pad>", 1}, {"</s>", 2}, {"<unk>", 3}};
  for (char c = 'a'; c <= 'z'; ++c) vocab[std::string(1, c)] = vocab.size();
  for (const char* token : {"Ġ", "go", "goo", "good", "Ġgood", "ba", "bad", "Ġbad", "fi", "fil",
                            "film", "Ġfilm", "<mask>"}) {
    vocab[token] = vocab.size();
  }
  box.write("roberta/vocab.json", vocab.dump());
  box.write("roberta/merges.txt",
            "#version: 0.2\ng o\ngo o\ngoo d\nĠ good\nb a\nba d\nĠ bad\nf i\nfi l\nfil m\n"
            "Ġ film\n");
  // 8 training reviews: exactly one global batch, so the run only starts when none is held out
  // for validation, that is when aclImdb/test is the evaluation split.
  for (int i = 0; i < 4; ++i) {
    box.write("aclImdb/train/pos/" + std::to_string(i) + "_9.txt", "good film good");
    box.write("aclImdb/train/neg/" + std::to_string(i) + "_1.txt", "bad film bad");
  }
  box.write("aclImdb/test/pos/0_9.txt", "a good film");
  box.write("aclImdb/test/neg/0_1.txt", "a bad film");
  const std::string run = "train plan.json --tokenizer roberta --steps 1 --json --data ";
  const nlohmann::json summary = parse_summary(box.loom(run + "aclImdb"));
  CHECK(summary.at("steps") == 1);
  CHECK(summary.contains("validation_accuracy"));

  // --eval-data: a Windows CSV with a text,label header evaluates the same way.
  box.write("holdout.csv", "text,label\r\ngood,1\r\nbad,0\r\n");
  CHECK(parse_summary(box.loom(run + "aclImdb/train --eval-data holdout.csv")).at("steps") == 1);
  // Without an evaluation split a tenth of the 8 reviews is held out: less than one batch.
  const TrainRun held_out = box.loom(run + "aclImdb/train");
  require_train_error(held_out);
  CHECK_THAT(held_out.err, Contains("--validation-fraction") && Contains("found 7 of 8"));

  // A BERT vocab.txt pads with 0: refused for RoBERTa, which pads with 1.
  box.write("vocab.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\ngood\nbad\nfilm\n");
  const TrainRun bert = box.loom("train plan.json --tokenizer vocab.txt --steps 1 --data aclImdb");
  require_train_error(bert);
  CHECK_THAT(bert.err,
             Contains("vocab.txt") && Contains("roberta pads with 1") && Contains("pads with 0"));
}

TEST_CASE("loom train refuses bad options", "[tools][cli][train][errors]") {
  TrainSandbox box;
  box.plan();
  SECTION("--steps and --epochs together") {
    const TrainRun r = box.loom(train_args("--steps 5 --epochs 1"));
    require_train_error(r);
    CHECK_THAT(r.err, Contains("--steps") && Contains("--epochs"));
  }
  SECTION("an unknown --device") {
    const TrainRun r = box.loom(train_args("--steps 5 --device tpu"));
    require_train_error(r);
    CHECK_THAT(r.err, Contains("--device") && Contains("tpu"));
  }
  SECTION("--resume without --checkpoint") {
    const TrainRun r = box.loom(train_args("--steps 5 --resume"));
    require_train_error(r);
    CHECK_THAT(r.err, Contains("--resume") && Contains("--checkpoint"));
  }
}

TEST_CASE("loom train refuses an unusable --init checkpoint", "[tools][cli][train][errors]") {
  TrainSandbox box;
  box.plan();
  SECTION("a folder without model.safetensors") {
    fs::create_directories(box.work() / "init");
    const TrainRun r = box.loom(train_args("--steps 5 --init init"));
    require_train_error(r);
    CHECK_THAT(r.err, Contains("--init") && Contains("init/model.safetensors"));
  }
  SECTION("the config.json of another model") {
    box.write("other/config.json", R"({"model_type": "bert", "num_hidden_layers": 1,
      "hidden_size": 32, "num_attention_heads": 2, "intermediate_size": 32, "vocab_size": 100,
      "max_position_embeddings": 64, "type_vocab_size": 2})");
    const TrainRun r = box.loom(train_args("--steps 5 --init other"));
    require_train_error(r);
    CHECK_THAT(r.err, Contains("other/config.json") && Contains("hidden_size") && Contains("16") &&
                          Contains("32") && Contains("another model"));
  }
}

TEST_CASE("loom train --dump-batches writes each micro-batch, loom logits scores its checkpoint",
          "[tools][cli][train][logits]") {
  TrainSandbox box;
  box.plan();
  const nlohmann::json summary = parse_summary(box.loom(
      train_args("--steps 3 --dump-batches batches.jsonl --checkpoint ck --json --seed 5")));
  CHECK(summary.at("steps") == 3);
  // 3 steps of 2 micro-batches of 4 sequences of 32 tokens, in training order.
  std::vector<nlohmann::json> lines;
  std::istringstream in(read_all(box.work() / "batches.jsonl"));
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  REQUIRE(lines.size() == 6);
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const nlohmann::json& b = lines[i];
    CHECK(b.at("step") == static_cast<int>(i / 2 + 1));
    CHECK(b.at("micro_batch") == static_cast<int>(i % 2));
    REQUIRE(b.at("input_ids").size() == 4);
    CHECK(b.at("input_ids")[3].size() == 32);
    CHECK(b.at("attention_mask")[0][0] == 1);
    CHECK(b.at("token_type_ids")[1].size() == 32);
    REQUIRE(b.at("labels").size() == 4);
    for (const auto& label : b.at("labels")) CHECK((label == 0 || label == 1));
  }
  CHECK(lines[0].at("input_ids") != lines[1].at("input_ids"));

  // The final checkpoint as a Hugging Face folder: its weights and the model's config.json.
  fs::create_directories(box.work() / "hf");
  fs::copy_file(box.work() / "ck/step-00000003/model.safetensors",
                box.work() / "hf/model.safetensors");
  box.write("hf/config.json", R"({"model_type": "bert", "num_hidden_layers": 1, "hidden_size": 16,
    "num_attention_heads": 2, "intermediate_size": 32, "vocab_size": 100,
    "max_position_embeddings": 64, "type_vocab_size": 2, "num_labels": 2})");
  // A row of the first micro-batch, with its padding (mask 0) and cut to its real tokens: the
  // padding must not change the logits.
  const nlohmann::json& first = lines[0];
  std::size_t row = 0;
  std::int64_t real = 32;
  for (std::size_t r = 0; r < 4 && real == 32; ++r) {
    real = 0;
    for (const auto& m : first.at("attention_mask")[r]) real += m.get<std::int64_t>();
    row = r;
  }
  REQUIRE(real < 32);  // synthetic reviews are shorter than 32 tokens
  const nlohmann::json padded = {
      {"input_ids", {first.at("input_ids")[row], first.at("input_ids")[row]}},
      {"attention_mask", {first.at("attention_mask")[row], first.at("attention_mask")[row]}}};
  std::vector<std::int64_t> cut = first.at("input_ids")[row];
  cut.resize(static_cast<std::size_t>(real));
  box.write("padded.json", padded.dump());
  box.write("cut.json", nlohmann::json{{"input_ids", {cut}}}.dump());
  TrainRun r = box.loom("logits --init hf --ids padded.json -o padded-logits.json");
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  r = box.loom("logits --init hf --ids cut.json");
  REQUIRE(r.exit_code == 0);
  const nlohmann::json a = nlohmann::json::parse(read_all(box.work() / "padded-logits.json"));
  const nlohmann::json b = nlohmann::json::parse(r.out);
  CHECK(a.at("format") == "loom-logits/1");
  CHECK(a.at("precision") == "fp32");
  REQUIRE(a.at("logits").size() == 2);
  REQUIRE(b.at("logits").size() == 1);
  for (int k = 0; k < 2; ++k) {
    const double x = a.at("logits")[0][k].get<double>();
    CHECK(x == a.at("logits")[1][k].get<double>());
    CHECK(x == Approx(b.at("logits")[0][k].get<double>()).margin(1e-5));
  }
  // The checkpoint's weights count: after one step instead of three, other logits.
  parse_summary(box.loom(train_args("--steps 1 --checkpoint ck1 --json --seed 5")));
  fs::copy_file(box.work() / "ck1/step-00000001/model.safetensors",
                box.work() / "hf/model.safetensors", fs::copy_options::overwrite_existing);
  r = box.loom("logits --init hf --ids cut.json");
  REQUIRE(r.exit_code == 0);
  CHECK(nlohmann::json::parse(r.out).at("logits") != b.at("logits"));

  // Bad ids: one line naming the file and what was expected, exit 2.
  box.write("bad.json", R"({"input_ids": [[2, 100, 3]]})");
  r = box.loom("logits --init hf --ids bad.json");
  CHECK(r.exit_code == 2);
  CHECK(r.out.empty());
  CHECK_THAT(r.err,
             StartsWith("loom logits: error: ") && Contains("bad.json") && Contains("[0, 100)"));
  box.write("bad.json", R"({"input_ids": [[2, 5, 3]], "attention_mask": [[1, 1]]})");
  r = box.loom("logits --init hf --ids bad.json");
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.err, Contains("bad.json") && Contains("common length"));
  box.write("bad.json", R"({"ids": [[2, 5, 3]]})");
  r = box.loom("logits --init hf --ids bad.json");
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.err, Contains("bad.json") && Contains("$.input_ids"));
  r = box.loom("logits --init nowhere --ids cut.json");
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.err, Contains("--init") && Contains("config.json"));
}

TEST_CASE("loom train runs on the plan's device, --device overrides, precisions are not changed",
          "[tools][cli][train][device]") {
  TrainSandbox box;
  box.plan();
  box.plan("--cluster dgx-a100-80g --dp 1 --tp 1 --pp 1", "gpu.json");
  // Whether this build trains on cuda: loom slurm warns when it cannot.
  const TrainRun slurm = box.loom("slurm gpu.json -o job.sh");
  REQUIRE(slurm.exit_code == 0);
  const bool cpu_build = slurm.err.find("is a CPU build") != std::string::npos;
  SECTION("a GPU plan trains on cuda: a CPU build refuses it and says how to build for GPUs") {
    const TrainRun r = box.loom("train gpu.json --data synthetic:400 --steps 2");
    if (cpu_build) {
      require_train_error(r);
      CHECK_THAT(r.err, StartsWith("loom train: error: gpu.json: a plan for dgx-a100-80g's GPUs "
                                   "trains on cuda, which needs a CUDA build of Loom") &&
                            Contains("cmake -DLOOM_CUDA=ON") &&
                            Contains("add --device cpu to train on the CPU"));
    } else if (r.exit_code != 0) {  // a CUDA build on a machine without a GPU
      require_train_error(r);
      CHECK_THAT(r.err, Contains("needs a GPU") && Contains("--device cpu"));
    }
  }
  SECTION("--device cpu trains a GPU plan on the CPU") {
    const nlohmann::json summary = parse_summary(
        box.loom("train gpu.json --data synthetic:400 --steps 2 --device cpu --json"));
    CHECK(summary.at("steps") == 2);
    CHECK(summary.at("precision") == "fp32");
  }
  SECTION("--device cuda on a CPU plan") {
    const TrainRun r = box.loom(train_args("--steps 2 --device cuda"));
    if (cpu_build) {
      require_train_error(r);
      CHECK_THAT(r.err, StartsWith("loom train: error: --device: cuda, which needs a CUDA build") &&
                            Contains("use --device cpu"));
    }
  }
  SECTION("fp16 does not train on the CPU: refused, not run in fp32") {
    for (const char* precision : {"fp16"}) {
      INFO(precision);
      const TrainRun plan = box.loom(
          "plan --model model.json --cluster dgx-a100-80g --dp 1 --tp 1 --pp 1 --global-batch 8 "
          "--seq-len 32 --micro-batch 4 -o half.json --precision " +
          std::string(precision));
      REQUIRE(plan.exit_code == 0);
      const TrainRun r = box.loom("train half.json --data synthetic:400 --steps 2 --device cpu");
      require_train_error(r);
      // On A100s a 16-bit plan runs the fused attention, which this LibTorch may lack too: one
      // error names both, with both flags.
      const bool fused = r.err.find("$.strategy.attention") != std::string::npos;
      CHECK_THAT(r.err, Contains(std::string(precision) +
                                 " does not train on the CPU (LibTorch runs fp32 and bf16 "
                                 "there): re-plan with --precision fp32, or for a CPU cluster") &&
                            Contains("or train it on cuda"));
      if (fused) {
        CHECK_THAT(r.err, Contains("To train it here, all at once: re-plan with --attention math "
                                   "--precision fp32"));
      }
    }
  }
  SECTION("bf16 trains on the CPU under autocast, but not with tensor parallelism (Gloo)") {
    const TrainRun plan = box.loom(
        "plan --model model.json --cluster cluster-1.json --global-batch 8 --seq-len 32 "
        "--micro-batch 4 --precision bf16 -o bf16.json");
    REQUIRE(plan.exit_code == 0);
    const nlohmann::json bf16 =
        parse_summary(box.loom("train bf16.json --data synthetic:400 --steps 2 --json"));
    CHECK(bf16.at("precision") == "bf16");
    const nlohmann::json fp32 = parse_summary(box.loom(train_args("--steps 2 --json")));
    // The same initial weights and batch; bf16 matrix products change the loss a little.
    CHECK(losses_of(bf16)[0] != losses_of(fp32)[0]);
    CHECK(losses_of(bf16)[0] == Approx(losses_of(fp32)[0]).epsilon(1e-2));
    const TrainRun tp = box.loom(
        "plan --model model.json --cluster cluster-2.json --global-batch 8 --seq-len 32 "
        "--micro-batch 4 --precision bf16 --tp 2 --dp 1 --pp 1 -o tp.json");
    REQUIRE(tp.exit_code == 0);
    const TrainRun r = box.loom("train tp.json --data synthetic:400 --steps 2");
    require_train_error(r);
    CHECK_THAT(r.err, Contains("tp.json: $.job.precision: bf16 with tensor parallelism") &&
                          Contains("Gloo") && !Contains("or train it on cuda"));
  }
}

TEST_CASE("loom train's default learning rate: 1e-3 from scratch, 2e-5 fine-tuning --init",
          "[tools][cli][train]") {
  TrainSandbox box;
  box.plan();
  const TrainRun scratch = box.loom(train_args("--steps 1 --checkpoint ck --metrics m.jsonl"));
  REQUIRE(scratch.exit_code == 0);
  CHECK_THAT(scratch.err,
             StartsWith("lr 1e-3 (training from scratch; --init fine-tunes at 2e-5)\nstep 1/1, "));
  // One step: the rate it used is the peak rate (no warm-up).
  CHECK(first_line(box.work() / "m.jsonl").at("lr") == 1e-3);
  const TrainRun tuned =
      box.loom(train_args("--steps 1 --init ck/step-00000001 --metrics m.jsonl"));
  REQUIRE(tuned.exit_code == 0);
  CHECK_THAT(
      tuned.err,
      StartsWith("lr 2e-5 (fine-tuning --init; from scratch the default is 1e-3)\nstep 1/1, "));
  CHECK(first_line(box.work() / "m.jsonl").at("lr") == 2e-5);
  // A given --lr is used as it is, without a word.
  const TrainRun given = box.loom(train_args("--steps 1 --lr 5e-4 --metrics m.jsonl"));
  REQUIRE(given.exit_code == 0);
  CHECK_THAT(given.err, StartsWith("step 1/1, "));
  // --json says nothing but JSON on stdout and keeps stderr to the log lines.
  const TrainRun json = box.loom(train_args("--steps 1 --json"));
  CHECK_THAT(json.err, StartsWith("step 1/1, "));
  CHECK(first_line(box.work() / "m.jsonl").at("lr") == 5e-4);
}

TEST_CASE("loom train writes log lines to stderr under a pipe, stdout stays JSON",
          "[tools][cli][train]") {
  TrainSandbox box;
  box.plan();
  const TrainRun r = box.loom_piped(
      train_args("--steps 40 --warmup-steps 0 --log-every 10 --eval-every 20 --metrics m.jsonl "
                 "--json"));
  const nlohmann::json summary = parse_summary(r);
  const std::vector<double> losses = losses_of(summary);
  REQUIRE(losses.size() == 40);
  std::vector<nlohmann::json> evals;
  std::istringstream metrics(read_all(box.work() / "m.jsonl"));
  for (std::string line; std::getline(metrics, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("eval")) evals.push_back(j);
  }
  REQUIRE(evals.size() == 2);  // steps 20 and 40

  auto fixed = [](const char* format, double value) {
    char text[64];
    std::snprintf(text, sizeof text, format, value);
    return std::string(text);
  };
  // 360 training reviews in global batches of 8: 45 steps per epoch.
  auto step_line = [&](int step) {
    return "step " + std::to_string(step) + "/40, epoch " + fixed("%.2f", step / 45.0) + ": loss " +
           fixed("%.4f", losses[static_cast<std::size_t>(step - 1)]) + ", lr " +
           fixed("%.2e", 1e-3 * (40 - (step - 1)) / 40) + ", ";
  };
  auto eval_line = [&](const nlohmann::json& e) {
    const int step = e.at("step");
    return "step " + std::to_string(step) + "/40, epoch " + fixed("%.2f", step / 45.0) +
           ": validation accuracy " + fixed("%.2f", 100 * e.at("accuracy").get<double>()) +
           " %, loss " + fixed("%.4f", e.at("loss").get<double>());
  };
  std::vector<std::string> lines;
  std::istringstream err(r.err);
  for (std::string line; std::getline(err, line);) lines.push_back(line);
  REQUIRE(lines.size() == 6);
  const std::regex tail(R"(\d+\.\d samples/s, ETA \d+:\d\d:\d\d)");
  for (const auto& [index, step] : {std::pair{0, 10}, {1, 20}, {3, 30}, {4, 40}}) {
    const std::string& line = lines[static_cast<std::size_t>(index)];
    INFO(line);
    const std::string head = step_line(step);
    CHECK(line.substr(0, head.size()) == head);
    CHECK(std::regex_match(line.substr(std::min(head.size(), line.size())), tail));
  }
  CHECK(lines[2] == eval_line(evals[0]));
  CHECK(lines[5] == eval_line(evals[1]));
  CHECK(r.err.find('\r') == std::string::npos);  // no progress bar off a terminal

  // --log-every 0: none.
  const TrainRun quiet = box.loom(train_args("--steps 4 --log-every 0 --json"));
  parse_summary(quiet);
  CHECK(quiet.err.empty());
  // The default: about 20 lines per run, here one every 45 / 20 = 2 steps, and the evaluation.
  const TrainRun epoch = box.loom_piped(train_args("--json"));
  parse_summary(epoch);
  CHECK(line_count(epoch.err) == 24);  // steps 2, 4, ..., 44, the last (45) and the evaluation
}
