// Megatron sequence parallelism and the attention kernels in the executor: the sequence
// collectives and their gradients by hand, a tp2 + sp model against the tp2 model (logits and
// every shard's gradient, with and without recomputation), and the refusals of plans this build
// or this data cannot run. Ranks are threads over Gloo on an in-process store. The whole-run
// equality with the single process is the gold test (test_distributed.cpp).
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "executor/distributed.hpp"
#include "executor/model.hpp"
#include "executor/train.hpp"
#include "profiles/errors.hpp"
#include "tests/executor/thread_ranks.hpp"
#include "tests/executor/torch_catch.hpp"

using loom::InputError;
using loom::costmodel::Attention;
using loom::costmodel::Recompute;
using loom::executor::EncodedExample;
using loom::executor::EncoderClassifier;
using loom::executor::EncoderInputs;
using loom::executor::EncoderOptions;
using loom::executor::GroupOptions;
using loom::executor::GroupTensorParallelComm;
using loom::executor::make_local_store;
using loom::executor::ParallelContext;
using loom::executor::ParallelGroups;
using loom::executor::TrainOptions;
using loom::profiles::ModelSpec;
using loom::profiles::ModelType;
using loom::test::run_ranks;

namespace {

GroupOptions quick() {
  GroupOptions o;
  o.timeout = std::chrono::seconds(30);
  return o;
}

double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
}

ModelSpec small_spec(ModelType type) {
  ModelSpec spec;
  spec.name = "small";
  spec.model_type = type;
  spec.layers = 2;
  spec.hidden = 16;
  spec.heads = 4;
  spec.ffn_hidden = 32;
  spec.vocab = 21;  // odd: rank 1's vocabulary shard has a zero row of padding
  spec.max_positions = 16;
  spec.type_vocab = 2;
  spec.num_labels = 3;
  return spec;
}

// Two rows of 8 tokens; the second has 3 padding tokens (id = the padding id of `type`).
EncoderInputs small_inputs(ModelType type) {
  const int pad = type == ModelType::kRoberta ? 1 : 0;
  EncoderInputs in;
  in.input_ids =
      torch::tensor({2, 5, 9, 13, 4, 20, 7, 3, 2, 11, 6, 17, 3, pad, pad, pad}, torch::kLong)
          .view({2, 8});
  in.attention_mask =
      torch::tensor({1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0}, torch::kLong).view({2, 8});
  in.token_type_ids =
      torch::tensor({0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1, 1, 1}, torch::kLong).view({2, 8});
  return in;
}

// What one rank of a run computed: the logits and its local parameters' gradients.
struct RankResult {
  torch::Tensor logits;
  std::vector<std::pair<std::string, torch::Tensor>> grads;
};

// Runs the model on `tp` thread ranks (training mode, dropout 0, the loss sum(logits * probe)).
std::vector<RankResult> run_tp(const ModelSpec& spec, int tp, bool sp, Recompute recompute) {
  const EncoderInputs in = small_inputs(spec.model_type);
  const torch::Tensor probe = torch::linspace(-1.0, 1.0, 2 * *spec.num_labels).view({2, -1});
  const auto store = make_local_store();
  std::vector<RankResult> results(static_cast<std::size_t>(tp));
  run_ranks(tp, [&](int r) {
    ParallelGroups groups(store, r, 1, tp, 1, quick());
    ParallelContext parallel;
    parallel.tp = std::make_shared<GroupTensorParallelComm>(groups.tp_group());
    EncoderOptions options;
    options.dropout = 0.0;
    options.seed = 5;
    options.recompute = recompute;
    options.sequence_parallel = sp;
    EncoderClassifier model(spec, options, parallel);
    model.train();
    const torch::Tensor logits = model.forward(in);
    (logits * probe).sum().backward();
    RankResult& mine = results[static_cast<std::size_t>(r)];
    mine.logits = logits.detach();
    for (const auto& [name, p] : model.local_parameters()) {
      mine.grads.emplace_back(name, p.grad().clone());
    }
  });
  return results;
}

void check_same(const std::vector<RankResult>& got, const std::vector<RankResult>& want) {
  REQUIRE(got.size() == want.size());
  for (std::size_t r = 0; r < got.size(); ++r) {
    INFO("tp rank " << r);
    CHECK(max_abs_diff(got[r].logits, want[r].logits) < 1e-5);
    REQUIRE(got[r].grads.size() == want[r].grads.size());
    for (std::size_t i = 0; i < got[r].grads.size(); ++i) {
      INFO(got[r].grads[i].first);
      CHECK(got[r].grads[i].first == want[r].grads[i].first);
      CHECK(max_abs_diff(got[r].grads[i].second, want[r].grads[i].second) < 1e-5);
    }
  }
}

std::vector<EncodedExample> examples(std::size_t count, std::size_t seq_len) {
  std::vector<EncodedExample> out;
  for (std::size_t i = 0; i < count; ++i) {
    EncodedExample e;
    e.input_ids.assign(seq_len, 5);
    e.input_ids[0] = 2;
    e.attention_mask.assign(seq_len, 1);
    e.token_type_ids.assign(seq_len, 0);
    e.label = static_cast<std::int64_t>(i % 2);
    out.push_back(std::move(e));
  }
  return out;
}

TrainOptions small_training() {
  TrainOptions o;
  o.model = small_spec(ModelType::kBert);
  o.model.num_labels = 2;
  o.micro_batch = 2;
  o.steps = 1;
  o.dropout = 0.0;
  o.progress = false;
  return o;
}

std::string refusal(const std::function<void()>& run) {
  try {
    run();
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no InputError)";
}

}  // namespace

TEST_CASE("Sequence collectives: gather and reduce-scatter along dim 1, mirrored backward",
          "[sp]") {
  // Rank r holds x_r = [[r * 10 + 1, r * 10 + 2]] as [batch 1, seq 2, 1]; the full sequence is
  // [1, 2, 11, 12]. Reduce-scatter of y = [1, 2, 3, 4] * (r + 1) along the sequence: the sum is
  // [3, 6, 9, 12], rank 0 keeps [3, 6], rank 1 [9, 12].
  const auto store = make_local_store();
  std::vector<torch::Tensor> gathered(2), gathered_grad(2), scattered(2), scattered_grad(2);
  run_ranks(2, [&](int r) {
    ParallelGroups groups(store, r, 1, 2, 1, quick());
    const std::shared_ptr<loom::executor::TensorParallelComm> comm =
        std::make_shared<GroupTensorParallelComm>(groups.tp_group());
    const double base = 10.0 * r;
    const torch::Tensor x =
        torch::tensor({base + 1, base + 2}).view({1, 2, 1}).requires_grad_(true);
    const torch::Tensor g = loom::executor::gather_sequence_parallel(x, comm);
    // Weights 1..4 on the gathered positions, times (r + 1): the gradient of x_r is the sum over
    // ranks of its positions' weights, (1 + 2) * [1, 2] for rank 0 and 3 * [3, 4] for rank 1.
    (g * torch::arange(1.0, 5.0).view({1, 4, 1}) * (r + 1.0)).sum().backward();
    gathered[static_cast<std::size_t>(r)] = g.detach().flatten();
    gathered_grad[static_cast<std::size_t>(r)] = x.grad().flatten();

    const torch::Tensor y = (torch::arange(1.0, 5.0) * (r + 1.0)).view({1, 4, 1});
    const torch::Tensor leaf = y.clone().requires_grad_(true);
    const torch::Tensor s = loom::executor::reduce_scatter_sequence_parallel(leaf, comm);
    // The backward all-gathers the shards' gradients [r + 1, r + 1] into [1, 1, 2, 2].
    (s * (r + 1.0)).sum().backward();
    scattered[static_cast<std::size_t>(r)] = s.detach().flatten();
    scattered_grad[static_cast<std::size_t>(r)] = leaf.grad().flatten();
  });
  for (std::size_t r = 0; r < 2; ++r) {
    CHECK(torch::equal(gathered[r], torch::tensor({1.0, 2.0, 11.0, 12.0})));
    CHECK(torch::equal(scattered_grad[r], torch::tensor({1.0, 1.0, 2.0, 2.0})));
  }
  CHECK(torch::equal(gathered_grad[0], torch::tensor({3.0, 6.0})));
  CHECK(torch::equal(gathered_grad[1], torch::tensor({9.0, 12.0})));
  CHECK(torch::equal(scattered[0], torch::tensor({3.0, 6.0})));
  CHECK(torch::equal(scattered[1], torch::tensor({9.0, 12.0})));
}

TEST_CASE("A tp2 + sp model equals the tp2 model: logits and every shard's gradient",
          "[sp][model]") {
  // The same shards and the same arithmetic up to the order of sums: LayerNorms, row-parallel
  // biases and position / token-type embeddings get partial gradients on each rank that the
  // backward pass all-reduces, so every rank ends with the full gradient as under plain tp.
  for (const ModelType type : {ModelType::kBert, ModelType::kRoberta}) {
    INFO(loom::profiles::to_string(type));
    const ModelSpec spec = small_spec(type);
    const auto plain = run_tp(spec, 2, false, Recompute::kNone);
    check_same(run_tp(spec, 2, true, Recompute::kNone), plain);
    // Recomputation repeats the sequence collectives in the backward pass; gradients unchanged.
    check_same(run_tp(spec, 2, true, Recompute::kFull), plain);
    check_same(run_tp(spec, 2, true, Recompute::kSelective), plain);
  }
}

TEST_CASE("Sequence parallelism needs tp > 1 and a sequence tp divides", "[sp]") {
  const ModelSpec spec = small_spec(ModelType::kBert);
  EncoderOptions options;
  options.sequence_parallel = true;
  CHECK_THROWS_AS(EncoderClassifier(spec, options), InputError);

  TrainOptions o = small_training();
  o.sequence_parallel = true;
  const std::string one_rank =
      refusal([&] { loom::executor::train_classifier(o, examples(4, 8), examples(2, 8)); });
  CHECK(one_rank.find("plan: $.strategy.sequence_parallel: false with tp = 1") == 0);
  CHECK(one_rank.find("--sp off") != std::string::npos);
  CHECK(one_rank.find('\n') == std::string::npos);

  // tp 2 and sequences of 7 tokens.
  o.tp = 2;
  const auto store = make_local_store();
  std::vector<std::string> messages(2);
  run_ranks(2, [&](int r) {
    ParallelGroups groups(store, r, 1, 2, 1, quick());
    messages[static_cast<std::size_t>(r)] = refusal(
        [&] { loom::executor::train_classifier(o, examples(4, 7), examples(2, 7), groups); });
  });
  for (const std::string& m : messages) {
    CHECK(m ==
          "plan: $.strategy.sequence_parallel: a sequence length divisible by tp = 2 (each "
          "tensor-parallel rank holds an equal part), got 7: re-plan with --sp off or pad the "
          "data");
  }
}

TEST_CASE("Flash attention runs where LibTorch has it and is refused with one line elsewhere",
          "[sp][attention]") {
  const ModelSpec spec = small_spec(ModelType::kBert);
  EncoderOptions options;
  options.dropout = 0.0;
  options.attention = Attention::kFlash;
  if (!loom::executor::runs_attention(Attention::kFlash)) {
    // LibTorch 1.13 (this CPU build): no scaled_dot_product_attention.
    CHECK_THROWS_AS(EncoderClassifier(spec, options), InputError);
    TrainOptions o = small_training();
    o.attention = Attention::kFlash;
    const std::string m =
        refusal([&] { loom::executor::train_classifier(o, examples(4, 8), examples(2, 8)); });
    CHECK(m ==
          "plan: $.strategy.attention: a kernel this LibTorch runs: flash needs LibTorch 2 or "
          "later (scaled_dot_product_attention); re-plan with --attention math");
    return;
  }
  // LibTorch 2: the fused kernel computes what the unfused one does.
  EncoderClassifier flash(spec, options);
  options.attention = Attention::kMath;
  EncoderClassifier math(spec, options);
  flash.eval();
  math.eval();
  const EncoderInputs in = small_inputs(ModelType::kBert);
  CHECK(max_abs_diff(flash.forward(in), math.forward(in)) < 1e-5);
}

TEST_CASE("The math kernel is always available", "[sp][attention]") {
  CHECK(loom::executor::runs_attention(Attention::kMath));
}
