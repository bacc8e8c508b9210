// The encoder model: forward against a reference written out op by op, Hugging Face names and
// shapes, safetensors round trips and refusals, tensor parallelism simulated with two shards on
// two threads, pipeline stages.
#include <barrier>
#include <cmath>
#include <exception>
#include <filesystem>
#include <map>
#include <thread>

#include "executor/model.hpp"
#include "executor/safetensors.hpp"
#include "executor/torch_compat.hpp"
#include "profiles/errors.hpp"
#include "tests/executor/thread_ranks.hpp"
#include "tests/executor/torch_catch.hpp"

namespace fs = std::filesystem;
using loom::InputError;
using loom::executor::EncoderClassifier;
using loom::executor::EncoderInputs;
using loom::executor::EncoderOptions;
using loom::executor::ParallelContext;
using loom::executor::TensorParallelComm;
using loom::executor::TensorView;
using loom::profiles::ModelSpec;
using loom::profiles::ModelType;

namespace {

ModelSpec tiny_spec(ModelType type, std::int64_t layers = 1) {
  ModelSpec spec;
  spec.name = "tiny";
  spec.model_type = type;
  spec.layers = layers;
  spec.hidden = 8;
  spec.heads = 2;
  spec.ffn_hidden = 16;
  spec.vocab = 20;
  spec.max_positions = 16;
  spec.type_vocab = 2;
  spec.num_labels = 3;
  return spec;
}

EncoderOptions no_dropout(std::uint64_t seed = 7) {
  EncoderOptions options;
  options.dropout = 0.0;
  options.seed = seed;
  return options;
}

// Two sequences of 5 tokens; the second ends with two padding tokens.
EncoderInputs tiny_inputs(std::int64_t pad) {
  EncoderInputs in;
  auto ids = [](const std::vector<std::int64_t>& values) {
    return torch::tensor(values).view({2, 5});
  };
  in.input_ids = ids({3, 7, 11, 5, 9, 4, 13, 8, pad, pad});
  in.attention_mask = ids({1, 1, 1, 1, 1, 1, 1, 1, 0, 0});
  in.token_type_ids = ids({0, 0, 1, 1, 1, 0, 0, 0, 0, 0});
  return in;
}

// Replaces every parameter by random values (so LayerNorm weights and biases are not 1 and 0).
void randomize(EncoderClassifier& model, std::uint64_t seed) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(seed);
  for (auto& [name, p] : model.local_parameters()) p.copy_(torch::randn_like(p) * 0.5);
}

std::map<std::string, torch::Tensor> as_double(EncoderClassifier& model) {
  std::map<std::string, torch::Tensor> w;
  for (auto& [name, t] : model.full_state()) w[name] = t.to(torch::kDouble);
  return w;
}

// --- the reference, one step at a time, in double precision -------------------------------

torch::Tensor ref_linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b) {
  return x.matmul(w.t()) + b;
}

torch::Tensor ref_layer_norm(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                             double eps) {
  const torch::Tensor mean = x.mean(-1, true);
  const torch::Tensor var = (x - mean).pow(2).mean(-1, true);
  return (x - mean) / (var + eps).sqrt() * w + b;
}

torch::Tensor ref_gelu(const torch::Tensor& x) {
  return 0.5 * x * (1.0 + torch::erf(x / std::sqrt(2.0)));
}

torch::Tensor reference_logits(const ModelSpec& spec, std::map<std::string, torch::Tensor>& w,
                               const EncoderInputs& in) {
  const bool roberta = spec.model_type == ModelType::kRoberta;
  const std::string base = roberta ? "roberta." : "bert.";
  const double eps = roberta ? 1e-5 : 1e-12;
  const std::int64_t pad = roberta ? 1 : 0;
  const std::int64_t batch = in.input_ids.size(0);
  const std::int64_t seq = in.input_ids.size(1);
  const std::int64_t h = spec.hidden;
  const std::int64_t hd = h / spec.heads;
  std::vector<torch::Tensor> outputs;
  for (std::int64_t b = 0; b < batch; ++b) {
    // Embeddings, token by token.
    std::vector<torch::Tensor> rows;
    std::int64_t real_so_far = 0;
    for (std::int64_t s = 0; s < seq; ++s) {
      const std::int64_t id = in.input_ids[b][s].item<std::int64_t>();
      std::int64_t position = s;
      if (roberta) {
        if (id != pad) ++real_so_far;
        position = id != pad ? pad + real_so_far : pad;
      }
      const std::int64_t type = in.token_type_ids[b][s].item<std::int64_t>();
      rows.push_back(w[base + "embeddings.word_embeddings.weight"][id] +
                     w[base + "embeddings.position_embeddings.weight"][position] +
                     w[base + "embeddings.token_type_embeddings.weight"][type]);
    }
    torch::Tensor x = ref_layer_norm(torch::stack(rows), w[base + "embeddings.LayerNorm.weight"],
                                     w[base + "embeddings.LayerNorm.bias"], eps);
    for (std::int64_t layer = 0; layer < spec.layers; ++layer) {
      const std::string p = base + "encoder.layer." + std::to_string(layer) + ".";
      const torch::Tensor q =
          ref_linear(x, w[p + "attention.self.query.weight"], w[p + "attention.self.query.bias"]);
      const torch::Tensor k =
          ref_linear(x, w[p + "attention.self.key.weight"], w[p + "attention.self.key.bias"]);
      const torch::Tensor v =
          ref_linear(x, w[p + "attention.self.value.weight"], w[p + "attention.self.value.bias"]);
      torch::Tensor context = torch::zeros({seq, h}, torch::kDouble);
      for (std::int64_t head = 0; head < spec.heads; ++head) {
        for (std::int64_t i = 0; i < seq; ++i) {
          // Scores of query i against every key that is not padding, then a softmax.
          std::vector<double> scores(static_cast<std::size_t>(seq), 0.0);
          double top = -1e300;
          for (std::int64_t j = 0; j < seq; ++j) {
            if (in.attention_mask[b][j].item<std::int64_t>() == 0) continue;
            double dot = 0.0;
            for (std::int64_t d = 0; d < hd; ++d) {
              dot += q[i][head * hd + d].item<double>() * k[j][head * hd + d].item<double>();
            }
            scores[static_cast<std::size_t>(j)] = dot / std::sqrt(static_cast<double>(hd));
            top = std::max(top, scores[static_cast<std::size_t>(j)]);
          }
          double total = 0.0;
          std::vector<double> probs(static_cast<std::size_t>(seq), 0.0);
          for (std::int64_t j = 0; j < seq; ++j) {
            if (in.attention_mask[b][j].item<std::int64_t>() == 0) continue;
            probs[static_cast<std::size_t>(j)] =
                std::exp(scores[static_cast<std::size_t>(j)] - top);
            total += probs[static_cast<std::size_t>(j)];
          }
          for (std::int64_t d = 0; d < hd; ++d) {
            double sum = 0.0;
            for (std::int64_t j = 0; j < seq; ++j) {
              sum +=
                  probs[static_cast<std::size_t>(j)] / total * v[j][head * hd + d].item<double>();
            }
            context[i][head * hd + d] = sum;
          }
        }
      }
      const torch::Tensor attended =
          ref_layer_norm(ref_linear(context, w[p + "attention.output.dense.weight"],
                                    w[p + "attention.output.dense.bias"]) +
                             x,
                         w[p + "attention.output.LayerNorm.weight"],
                         w[p + "attention.output.LayerNorm.bias"], eps);
      const torch::Tensor inner = ref_gelu(ref_linear(attended, w[p + "intermediate.dense.weight"],
                                                      w[p + "intermediate.dense.bias"]));
      x = ref_layer_norm(
          ref_linear(inner, w[p + "output.dense.weight"], w[p + "output.dense.bias"]) + attended,
          w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"], eps);
    }
    const torch::Tensor first = x[0];
    if (roberta) {
      const torch::Tensor z =
          torch::tanh(ref_linear(first, w["classifier.dense.weight"], w["classifier.dense.bias"]));
      outputs.push_back(
          ref_linear(z, w["classifier.out_proj.weight"], w["classifier.out_proj.bias"]));
    } else {
      const torch::Tensor pooled = torch::tanh(
          ref_linear(first, w["bert.pooler.dense.weight"], w["bert.pooler.dense.bias"]));
      outputs.push_back(ref_linear(pooled, w["classifier.weight"], w["classifier.bias"]));
    }
  }
  return torch::stack(outputs);
}

double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
}

std::string temp_path(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / "loom_test_model";
  fs::create_directories(dir);
  return (dir / name).string();
}

// Writes named CPU tensors (F32, F16, BF16 or I64) to a safetensors file.
void write_tensors(const std::string& path,
                   const std::vector<std::pair<std::string, torch::Tensor>>& tensors) {
  std::vector<torch::Tensor> keep;
  std::vector<TensorView> views;
  for (const auto& [name, t0] : tensors) {
    const torch::Tensor t = t0.contiguous();
    keep.push_back(t);
    TensorView view;
    view.name = name;
    switch (t.scalar_type()) {
      case torch::kHalf:
        view.dtype = loom::executor::DType::kF16;
        break;
      case torch::kBFloat16:
        view.dtype = loom::executor::DType::kBF16;
        break;
      case torch::kLong:
        view.dtype = loom::executor::DType::kI64;
        break;
      default:
        view.dtype = loom::executor::DType::kF32;
    }
    view.shape = t.sizes().vec();
    view.data = static_cast<const std::byte*>(t.data_ptr());
    view.size_bytes = static_cast<std::size_t>(t.nbytes());
    views.push_back(view);
  }
  loom::executor::write_safetensors(path, views);
}

// --- an in-process tensor-parallel group: ranks are threads, all-reduce sums their tensors ----

class SharedSum {
 public:
  explicit SharedSum(int ranks) : slots_(static_cast<std::size_t>(ranks)), barrier_(ranks) {}
  void allreduce(int rank, torch::Tensor& tensor) {
    slots_[static_cast<std::size_t>(rank)] = tensor.detach().clone();
    barrier_.arrive_and_wait();
    torch::Tensor sum = slots_[0].clone();  // every rank adds in the same order
    for (std::size_t r = 1; r < slots_.size(); ++r) sum += slots_[r];
    barrier_.arrive_and_wait();  // all ranks have read the slots
    tensor.detach().copy_(sum);
  }

 private:
  std::vector<torch::Tensor> slots_;
  std::barrier<> barrier_;
};

class ThreadComm final : public TensorParallelComm {
 public:
  ThreadComm(int rank, int size, std::shared_ptr<SharedSum> shared)
      : rank_(rank), size_(size), shared_(std::move(shared)) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void allreduce_sum(torch::Tensor& tensor) override { shared_->allreduce(rank_, tensor); }

 private:
  int rank_;
  int size_;
  std::shared_ptr<SharedSum> shared_;
};

using loom::test::run_ranks;

}  // namespace

TEST_CASE("BERT forward equals a step-by-step reference", "[model]") {
  const ModelSpec spec = tiny_spec(ModelType::kBert);
  EncoderClassifier model(spec, no_dropout());
  randomize(model, 11);
  model.eval();
  const EncoderInputs in = tiny_inputs(0);
  const torch::Tensor logits = model.forward(in);
  auto w = as_double(model);
  const torch::Tensor expected = reference_logits(spec, w, in);
  REQUIRE(logits.sizes() == torch::IntArrayRef({2, 3}));
  CHECK(max_abs_diff(logits, expected) < 1e-5);
  // Padding must matter: unmasking the padded keys changes the second sequence's logits.
  EncoderInputs unmasked = in;
  unmasked.attention_mask = torch::ones_like(in.attention_mask);
  const torch::Tensor all_kept = model.forward(unmasked);
  CHECK(max_abs_diff(all_kept[1], logits[1]) > 1e-4);
  // No mask (what loom train passes for a batch without padding) is a mask of all ones.
  EncoderInputs no_mask = in;
  no_mask.attention_mask = torch::Tensor();
  CHECK(max_abs_diff(model.forward(no_mask), all_kept) < 1e-6);
}

TEST_CASE("RoBERTa forward equals a step-by-step reference", "[model]") {
  const ModelSpec spec = tiny_spec(ModelType::kRoberta, 2);
  EncoderClassifier model(spec, no_dropout());
  randomize(model, 12);
  model.eval();
  const EncoderInputs in = tiny_inputs(1);
  auto w = as_double(model);
  CHECK(max_abs_diff(model.forward(in), reference_logits(spec, w, in)) < 1e-5);
}

TEST_CASE("Hugging Face parameter names and shapes", "[model]") {
  using Shape = std::vector<std::int64_t>;
  using Entry = std::pair<std::string, Shape>;
  auto listed = [](EncoderClassifier& model) {
    std::vector<std::pair<std::string, Shape>> out;
    for (const auto& item : model.named_parameters())
      out.emplace_back(item.key(), item.value().sizes().vec());
    return out;
  };
  SECTION("BERT") {
    ModelSpec spec = tiny_spec(ModelType::kBert, 2);
    EncoderClassifier model(spec);
    std::vector<std::pair<std::string, Shape>> expected = {
        {"bert.embeddings.word_embeddings.weight", {20, 8}},
        {"bert.embeddings.position_embeddings.weight", {16, 8}},
        {"bert.embeddings.token_type_embeddings.weight", {2, 8}},
        {"bert.embeddings.LayerNorm.weight", {8}},
        {"bert.embeddings.LayerNorm.bias", {8}}};
    for (int i = 0; i < 2; ++i) {
      const std::string p = "bert.encoder.layer." + std::to_string(i) + ".";
      for (const char* part : {"attention.self.query", "attention.self.key", "attention.self.value",
                               "attention.output.dense"}) {
        expected.push_back({p + part + ".weight", {8, 8}});
        expected.push_back({p + part + ".bias", {8}});
      }
      expected.push_back({p + "attention.output.LayerNorm.weight", {8}});
      expected.push_back({p + "attention.output.LayerNorm.bias", {8}});
      expected.push_back({p + "intermediate.dense.weight", {16, 8}});
      expected.push_back({p + "intermediate.dense.bias", {16}});
      expected.push_back({p + "output.dense.weight", {8, 16}});
      expected.push_back({p + "output.dense.bias", {8}});
      expected.push_back({p + "output.LayerNorm.weight", {8}});
      expected.push_back({p + "output.LayerNorm.bias", {8}});
    }
    expected.push_back({"bert.pooler.dense.weight", {8, 8}});
    expected.push_back({"bert.pooler.dense.bias", {8}});
    expected.push_back({"classifier.weight", {3, 8}});
    expected.push_back({"classifier.bias", {3}});
    CHECK(listed(model) == expected);
    // Initialisation: LayerNorm 1, biases 0, weights ~ N(0, 0.02), the padding row 0.
    torch::NoGradGuard no_grad;
    auto state = model.full_state();
    std::map<std::string, torch::Tensor> w(state.begin(), state.end());
    CHECK(torch::equal(w["bert.embeddings.LayerNorm.weight"], torch::ones({8})));
    CHECK(torch::equal(w["bert.encoder.layer.1.output.dense.bias"], torch::zeros({8})));
    CHECK(torch::equal(w["bert.embeddings.word_embeddings.weight"][0], torch::zeros({8})));
    const double std = w["bert.encoder.layer.0.intermediate.dense.weight"].std().item<double>();
    CHECK(std > 0.012);
    CHECK(std < 0.028);
  }
  SECTION("RoBERTa") {
    ModelSpec spec = tiny_spec(ModelType::kRoberta, 1);
    spec.type_vocab = 1;
    spec.num_labels = 2;
    EncoderClassifier model(spec);
    const auto names = listed(model);
    REQUIRE(names.size() == 5 + 16 + 4);
    CHECK((names[0] == Entry{"roberta.embeddings.word_embeddings.weight", {20, 8}}));
    CHECK((names[2] == Entry{"roberta.embeddings.token_type_embeddings.weight", {1, 8}}));
    CHECK(names[5].first == "roberta.encoder.layer.0.attention.self.query.weight");
    CHECK((names[21] == Entry{"classifier.dense.weight", {8, 8}}));
    CHECK((names[22] == Entry{"classifier.dense.bias", {8}}));
    CHECK((names[23] == Entry{"classifier.out_proj.weight", {2, 8}}));
    CHECK((names[24] == Entry{"classifier.out_proj.bias", {2}}));
    // RoBERTa zeroes the padding row (id 1) of the word and position embeddings.
    auto state = model.full_state();
    CHECK(torch::equal(state[0].second[1], torch::zeros({8})));
    CHECK(torch::equal(state[1].second[1], torch::zeros({8})));
  }
}

TEST_CASE("Initialisation is a function of the seed only", "[model]") {
  const ModelSpec spec = tiny_spec(ModelType::kBert);
  EncoderClassifier a(spec, no_dropout(3));
  EncoderClassifier b(spec, no_dropout(3));
  EncoderClassifier c(spec, no_dropout(4));
  const auto sa = a.full_state();
  const auto sb = b.full_state();
  const auto sc = c.full_state();
  for (std::size_t i = 0; i < sa.size(); ++i) CHECK(torch::equal(sa[i].second, sb[i].second));
  CHECK_FALSE(torch::equal(sa[0].second, sc[0].second));
}

TEST_CASE("safetensors round trip gives identical logits", "[model]") {
  const ModelSpec spec = tiny_spec(ModelType::kBert, 2);
  EncoderClassifier a(spec, no_dropout(1));
  randomize(a, 5);
  a.eval();
  const std::string path = temp_path("roundtrip.safetensors");
  a.save_safetensors(path);
  EncoderClassifier b(spec, no_dropout(2));
  b.eval();
  const EncoderInputs in = tiny_inputs(0);
  REQUIRE_FALSE(torch::equal(a.forward(in), b.forward(in)));
  const auto report = b.load_safetensors(path);
  CHECK(report.initialized.empty());
  CHECK(report.unused.empty());
  CHECK(torch::equal(a.forward(in), b.forward(in)));
}

TEST_CASE("Loading accepts old spellings, bare names, half precision and a missing head",
          "[model]") {
  const ModelSpec spec = tiny_spec(ModelType::kBert);
  EncoderClassifier a(spec, no_dropout(1));
  randomize(a, 6);
  std::vector<std::pair<std::string, torch::Tensor>> file;
  for (auto& [name, t] : a.full_state()) {
    if (name.rfind("classifier.", 0) == 0) continue;  // a base-model checkpoint
    std::string bare = name.substr(std::string("bert.").size());
    for (const auto& [from, to] :
         {std::pair<std::string, std::string>{"LayerNorm.weight", "LayerNorm.gamma"},
          {"LayerNorm.bias", "LayerNorm.beta"}}) {
      const auto at = bare.find(from);
      if (at != std::string::npos) bare.replace(at, from.size(), to);
    }
    file.emplace_back(bare, t.to(torch::kHalf));
  }
  file.emplace_back("embeddings.position_ids", torch::arange(16, torch::kLong).view({1, 16}));
  file.emplace_back("cls.predictions.bias", torch::zeros({20}));
  file.emplace_back("something.else", torch::zeros({2}));
  const std::string path = temp_path("old_style.safetensors");
  write_tensors(path, file);

  EncoderClassifier b(spec, no_dropout(9));
  const auto classifier_before = b.full_state().back().second;
  const auto report = b.load_safetensors(path);
  CHECK((report.initialized == std::vector<std::string>{"classifier.weight", "classifier.bias"}));
  CHECK(report.unused == std::vector<std::string>{"something.else"});
  const auto sa = a.full_state();
  const auto sb = b.full_state();
  for (std::size_t i = 0; i + 2 < sa.size(); ++i) {
    INFO(sa[i].first);
    CHECK(torch::equal(sb[i].second, sa[i].second.to(torch::kHalf).to(torch::kFloat)));
  }
  CHECK(torch::equal(sb.back().second, classifier_before));
}

TEST_CASE("Loading refuses wrongly shaped and missing tensors", "[model]") {
  const ModelSpec spec = tiny_spec(ModelType::kBert);
  EncoderClassifier a(spec, no_dropout(1));
  auto state = a.full_state();
  const std::string bad_name = "bert.encoder.layer.0.attention.self.key.weight";
  SECTION("wrong shape") {
    for (auto& [name, t] : state) {
      if (name == bad_name) t = torch::zeros({8, 4});
    }
    const std::string path = temp_path("bad_shape.safetensors");
    write_tensors(path, state);
    EncoderClassifier b(spec, no_dropout(2));
    const auto before = b.full_state();
    try {
      b.load_safetensors(path);
      FAIL("no InputError");
    } catch (const InputError& e) {
      const std::string what = e.what();
      CHECK(what.find(path) != std::string::npos);
      CHECK(what.find(bad_name) != std::string::npos);
      CHECK(what.find("[8, 8]") != std::string::npos);
      CHECK(what.find("[8, 4]") != std::string::npos);
    }
    // Nothing was half-loaded.
    const auto after = b.full_state();
    for (std::size_t i = 0; i < before.size(); ++i)
      CHECK(torch::equal(before[i].second, after[i].second));
  }
  SECTION("missing") {
    state.erase(std::remove_if(state.begin(), state.end(),
                               [&](const auto& item) { return item.first == bad_name; }),
                state.end());
    const std::string path = temp_path("missing.safetensors");
    write_tensors(path, state);
    EncoderClassifier b(spec, no_dropout(2));
    CHECK_THROWS_AS(b.load_safetensors(path), InputError);
    CHECK_THROWS_WITH(b.load_safetensors(path),
                      Catch::Contains(bad_name) && Catch::Contains("[8, 8]"));
  }
}

TEST_CASE("Specs the model cannot build are refused", "[model]") {
  ModelSpec spec = tiny_spec(ModelType::kGpt2);
  spec.family = loom::profiles::Family::kDecoder;
  CHECK_THROWS_AS(EncoderClassifier(spec), InputError);
  EncoderOptions bad_range;
  bad_range.first_layer = 2;
  bad_range.last_layer = 1;
  CHECK_THROWS_AS(EncoderClassifier(tiny_spec(ModelType::kBert), bad_range), InputError);
  bad_range.first_layer = 0;
  bad_range.last_layer = 3;  // L + 1 = 2
  CHECK_THROWS_AS(EncoderClassifier(tiny_spec(ModelType::kBert), bad_range), InputError);
}

TEST_CASE("Pipeline stages chained give the full model's logits", "[model]") {
  const ModelSpec spec = tiny_spec(ModelType::kRoberta, 3);
  EncoderClassifier full(spec, no_dropout(21));
  EncoderOptions first = no_dropout(21);
  first.last_layer = 1;  // embeddings + layer 0
  EncoderOptions middle = no_dropout(21);
  middle.first_layer = 2;
  middle.last_layer = 3;  // layers 1 and 2
  EncoderOptions last = no_dropout(21);
  last.first_layer = 4;  // the head only
  EncoderClassifier a(spec, first);
  EncoderClassifier b(spec, middle);
  EncoderClassifier c(spec, last);
  CHECK(a.has_embeddings());
  CHECK_FALSE(a.has_head());
  CHECK(c.has_head());
  CHECK(a.local_parameters().size() == 5 + 16);
  CHECK(c.local_parameters().size() == 4);
  const EncoderInputs in = tiny_inputs(1);
  const torch::Tensor hidden = b.forward(in, a.forward(in));
  CHECK(hidden.sizes() == torch::IntArrayRef({2, 5, 8}));
  CHECK(max_abs_diff(c.forward(in, hidden), full.forward(in)) < 1e-6);
}

TEST_CASE("Column- then row-parallel linear over two ranks equals one rank", "[model][tp]") {
  torch::manual_seed(3);
  const torch::Tensor x = torch::randn({3, 4});
  const torch::Tensor a = torch::randn({6, 4});
  const torch::Tensor a_bias = torch::randn({6});
  const torch::Tensor b = torch::randn({5, 6});
  const torch::Tensor b_bias = torch::randn({5});
  const torch::Tensor probe = torch::randn({3, 5});

  // One rank.
  const torch::Tensor x1 = x.clone().requires_grad_(true);
  const torch::Tensor y1 = torch::relu(x1.matmul(a.t()) + a_bias).matmul(b.t()) + b_bias;
  (y1 * probe).sum().backward();

  // Two ranks: rank r holds rows [3r, 3r+3) of A and columns [3r, 3r+3) of B.
  auto shared = std::make_shared<SharedSum>(2);
  std::vector<torch::Tensor> outputs(2);
  std::vector<torch::Tensor> input_grads(2);
  run_ranks(2, [&](int r) {
    auto comm = std::make_shared<ThreadComm>(r, 2, shared);
    const torch::Tensor xr = x.clone().requires_grad_(true);
    const torch::Tensor hidden = torch::relu(loom::executor::column_parallel_linear(
        xr, a.narrow(0, 3 * std::int64_t{r}, 3), a_bias.narrow(0, 3 * std::int64_t{r}, 3), comm));
    const torch::Tensor y = loom::executor::row_parallel_linear(
        hidden, b.narrow(1, 3 * std::int64_t{r}, 3), b_bias, comm);
    (y * probe).sum().backward();
    outputs[static_cast<std::size_t>(r)] = y.detach();
    input_grads[static_cast<std::size_t>(r)] = xr.grad();
  });
  for (int r = 0; r < 2; ++r) {
    CHECK(max_abs_diff(outputs[static_cast<std::size_t>(r)], y1) < 1e-5);
    // f all-reduced the partial input gradients: each rank sees the full one.
    CHECK(max_abs_diff(input_grads[static_cast<std::size_t>(r)], x1.grad()) < 1e-5);
  }
}

TEST_CASE("A 2-way tensor-parallel model equals the single-rank model", "[model][tp]") {
  ModelSpec spec = tiny_spec(ModelType::kBert, 2);
  spec.vocab = 21;  // odd: the vocabulary-parallel word embedding pads rank 1 with one zero row
  const EncoderInputs in = tiny_inputs(0);
  const torch::Tensor probe = torch::tensor({0.3, -1.2, 0.7, 1.1, 0.2, -0.4}).view({2, 3});

  EncoderClassifier single(spec, no_dropout(17));
  const torch::Tensor logits1 = single.forward(in);
  (logits1 * probe).sum().backward();
  std::map<std::string, torch::Tensor> grads1;
  for (auto& [name, p] : single.local_parameters()) grads1[name] = p.grad().clone();
  const auto state1 = single.full_state();

  auto shared = std::make_shared<SharedSum>(2);
  std::vector<torch::Tensor> logits(2);
  std::vector<std::vector<std::pair<std::string, torch::Tensor>>> states(2);
  std::vector<std::map<std::string, torch::Tensor>> grads(2);
  std::vector<std::vector<loom::executor::ParameterInfo>> infos(2);
  std::vector<std::int64_t> storage_bytes(2, 0);
  std::vector<std::int64_t> parameter_bytes(2, 0);
  run_ranks(2, [&](int r) {
    ParallelContext parallel;
    parallel.tp = std::make_shared<ThreadComm>(r, 2, shared);
    EncoderClassifier shard(spec, no_dropout(17), parallel);
    const torch::Tensor y = shard.forward(in);
    (y * probe).sum().backward();
    logits[static_cast<std::size_t>(r)] = y.detach();
    for (auto& [name, p] : shard.local_parameters()) {
      grads[static_cast<std::size_t>(r)][name] = p.grad().clone();
      storage_bytes[static_cast<std::size_t>(r)] += static_cast<std::int64_t>(p.storage().nbytes());
      parameter_bytes[static_cast<std::size_t>(r)] += p.numel() * 4;
    }
    infos[static_cast<std::size_t>(r)] = shard.parameter_infos();
    states[static_cast<std::size_t>(r)] = shard.full_state();  // collective gather
  });
  for (int r = 0; r < 2; ++r) {
    const auto ru = static_cast<std::size_t>(r);
    CHECK(max_abs_diff(logits[ru], logits1) < 1e-5);
    REQUIRE(states[ru].size() == state1.size());
    for (std::size_t i = 0; i < state1.size(); ++i) {
      INFO(state1[i].first);
      CHECK(torch::equal(states[ru][i].second, state1[i].second));  // same weights as tp = 1
    }
    // Each shard's gradients are the matching slices of the single-rank gradients.
    for (const auto& info : infos[ru]) {
      INFO(info.name);
      torch::Tensor expected = grads1[info.name];
      if (info.split == loom::executor::TensorParallelSplit::kRows) {
        const std::int64_t part = (expected.size(0) + 1) / 2;
        const std::int64_t real = std::min(part, expected.size(0) - r * part);
        std::vector<std::int64_t> padding = expected.sizes().vec();
        padding[0] = part - real;
        expected = torch::cat({expected.narrow(0, r * part, real), torch::zeros(padding)});
      } else if (info.split == loom::executor::TensorParallelSplit::kColumns) {
        expected = expected.narrow(1, r * expected.size(1) / 2, expected.size(1) / 2);
      }
      CHECK(max_abs_diff(grads[ru][info.name], expected) < 1e-5);
    }
  }
  // The shards really are halves: query weights have 4 of 8 rows, the word embedding 11 of 21
  // (rank 1: 10 and a zero row of padding).
  CHECK(grads[0]["bert.encoder.layer.0.attention.self.query.weight"].size(0) == 4);
  CHECK(grads[1]["bert.embeddings.word_embeddings.weight"].size(0) == 11);
  CHECK(grads[1]["bert.encoder.layer.0.output.dense.weight"].size(1) == 8);
  // And a shard owns only its slice: no parameter is a view that keeps the full tensor alive.
  CHECK(storage_bytes[0] == parameter_bytes[0]);
  CHECK(storage_bytes[1] == parameter_bytes[1]);
}

TEST_CASE("A tensor-parallel shard loads its slice from a full checkpoint", "[model][tp]") {
  const ModelSpec spec = tiny_spec(ModelType::kRoberta, 1);
  EncoderClassifier single(spec, no_dropout(31));
  randomize(single, 8);
  const std::string path = temp_path("tp_full.safetensors");
  single.save_safetensors(path);
  const EncoderInputs in = tiny_inputs(1);
  single.eval();
  const torch::Tensor expected = single.forward(in);
  auto shared = std::make_shared<SharedSum>(2);
  std::vector<torch::Tensor> logits(2);
  run_ranks(2, [&](int r) {
    ParallelContext parallel;
    parallel.tp = std::make_shared<ThreadComm>(r, 2, shared);
    EncoderClassifier shard(spec, no_dropout(99), parallel);
    shard.load_safetensors(path);
    shard.eval();
    logits[static_cast<std::size_t>(r)] = shard.forward(in);
  });
  CHECK(max_abs_diff(logits[0], expected) < 1e-5);
  CHECK(max_abs_diff(logits[1], expected) < 1e-5);
}

TEST_CASE("The autocast guard casts inside and restores outside", "[model][compat]") {
  const torch::Tensor a = torch::randn({4, 4});
  {
    loom::executor::compat::AutocastGuard guard(c10::DeviceType::CPU, torch::kBFloat16);
    CHECK(torch::mm(a, a).scalar_type() == torch::kBFloat16);
    {
      loom::executor::compat::AutocastGuard off(c10::DeviceType::CPU, torch::kBFloat16, false);
      CHECK(torch::mm(a, a).scalar_type() == torch::kBFloat16);  // a disabled guard changes nothing
    }
  }
  CHECK(torch::mm(a, a).scalar_type() == torch::kFloat);
}

TEST_CASE("Attention masks padded keys", "[model][compat]") {
  torch::manual_seed(4);
  const torch::Tensor q = torch::randn({1, 2, 3, 4});
  const torch::Tensor k = torch::randn({1, 2, 3, 4});
  const torch::Tensor v = torch::randn({1, 2, 3, 4});
  const torch::Tensor keep = torch::tensor({true, true, false}).view({1, 1, 1, 3});
  const torch::Tensor out = loom::executor::compat::attention(q, k, v, keep, 0.0);
  // Without the third key at all, the result is the same.
  const torch::Tensor two = loom::executor::compat::attention(
      q, k.narrow(2, 0, 2), v.narrow(2, 0, 2), torch::Tensor(), 0.0);
  CHECK(max_abs_diff(out, two) < 1e-6);
}
