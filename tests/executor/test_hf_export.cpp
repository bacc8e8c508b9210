// Hugging Face folders from loom train (executor/hf_export.hpp): the --output folder of a dp2, a
// ZeRO-3, a tp2 and a pp2 run gives the logits of the one-process run on the same batches; the
// export of a checkpoint gives the bytes of --output at the same step; config.json reads back as
// the same ModelSpec; --keep-checkpoints; bad checkpoints are refused with nothing written.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "executor/checkpoint.hpp"
#include "executor/distributed.hpp"
#include "executor/hf_export.hpp"
#include "executor/train.hpp"
#include "profiles/errors.hpp"
#include "profiles/loader.hpp"
#include "tests/executor/fixtures.hpp"
#include "tests/executor/thread_ranks.hpp"
#include "tests/executor/torch_catch.hpp"

namespace fs = std::filesystem;
using loom::InputError;
using loom::executor::EncodedExample;
using loom::executor::GroupOptions;
using loom::executor::HfFolder;
using loom::executor::ParallelGroups;
using loom::executor::TrainOptions;
using loom::executor::TrainSummary;
using loom::profiles::ModelSpec;
using loom::profiles::ModelType;

namespace {

std::string bytes_of(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

ModelSpec tiny_model() {
  ModelSpec m;
  m.name = "tiny-bert";
  m.model_type = ModelType::kBert;
  m.layers = 2;
  m.hidden = 16;
  m.heads = 2;
  m.ffn_hidden = 32;
  m.vocab = 32;
  m.max_positions = 16;
  m.type_vocab = 2;
  m.num_labels = 2;
  return m;
}

TrainOptions tiny_options() {
  TrainOptions o;
  o.model = tiny_model();
  o.micro_batch = 2;
  o.steps = 4;
  o.lr = 2e-3;
  o.warmup_steps = 1;
  o.dropout = 0.0;  // the layouts equal the one process only without dropout
  o.seed = 11;
  o.progress = false;
  return o;
}

// The exported folder's logits for `rows`, as `loom logits --init DIR` computes them.
std::vector<std::vector<double>> folder_logits(const fs::path& dir,
                                               const std::vector<EncodedExample>& rows) {
  loom::executor::LogitsRequest r;
  r.model = loom::profiles::load_model((dir / "config.json").string());
  r.weights = (dir / "model.safetensors").string();
  r.source = "test rows";
  for (const EncodedExample& e : rows) {
    r.input_ids.push_back(e.input_ids);
    r.attention_mask.push_back(e.attention_mask);
    r.token_type_ids.push_back(e.token_type_ids);
  }
  return loom::executor::classifier_logits(r);
}

struct Layout {
  const char* name;
  int dp, tp, pp, zero;
  std::int64_t micro_batches;  // per dp rank
};

void train_layout(const Layout& l, TrainOptions o, const std::vector<EncodedExample>& train) {
  o.dp = l.dp;
  o.tp = l.tp;
  o.pp = l.pp;
  o.zero = l.zero;
  o.num_micro_batches = l.micro_batches;
  const auto store = loom::executor::make_local_store();
  GroupOptions options;
  options.timeout = std::chrono::seconds(60);
  loom::test::run_ranks(l.dp * l.tp * l.pp, [&](int rank) {
    ParallelGroups groups(store, rank, l.dp, l.tp, l.pp, options);
    loom::executor::train_classifier(o, train, {}, groups);
  });
}

}  // namespace

TEST_CASE("Every layout's --output folder scores as the one-process run's",
          "[distributed][export]") {
  const loom::test::TempDir tmp("hf-export");
  const auto train = loom::test::synthetic_examples(64, 3);
  const auto rows = loom::test::synthetic_examples(6, 4);
  std::ofstream(tmp.path() / "vocab.txt") << "[PAD]\n[UNK]\n[CLS]\n[SEP]\n";
  TrainOptions base = tiny_options();
  base.tokenizer_files = {(tmp.path() / "vocab.txt").string()};
  base.label_names = {"negative", "positive"};

  // The one-process run of the same global batch (4 micro-batches of 2), and its checkpoint.
  TrainOptions single = base;
  single.num_micro_batches = 4;
  single.output_dir = (tmp.path() / "single").string();
  single.checkpoint_dir = (tmp.path() / "single-ckpt").string();
  loom::executor::train_classifier(single, train, {});
  const auto reference = folder_logits(tmp.path() / "single", rows);
  REQUIRE(reference.size() == 6);
  REQUIRE(reference[0].size() == 2);
  // Training moved the logits away from the seeded initialisation's, so equal logits say more
  // than "nothing was trained".
  loom::executor::LogitsRequest initial;
  initial.model = tiny_model();
  initial.seed = 11;
  initial.source = "test rows";
  for (const EncodedExample& e : rows) initial.input_ids.push_back(e.input_ids);
  initial.attention_mask = {};
  for (const EncodedExample& e : rows) initial.attention_mask.push_back(e.attention_mask);
  CHECK(std::abs(loom::executor::classifier_logits(initial)[0][0] - reference[0][0]) > 1e-3);
  // A one-rank step folder is a Hugging Face folder itself, and exports to --output's bytes.
  const fs::path single_step = tmp.path() / "single-ckpt" / loom::executor::step_folder(4);
  CHECK(fs::exists(single_step / "config.json"));
  CHECK(fs::exists(single_step / "vocab.txt"));
  loom::executor::export_checkpoint((tmp.path() / "single-ckpt").string(),
                                    tmp.path() / "single-export", {});
  CHECK(bytes_of(tmp.path() / "single-export" / "model.safetensors") ==
        bytes_of(tmp.path() / "single" / "model.safetensors"));

  const nlohmann::json config =
      nlohmann::json::parse(bytes_of(tmp.path() / "single" / "config.json"));
  CHECK(config["architectures"] == nlohmann::json::array({"BertForSequenceClassification"}));
  CHECK(config["id2label"] == nlohmann::json{{"0", "negative"}, {"1", "positive"}});
  CHECK(config["label2id"] == nlohmann::json{{"negative", 0}, {"positive", 1}});
  CHECK(bytes_of(tmp.path() / "single" / "vocab.txt") == bytes_of(tmp.path() / "vocab.txt"));

  const std::vector<Layout> layouts = {
      {"dp2", 2, 1, 1, 0, 2},
      {"dp2-zero3", 2, 1, 1, 3, 2},
      {"tp2", 1, 2, 1, 0, 4},
      {"pp2", 1, 1, 2, 0, 4},
  };
  for (const Layout& l : layouts) {
    INFO(l.name);
    const fs::path out = tmp.path() / l.name / "out";
    const fs::path ckpt = tmp.path() / l.name / "ckpt";
    TrainOptions o = base;
    o.output_dir = out.string();
    o.checkpoint_dir = ckpt.string();
    train_layout(l, o, train);
    const auto logits = folder_logits(out, rows);
    REQUIRE(logits.size() == reference.size());
    for (std::size_t i = 0; i < logits.size(); ++i) {
      for (std::size_t k = 0; k < 2; ++k) CHECK(std::abs(logits[i][k] - reference[i][k]) <= 1e-5);
    }
    CHECK(bytes_of(out / "config.json") == bytes_of(tmp.path() / "single" / "config.json"));
    CHECK(bytes_of(out / "vocab.txt") == bytes_of(tmp.path() / "vocab.txt"));
    // The many-rank step folder: config.json and the tokenizer, rank files, no model file; its
    // export is --output at the same step, byte for byte.
    const fs::path step = ckpt / loom::executor::step_folder(4);
    CHECK(fs::exists(step / "config.json"));
    CHECK(fs::exists(step / "vocab.txt"));
    CHECK(fs::exists(step / "rank-1.pt"));
    CHECK_FALSE(fs::exists(step / "model.safetensors"));
    const fs::path exported = tmp.path() / l.name / "exported";
    loom::executor::export_checkpoint(ckpt.string(), exported, {});
    CHECK(bytes_of(exported / "model.safetensors") == bytes_of(out / "model.safetensors"));
    CHECK(bytes_of(exported / "config.json") == bytes_of(out / "config.json"));
    CHECK(bytes_of(exported / "vocab.txt") == bytes_of(tmp.path() / "vocab.txt"));
  }

  SECTION("a many-rank checkpoint without one rank's file is refused, nothing written") {
    const fs::path step = tmp.path() / "dp2" / "ckpt" / loom::executor::step_folder(4);
    fs::remove(step / "rank-1.pt");
    const fs::path out = tmp.path() / "broken";
    CHECK_THROWS_WITH(loom::executor::export_checkpoint(step.string(), out, {}),
                      Catch::Contains("rank-1.pt") && Catch::Contains("rank 1"));
    CHECK_FALSE(fs::exists(out));
  }
}

TEST_CASE("export refuses what is no checkpoint and an output folder of other files", "[export]") {
  const loom::test::TempDir tmp("hf-export");
  fs::create_directories(tmp.path() / "empty");
  const fs::path out = tmp.path() / "out";
  CHECK_THROWS_AS(loom::executor::export_checkpoint((tmp.path() / "empty").string(), out, {}),
                  InputError);
  CHECK_THROWS_AS(loom::executor::export_checkpoint((tmp.path() / "missing").string(), out, {}),
                  InputError);
  CHECK_FALSE(fs::exists(out));

  const auto train = loom::test::synthetic_examples(16, 5);
  TrainOptions o = tiny_options();
  o.checkpoint_dir = (tmp.path() / "ckpt").string();
  o.output_dir = (tmp.path() / "busy").string();
  fs::create_directories(tmp.path() / "busy");
  std::ofstream(tmp.path() / "busy" / "notes.txt") << "mine\n";
  // Refused before training, naming --output; the folder keeps its file.
  CHECK_THROWS_WITH(loom::executor::train_classifier(o, train, {}), Catch::Contains("--output"));
  CHECK(fs::exists(tmp.path() / "busy" / "notes.txt"));
  // A model folder Loom did not write (a Hub clone: config.json beside a README) is not replaced.
  fs::create_directories(tmp.path() / "hub");
  std::ofstream(tmp.path() / "hub" / "config.json") << "{}\n";
  std::ofstream(tmp.path() / "hub" / "README.md") << "model card\n";
  o.output_dir = (tmp.path() / "hub").string();
  CHECK_THROWS_WITH(loom::executor::train_classifier(o, train, {}), Catch::Contains("README.md"));
  CHECK(fs::exists(tmp.path() / "hub" / "README.md"));
  o.output_dir.clear();
  o.label_names = {"only-one"};
  CHECK_THROWS_WITH(loom::executor::train_classifier(o, train, {}), Catch::Contains("labels"));
  // Many ranks: world rank 0's refusal ends every rank at once (none waits for it in a step).
  o.label_names.clear();
  o.output_dir = (tmp.path() / "busy").string();
  const auto started = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(train_layout({"dp2", 2, 1, 1, 0, 1}, o, train), Catch::Contains("--output"));
  CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(30));
}

TEST_CASE("config.json reads back as the same ModelSpec", "[export]") {
  const loom::test::TempDir tmp("hf-export");
  HfFolder f;
  f.model = tiny_model();
  f.model.name = "tiny-roberta";
  f.model.model_type = ModelType::kRoberta;
  f.model.type_vocab = 1;
  f.model.num_labels = 3;
  const fs::path path = tmp.path() / "config.json";
  std::ofstream(path) << loom::executor::hf_config(f).dump(2);
  CHECK(loom::profiles::load_model(path.string()) == f.model);
  const nlohmann::json c = nlohmann::json::parse(bytes_of(path));
  CHECK(c["architectures"] == nlohmann::json::array({"RobertaForSequenceClassification"}));
  CHECK(c["pad_token_id"] == 1);
  CHECK(c["layer_norm_eps"].get<double>() == 1e-5);
  CHECK(c["id2label"] == nlohmann::json{{"0", "LABEL_0"}, {"1", "LABEL_1"}, {"2", "LABEL_2"}});
  CHECK_FALSE(c.contains("num_labels"));

  // From an --init config: its other fields stay, its labels too when they are num_labels.
  f.model.model_type = ModelType::kBert;
  f.model.type_vocab = 2;
  f.base_config = {{"model_type", "bert"},      {"architectures", {"BertForMaskedLM"}},
                   {"initializer_range", 0.05}, {"hidden_act", "gelu_new"},
                   {"num_labels", 7},           {"id2label", {{"0", "a"}, {"1", "b"}, {"2", "c"}}}};
  std::ofstream(path) << loom::executor::hf_config(f).dump(2);
  CHECK(loom::profiles::load_model(path.string()) == f.model);
  const nlohmann::json d = nlohmann::json::parse(bytes_of(path));
  CHECK(d["initializer_range"] == 0.05);
  // The activation is the model's, which Loom trained with: the exact GeLU.
  CHECK(d["hidden_act"] == "gelu");
  CHECK(d["architectures"] == nlohmann::json::array({"BertForSequenceClassification"}));
  CHECK(d["label2id"] == nlohmann::json{{"a", 0}, {"b", 1}, {"c", 2}});
  CHECK(d["layer_norm_eps"].get<double>() == 1e-12);
}

TEST_CASE(
    "Checkpointing with --keep-checkpoints K keeps the newest K step folders, 0 keeps every one",
    "[export]") {
  const loom::test::TempDir tmp("hf-export");
  const auto train = loom::test::synthetic_examples(16, 6);
  auto steps_in = [](const fs::path& dir) {
    std::vector<std::int64_t> steps;
    for (const auto& entry : fs::directory_iterator(dir)) {
      steps.push_back(loom::executor::folder_step(entry.path().filename().string()));
    }
    std::sort(steps.begin(), steps.end());
    return steps;
  };
  TrainOptions o = tiny_options();
  o.checkpoint_every = 1;
  o.checkpoint_dir = (tmp.path() / "all").string();
  loom::executor::train_classifier(o, train, {});
  CHECK(steps_in(tmp.path() / "all") == std::vector<std::int64_t>{1, 2, 3, 4});
  o.checkpoint_dir = (tmp.path() / "two").string();
  o.keep_checkpoints = 2;
  loom::executor::train_classifier(o, train, {});
  CHECK(steps_in(tmp.path() / "two") == std::vector<std::int64_t>{3, 4});
  CHECK(loom::executor::latest_checkpoint(o.checkpoint_dir) ==
        (tmp.path() / "two" / loom::executor::step_folder(4)).string());
  // Resuming finds the latest and goes on keeping two.
  o.steps = 6;
  o.resume = true;
  const TrainSummary s = loom::executor::train_classifier(o, train, {});
  CHECK(s.resumed_from_step == 4);
  CHECK(steps_in(tmp.path() / "two") == std::vector<std::int64_t>{5, 6});
}
