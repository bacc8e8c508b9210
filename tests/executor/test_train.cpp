// The single-rank training loop: learning a synthetic task, exact resume, gradient accumulation,
// the learning-rate schedule, metrics lines and refusals.
#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "executor/flat_adamw.hpp"
#include "executor/train.hpp"
#include "profiles/errors.hpp"
#include "tests/executor/fixtures.hpp"

namespace fs = std::filesystem;
using loom::InputError;
using loom::executor::EncodedExample;
using loom::executor::TrainOptions;
using loom::executor::TrainSummary;
using loom::profiles::ModelSpec;
using loom::profiles::ModelType;

namespace {

ModelSpec small_spec(std::int64_t layers, std::int64_t hidden, std::int64_t heads) {
  ModelSpec spec;
  spec.name = "synthetic";
  spec.model_type = ModelType::kBert;
  spec.layers = layers;
  spec.hidden = hidden;
  spec.heads = heads;
  spec.ffn_hidden = 2 * hidden;
  spec.vocab = 32;
  spec.max_positions = 16;
  spec.type_vocab = 2;
  spec.num_labels = 2;
  return spec;
}

fs::path fresh_dir(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / "loom_test_train" / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::vector<nlohmann::json> read_lines(const fs::path& path) {
  std::ifstream in(path);
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

TrainOptions tiny_options() {
  TrainOptions o;
  o.model = small_spec(1, 16, 2);
  o.micro_batch = 4;
  o.num_micro_batches = 2;
  o.steps = 20;
  o.lr = 1e-3;
  o.warmup_steps = 3;
  o.dropout = 0.1;  // so that resuming must restore the RNG
  o.seed = 5;
  o.progress = false;
  return o;
}

}  // namespace

TEST_CASE("A tiny encoder learns whether a token appears", "[train]") {
  const auto train = loom::test::synthetic_examples(512, 1);
  const auto validation = loom::test::synthetic_examples(256, 2);
  TrainOptions o;
  o.model = small_spec(2, 64, 4);
  o.micro_batch = 16;
  o.num_micro_batches = 2;
  o.epochs = 6;  // 16 steps per epoch
  o.lr = 1e-3;
  o.warmup_steps = 10;
  o.dropout = 0.0;
  o.seed = 1;
  o.progress = false;
  const fs::path dir = fresh_dir("learn");
  o.metrics_path = (dir / "metrics.jsonl").string();
  o.eval_every = 48;
  const auto started = std::chrono::steady_clock::now();
  const TrainSummary s = loom::executor::train_classifier(o, train, validation);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  INFO("training took " << seconds << " s, accuracy " << s.validation_accuracy.value_or(-1));
  CHECK(s.steps == 96);
  CHECK(s.total_steps == 96);
  REQUIRE(s.validation_accuracy);
  CHECK(*s.validation_accuracy >= 0.95);
  CHECK(s.final_loss < s.losses.front());
  CHECK(s.median_step_time_s > 0.0);
  CHECK(s.samples_per_s > 0.0);
  CHECK(s.precision == "fp32");
  CHECK(seconds < 60.0);

  // Metrics: one line per step with the spec's fields in the spec's order, and evaluations at
  // steps 48 and 96 (the end, not twice).
  const auto lines = read_lines(o.metrics_path);
  std::vector<nlohmann::json> steps;
  std::vector<nlohmann::json> evals;
  for (const auto& line : lines) (line.contains("eval") ? evals : steps).push_back(line);
  REQUIRE(steps.size() == 96);
  REQUIRE(evals.size() == 2);
  CHECK(evals[0]["step"] == 48);
  CHECK(evals[1]["step"] == 96);
  CHECK(evals[1]["accuracy"].get<double>() == Approx(*s.validation_accuracy));
  const nlohmann::json& first = steps.front();
  CHECK(first["step"] == 1);
  CHECK(first["epoch"] == 0);
  CHECK(steps.back()["epoch"] == 5);
  CHECK(first["rank"] == 0);
  CHECK(first["peak_memory_bytes"].get<std::int64_t>() > 0);
  CHECK(first["loss"].get<double>() == Approx(s.losses.front()));
  const std::string time = first["time"];
  CHECK(time.size() == 20);
  CHECK(time.back() == 'Z');
  std::ifstream raw(o.metrics_path);
  std::string text;
  std::getline(raw, text);
  const auto key_at = [&](const char* key) { return text.find(std::string("\"") + key + "\""); };
  CHECK(key_at("step") < key_at("epoch"));
  CHECK(key_at("epoch") < key_at("loss"));
  CHECK(key_at("loss") < key_at("lr"));
  CHECK(key_at("lr") < key_at("samples_per_s"));
  CHECK(key_at("samples_per_s") < key_at("step_time_s"));
  CHECK(key_at("step_time_s") < key_at("peak_memory_bytes"));
  CHECK(key_at("peak_memory_bytes") < key_at("rank"));
  CHECK(key_at("rank") < key_at("time"));
  CHECK(key_at("time") < key_at("peak_rss_bytes"));  // extensions after the spec's fields
  CHECK(key_at("peak_rss_bytes") < key_at("phases_s"));
  CHECK(first.size() == 11);
  CHECK(evals[0].size() == 5);
  CHECK(evals[0]["split"] == "validation");  // TrainOptions::eval_split_name's default
}

TEST_CASE("Resuming from a checkpoint reproduces the uninterrupted losses exactly", "[train]") {
  const auto train = loom::test::synthetic_examples(64, 3);
  const auto validation = loom::test::synthetic_examples(16, 4);
  const fs::path dir = fresh_dir("resume");

  TrainOptions straight = tiny_options();
  const TrainSummary whole = loom::executor::train_classifier(straight, train, validation);
  REQUIRE(whole.losses.size() == 20);

  TrainOptions first = tiny_options();
  first.checkpoint_dir = (dir / "ckpt").string();
  first.checkpoint_every = 5;
  first.stop_after_step = 10;
  first.metrics_path = (dir / "metrics.jsonl").string();
  const TrainSummary head = loom::executor::train_classifier(first, train, validation);
  REQUIRE(head.losses.size() == 10);
  CHECK_FALSE(head.validation_accuracy);  // interrupted: no final evaluation
  // Every step folder is kept (keep_checkpoints 0), nothing temporary is left behind.
  std::vector<std::string> entries;
  for (const auto& e : fs::directory_iterator(first.checkpoint_dir)) {
    entries.push_back(e.path().filename().string());
  }
  std::sort(entries.begin(), entries.end());
  REQUIRE(entries == std::vector<std::string>{"step-00000005", "step-00000010"});
  const fs::path ckpt = fs::path(first.checkpoint_dir) / "step-00000010";
  for (const char* file : {"model.safetensors", "optimizer.pt", "rng.pt", "trainer_state.json"}) {
    CHECK(fs::exists(ckpt / file));
  }
  CHECK(loom::executor::latest_checkpoint(first.checkpoint_dir) == ckpt.string());

  TrainOptions second = first;
  second.stop_after_step = 0;
  second.resume = true;
  const TrainSummary tail = loom::executor::train_classifier(second, train, validation);
  REQUIRE(tail.resumed_from_step == 10);
  REQUIRE(tail.losses.size() == 10);
  CHECK(tail.steps == 20);
  for (std::size_t i = 0; i < 10; ++i) {
    INFO("step " << i + 1);
    CHECK(head.losses[i] == whole.losses[i]);
    INFO("step " << i + 11);
    CHECK(tail.losses[i] == whole.losses[i + 10]);  // bit-identical
  }
  CHECK(tail.validation_accuracy == whole.validation_accuracy);
  CHECK(tail.validation_loss == whole.validation_loss);
  // The resumed run appended to the metrics file: 20 step lines and one evaluation.
  CHECK(read_lines(first.metrics_path).size() == 21);

  // A checkpoint made with another seed is refused.
  TrainOptions other = second;
  other.seed = 6;
  CHECK_THROWS_AS(loom::executor::train_classifier(other, train, validation), InputError);
}

TEST_CASE("Gradient accumulation averages over the global batch", "[train]") {
  const auto train = loom::test::synthetic_examples(64, 5);
  TrainOptions accumulated = tiny_options();
  accumulated.dropout = 0.0;
  accumulated.steps = 4;
  accumulated.micro_batch = 4;
  accumulated.num_micro_batches = 4;
  TrainOptions one = accumulated;
  one.micro_batch = 16;
  one.num_micro_batches = 1;
  const TrainSummary a = loom::executor::train_classifier(accumulated, train, {});
  const TrainSummary b = loom::executor::train_classifier(one, train, {});
  REQUIRE(a.losses.size() == 4);
  for (std::size_t i = 0; i < 4; ++i) CHECK(a.losses[i] == Approx(b.losses[i]).epsilon(1e-5));
  CHECK(a.losses[3] != Approx(a.losses[0]).epsilon(1e-6));  // the model did change
}

TEST_CASE("Recomputation gives the losses and memory of the plain backward pass", "[train]") {
  // With dropout on, so the recomputed forward must draw the same masks again; the losses of
  // 6 steps (each after the previous step's update) then equal the plain run's to float rounding
  // (the recomputed ops are the same kernels on the same inputs).
  const auto train = loom::test::synthetic_examples(64, 9);
  TrainOptions plain = tiny_options();
  plain.model = small_spec(3, 32, 4);
  plain.steps = 6;
  plain.dropout = 0.2;
  const TrainSummary none = loom::executor::train_classifier(plain, train, {});
  for (auto recompute :
       {loom::costmodel::Recompute::kFull, loom::costmodel::Recompute::kSelective}) {
    INFO(loom::costmodel::to_string(recompute));
    TrainOptions o = plain;
    o.recompute = recompute;
    const TrainSummary r = loom::executor::train_classifier(o, train, {});
    REQUIRE(r.losses.size() == none.losses.size());
    for (std::size_t i = 0; i < r.losses.size(); ++i) {
      CHECK(r.losses[i] == Approx(none.losses[i]).epsilon(1e-6));
    }
    // Keeping only layer inputs needs less memory at the peak.
    CHECK(r.peak_memory_bytes < none.peak_memory_bytes);
  }
  CHECK(none.peak_memory_bytes > 0);
}

TEST_CASE("Recomputing the first layer of three keeps the others' activations", "[train]") {
  // The losses are the plain run's; the peak lies between the plain run's and full
  // recomputation's, as the cost model blends them (costmodel::recompute_share).
  const auto train = loom::test::synthetic_examples(64, 9);
  TrainOptions plain = tiny_options();
  plain.model = small_spec(3, 32, 4);
  plain.steps = 4;
  plain.dropout = 0.2;
  const TrainSummary none = loom::executor::train_classifier(plain, train, {});
  TrainOptions o = plain;
  o.recompute = loom::costmodel::Recompute::kFull;
  const TrainSummary full = loom::executor::train_classifier(o, train, {});
  o.recompute_layers = 1;
  const TrainSummary part = loom::executor::train_classifier(o, train, {});
  REQUIRE(part.losses.size() == none.losses.size());
  for (std::size_t i = 0; i < part.losses.size(); ++i) {
    CHECK(part.losses[i] == Approx(none.losses[i]).epsilon(1e-6));
  }
  INFO("none " << none.peak_memory_bytes << " part " << part.peak_memory_bytes << " full "
               << full.peak_memory_bytes);
  REQUIRE(part.peak_memory_bytes < none.peak_memory_bytes);
  REQUIRE(part.peak_memory_bytes > full.peak_memory_bytes);
}

TEST_CASE("The learning rate follows linear warm-up and decay", "[train]") {
  const auto train = loom::test::synthetic_examples(32, 6);
  const fs::path dir = fresh_dir("schedule");
  TrainOptions o = tiny_options();
  o.steps = 6;
  o.warmup_steps = 2;
  o.lr = 1e-3;
  o.metrics_path = (dir / "metrics.jsonl").string();
  loom::executor::train_classifier(o, train, {});
  const auto lines = read_lines(o.metrics_path);
  REQUIRE(lines.size() == 6);
  const std::vector<double> expected = {0.0, 5e-4, 1e-3, 7.5e-4, 5e-4, 2.5e-4};
  for (std::size_t i = 0; i < 6; ++i) CHECK(lines[i]["lr"].get<double>() == Approx(expected[i]));
  CHECK(lines[5]["epoch"] == 1);  // 4 steps of 8 examples per epoch
}

TEST_CASE("The one-rank AdamW step is torch::optim::AdamW's, in chunks, with its state",
          "[train][optimizer]") {
  // Parameters of several sizes (the largest, 1000, bounds a chunk at 2000 elements, so the
  // lists go in more than one chunk) in a decaying and a non-decaying group, as make_optimizer.
  torch::manual_seed(3);
  const std::vector<std::int64_t> sizes = {1000, 10, 300, 700, 5, 900, 40};
  std::vector<torch::Tensor> a, b;
  for (std::int64_t n : sizes) {
    a.push_back(torch::randn({n}).requires_grad_(true));
    b.push_back(a.back().detach().clone().requires_grad_(true));
  }
  auto make = [](const std::vector<torch::Tensor>& p) {
    auto options = [](double decay) {
      return torch::optim::AdamWOptions(1e-2).betas({0.9, 0.999}).eps(1e-8).weight_decay(decay);
    };
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(std::vector<torch::Tensor>{p[0], p[2], p[3], p[5]},
                        std::make_unique<torch::optim::AdamWOptions>(options(0.01)));
    groups.emplace_back(std::vector<torch::Tensor>{p[1], p[4], p[6]},
                        std::make_unique<torch::optim::AdamWOptions>(options(0.0)));
    return std::make_unique<torch::optim::AdamW>(groups, options(0.01));
  };
  auto reference = make(a);
  auto chunked = make(b);
  auto set_grads = [&](int step) {
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      // Parameter 4 misses step 2, so its step count lags the others' from then on.
      const bool skip = step == 2 && i == 4;
      torch::Tensor g = torch::randn({sizes[i]});
      a[i].mutable_grad() = skip ? torch::Tensor() : g.clone();
      b[i].mutable_grad() = skip ? torch::Tensor() : g.clone();
    }
  };
  auto same = [&] {
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      INFO("parameter " << i);
      CHECK(torch::equal(a[i], b[i]));
    }
  };
  for (int step = 1; step <= 3; ++step) {
    set_grads(step);
    reference->step();
    loom::executor::adamw_step(*chunked);
    same();
  }
  // The state sits where torch::optim::AdamW looks for it: its own step continues from it.
  set_grads(4);
  reference->step();
  chunked->step();
  same();
  // And it saves and loads as torch::optim::AdamW's.
  const fs::path file = fresh_dir("adamw") / "optimizer.pt";
  torch::save(*chunked, file.string());
  std::vector<torch::Tensor> c;
  for (const torch::Tensor& t : b) c.push_back(t.detach().clone().requires_grad_(true));
  auto loaded = make(c);
  torch::load(*loaded, file.string());
  set_grads(5);
  for (std::size_t i = 0; i < sizes.size(); ++i) c[i].mutable_grad() = b[i].grad().clone();
  loom::executor::adamw_step(*chunked);
  loom::executor::adamw_step(*loaded);
  reference->step();
  same();
  for (std::size_t i = 0; i < sizes.size(); ++i) CHECK(torch::equal(b[i], c[i]));
}

TEST_CASE("One-rank clipping is clip_grad_norm_'s, on the device", "[train][optimizer]") {
  // Gradients 3 3 3 3 and 4 4 4 4: norms 6 and 8, total 10; a parameter without one is left out.
  std::vector<torch::Tensor> p = {torch::zeros({4}).requires_grad_(true),
                                  torch::zeros({2, 2}).requires_grad_(true),
                                  torch::zeros({3}).requires_grad_(true)};
  auto reset = [&] {
    p[0].mutable_grad() = torch::full({4}, 3.0);
    p[1].mutable_grad() = torch::full({2, 2}, 4.0);
  };
  reset();
  torch::Tensor norm = loom::executor::clip_gradients(p, 5.0);
  CHECK(norm.dim() == 0);
  CHECK(norm.item<double>() == Approx(10.0).epsilon(1e-7));
  CHECK(p[0].grad()[0].item<double>() == Approx(1.5).epsilon(1e-6));
  CHECK(p[1].grad()[1][1].item<double>() == Approx(2.0).epsilon(1e-6));
  CHECK_FALSE(p[2].grad().defined());
  // A norm under the limit, or no limit, leaves the gradients as they were.
  for (double limit : {20.0, 0.0}) {
    reset();
    norm = loom::executor::clip_gradients(p, limit);
    CHECK(norm.item<double>() == Approx(10.0).epsilon(1e-7));
    CHECK(torch::equal(p[0].grad(), torch::full({4}, 3.0)));
    CHECK(torch::equal(p[1].grad(), torch::full({2, 2}, 4.0)));
  }
}

TEST_CASE("Bad options and data are refused with InputError", "[train]") {
  const auto train = loom::test::synthetic_examples(32, 7);
  TrainOptions o = tiny_options();
  SECTION("neither steps nor epochs") {
    o.steps = 0;
    CHECK_THROWS_AS(loom::executor::train_classifier(o, train, {}), InputError);
  }
  SECTION("a token outside the vocabulary") {
    auto bad = train;
    bad[3].input_ids[2] = 40;
    CHECK_THROWS_WITH(loom::executor::train_classifier(o, bad, {}),
                      Catch::Contains("training data") && Catch::Contains("example 3"));
  }
  SECTION("a label outside the head") {
    auto bad = train;
    bad[0].label = 2;
    CHECK_THROWS_AS(loom::executor::train_classifier(o, train, bad), InputError);
  }
  SECTION("sequences longer than the positions") {
    o.model.max_positions = 8;
    CHECK_THROWS_WITH(loom::executor::train_classifier(o, train, {}),
                      Catch::Contains("max_positions"));
  }
  SECTION("fewer examples than a global batch") {
    o.micro_batch = 64;
    CHECK_THROWS_AS(loom::executor::train_classifier(o, train, {}), InputError);
  }
  SECTION("resume without a checkpoint directory") {
    o.resume = true;
    CHECK_THROWS_AS(loom::executor::train_classifier(o, train, {}), InputError);
  }
  SECTION("cuda where LibTorch has none") {
    o.device = loom::executor::Device::kCuda;
    o.steps = 1;
    try {
      loom::executor::train_classifier(o, train, {});  // a CUDA build with a GPU trains
    } catch (const InputError& e) {
      CHECK(std::string(e.what()).find("cuda") != std::string::npos);
    }
  }
}
