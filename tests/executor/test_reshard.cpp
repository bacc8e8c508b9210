// Checkpoints resumed in another layout (executor/reshard.hpp), ranks as threads over Gloo: the
// losses after a resharded resume equal those of the new layout's uninterrupted run from the same
// seeded start (dp2 -> dp1, ZeRO-3 dp2 -> tp2, pp2 -> dp2, tp2 -> pp2, one rank -> many, 4 ranks
// -> 4 others); the state a checkpoint holds survives a trip through another layout bit for bit;
// a different model and a checkpoint whose layout cannot be read are refused.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "executor/checkpoint.hpp"
#include "executor/distributed.hpp"
#include "executor/reshard.hpp"
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
using loom::executor::ParallelGroups;
using loom::executor::TrainingState;
using loom::executor::TrainOptions;
using loom::executor::TrainSummary;
using loom::profiles::ModelSpec;

namespace {

// Two layers (so pp2 splits them), two heads, and a vocabulary of 33: tp2 holds 17 rows of the
// word embedding per rank, the last one padding on rank 1. A global batch of 8.
ModelSpec tiny_model() {
  ModelSpec m;
  m.name = "tiny-bert";
  m.model_type = loom::profiles::ModelType::kBert;
  m.layers = 2;
  m.hidden = 16;
  m.heads = 2;
  m.ffn_hidden = 32;
  m.vocab = 33;
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
  o.weight_decay = 0.01;
  o.dropout = 0.0;  // the layouts continue each other's losses exactly only without dropout
  o.seed = 11;
  o.progress = false;
  return o;
}

struct Layout {
  const char* name;
  int dp, tp, pp, zero;
  std::int64_t micro_batches;  // per dp rank: dp * micro_batches * 2 = 8
};

TrainOptions in_layout(TrainOptions o, const Layout& l) {
  o.dp = l.dp;
  o.tp = l.tp;
  o.pp = l.pp;
  o.zero = l.zero;
  o.num_micro_batches = l.micro_batches;
  return o;
}

// world rank 0's summary of a run of `o` in its layout (one rank, or ranks as threads).
TrainSummary train(const TrainOptions& o, const std::vector<EncodedExample>& data) {
  return loom::executor::train_local_ranks(o, data, {});
}

void check_losses(const std::vector<double>& actual, const std::vector<double>& expected) {
  REQUIRE(actual.size() == expected.size());
  for (std::size_t i = 0; i < actual.size(); ++i) {
    INFO("step " << i << ": " << actual[i] << " vs " << expected[i]);
    CHECK(std::abs(actual[i] - expected[i]) <= 1e-5 * std::abs(expected[i]));
  }
}

}  // namespace

TEST_CASE("A checkpoint resumed in another layout continues that layout's losses",
          "[distributed][reshard]") {
  const auto data = loom::test::synthetic_examples(48, 3);
  const TrainOptions base = tiny_options();
  const Layout one{"one rank", 1, 1, 1, 0, 4};
  const Layout dp2{"dp2", 2, 1, 1, 0, 2};
  const Layout dp2_zero3{"dp2 zero3", 2, 1, 1, 3, 2};
  const Layout dp2_zero1{"dp2 zero1", 2, 1, 1, 1, 2};
  const Layout tp2{"tp2", 1, 2, 1, 0, 4};
  const Layout pp2{"pp2", 1, 1, 2, 0, 4};
  const Layout tp2_pp2{"tp2 pp2", 1, 2, 2, 0, 4};
  const Layout dp2_tp2_zero2{"dp2 tp2 zero2", 2, 2, 1, 2, 2};
  const std::vector<std::pair<Layout, Layout>> moves = {
      {dp2, one},       {dp2_zero3, tp2},         {pp2, dp2},           {tp2, pp2},
      {one, dp2_zero1}, {tp2_pp2, dp2_tp2_zero2}, {dp2_tp2_zero2, one},
  };
  for (const auto& [from, to] : moves) {
    INFO(from.name << " -> " << to.name);
    const loom::test::TempDir tmp("reshard");
    // The old layout: 2 of 4 steps, checkpointed, as if stopped there.
    TrainOptions old_run = in_layout(base, from);
    old_run.checkpoint_dir = (tmp.path() / "ckpt").string();
    old_run.stop_after_step = 2;
    train(old_run, data);
    REQUIRE(fs::exists(tmp.path() / "ckpt" / loom::executor::step_folder(2)));
    // Resumed in the new layout for the last 2 steps.
    TrainOptions resumed = in_layout(base, to);
    resumed.checkpoint_dir = old_run.checkpoint_dir;
    resumed.resume = true;
    const TrainSummary after = train(resumed, data);
    CHECK(after.resumed_from_step == 2);
    CHECK(after.steps == 4);
    // The new layout's run from the same seeded start, uninterrupted.
    const TrainSummary whole = train(in_layout(base, to), data);
    REQUIRE(whole.losses.size() == 4);
    check_losses(after.losses, {whole.losses[2], whole.losses[3]});
    // And the old layout's own continuation.
    const TrainSummary old_whole = train(in_layout(base, from), data);
    check_losses(after.losses, {old_whole.losses[2], old_whole.losses[3]});
    // Steps 3 and 4 moved the loss (so equal losses say the state arrived, not that nothing
    // happened).
    CHECK(std::abs(after.losses[1] - whole.losses[1]) > 1e-4);
    // The new layout wrote its own checkpoint, which resumes in its layout as ever.
    const nlohmann::json state =
        loom::executor::read_trainer_state(tmp.path() / "ckpt" / loom::executor::step_folder(4));
    CHECK(state.contains("layout") == (to.dp * to.tp * to.pp > 1));
  }
}

namespace {

// Writes `full` into a step folder of `layout` (step 2) through that layout's engines, as its
// training would have saved it.
void write_in_layout(const TrainingState& full, const TrainOptions& o, const fs::path& dir) {
  const nlohmann::json layout = loom::executor::layout_json(o);
  loom::executor::CheckpointLayout l;
  nlohmann::json state = {{"world_size", o.dp * o.tp * o.pp}, {"layout", layout}};
  l = loom::executor::read_layout(state, "test");
  state["format"] = loom::executor::kCheckpointFormat;
  state["step"] = 2;
  state["seed"] = o.seed;
  state["model"] = loom::profiles::model_to_json(o.model);
  const nlohmann::ordered_json ordered = nlohmann::ordered_json::parse(state.dump());
  loom::executor::run_layout_ranks(l, [&](ParallelGroups& groups) {
    loom::executor::LayoutRank r =
        loom::executor::build_layout_rank(o.model, l, l.zero, o.seed, groups);
    loom::executor::load_training_state(full, r.chunks, *r.flat, l.zero, groups, "test");
    std::vector<torch::Tensor> saved = r.flat->state();
    for (const torch::Tensor& t : full.rng) saved.push_back(t);
    loom::executor::write_rank_checkpoint(dir, 2, groups.world(), saved, ordered, {}, false);
  });
}

void check_same(const loom::executor::NamedTensors& a, const loom::executor::NamedTensors& b) {
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    INFO(a[i].first);
    CHECK(a[i].first == b[i].first);
    CHECK(torch::equal(a[i].second, b[i].second));
  }
}

}  // namespace

TEST_CASE("Parameters and moments survive a trip through other layouts bit for bit",
          "[distributed][reshard]") {
  const loom::test::TempDir tmp("reshard");
  const auto data = loom::test::synthetic_examples(48, 5);
  TrainOptions o = in_layout(tiny_options(), {"tp2 pp2", 1, 2, 2, 0, 4});
  o.checkpoint_dir = (tmp.path() / "ckpt").string();
  o.steps = 2;
  train(o, data);
  const fs::path step = tmp.path() / "ckpt" / loom::executor::step_folder(2);
  const TrainingState original =
      loom::executor::read_training_state(step, loom::executor::read_trainer_state(step));
  REQUIRE(original.parameters.size() == loom::executor::parameter_table(tiny_model()).size());
  CHECK(original.optimizer_step == 2);
  // Trained moments (not AdamW's zeros).
  CHECK(original.exp_avg[0].second.abs().sum().item<double>() > 0);
  CHECK(original.exp_avg_sq.back().second.abs().sum().item<double>() > 0);
  const std::vector<Layout> layouts = {
      {"dp2 zero3 tp2", 2, 2, 1, 3, 2},
      {"dp4 zero1", 4, 1, 1, 1, 1},
      {"dp2 zero2 pp2", 2, 1, 2, 2, 2},
  };
  for (const Layout& l : layouts) {
    INFO(l.name);
    const fs::path dir = tmp.path() / l.name;
    write_in_layout(original, in_layout(o, l), dir);
    const fs::path written = dir / loom::executor::step_folder(2);
    const TrainingState back =
        loom::executor::read_training_state(written, loom::executor::read_trainer_state(written));
    check_same(back.parameters, original.parameters);
    check_same(back.exp_avg, original.exp_avg);
    check_same(back.exp_avg_sq, original.exp_avg_sq);
    CHECK(back.optimizer_step == 2);
    REQUIRE(back.rng.size() == original.rng.size());
    CHECK(torch::equal(back.rng[0], original.rng[0]));
  }
}

TEST_CASE("Resuming refuses another model and a checkpoint it cannot map from",
          "[distributed][reshard]") {
  const loom::test::TempDir tmp("reshard");
  const auto data = loom::test::synthetic_examples(48, 7);
  TrainOptions o = in_layout(tiny_options(), {"dp2", 2, 1, 1, 0, 2});
  o.checkpoint_dir = (tmp.path() / "ckpt").string();
  o.steps = 2;
  train(o, data);
  const fs::path step = tmp.path() / "ckpt" / loom::executor::step_folder(2);

  TrainOptions other = in_layout(tiny_options(), {"tp2", 1, 2, 1, 0, 4});
  other.checkpoint_dir = o.checkpoint_dir;
  other.resume = true;
  SECTION("another model") {
    other.model.ffn_hidden = 64;
    CHECK_THROWS_WITH(train(other, data), Catch::Contains("$.model"));
  }
  SECTION("a layout that does not say how many ranks wrote it") {
    nlohmann::json state = loom::executor::read_trainer_state(step);
    state["layout"]["dp"] = 3;
    std::ofstream(step / loom::executor::kTrainerStateFile) << state.dump(2);
    CHECK_THROWS_WITH(train(other, data), Catch::Contains("$.layout"));
  }
  SECTION("a rank file missing") {
    fs::remove(step / "rank-1.pt");
    CHECK_THROWS_WITH(train(other, data), Catch::Contains("rank-1.pt"));
  }
  SECTION("a rank file of another size") {
    torch::save(std::vector<torch::Tensor>{torch::zeros({3}), torch::zeros({3}), torch::zeros({3}),
                                           torch::tensor({2}, torch::kLong), torch::zeros({3})},
                (step / "rank-0.pt").string());
    CHECK_THROWS_WITH(train(other, data), Catch::Contains("rank-0.pt"));
  }
}

TEST_CASE("a ZeRO-2/3 layout says its shards are taken block by block, one without is refused",
          "[reshard][checkpoint]") {
  TrainOptions o;
  o.model = loom::profiles::load_model("tiny-bert");
  o.dp = 2;
  o.zero = 3;
  const nlohmann::json blocks = loom::executor::layout_json(o);
  CHECK(blocks.at("zero_shards") == "blocks");
  nlohmann::json state = {{"world_size", 2}, {"layout", blocks}};
  CHECK(loom::executor::read_layout(state, "ck/trainer_state.json").zero == 3);
  // Earlier builds cut ZeRO-2/3 shards over the whole buffer and wrote no zero_shards: their rank
  // files would load scrambled into today's engines.
  state["layout"].erase("zero_shards");
  CHECK_THROWS_WITH(loom::executor::read_layout(state, "ck/trainer_state.json"),
                    Catch::Contains("ck/trainer_state.json") &&
                        Catch::Contains("$.layout.zero_shards") && Catch::Contains("earlier Loom"));
  state["layout"]["zero_shards"] = 7;
  CHECK_THROWS_AS(loom::executor::read_layout(state, "ck/trainer_state.json"), loom::InputError);
  // One dp rank holds the whole buffer either way; ZeRO-0/1 keep one block and no marker.
  state["layout"].erase("zero_shards");
  state["layout"]["dp"] = 1;
  state["world_size"] = 1;
  CHECK_NOTHROW(loom::executor::read_layout(state, "ck/trainer_state.json"));
  o.zero = 1;
  CHECK_FALSE(loom::executor::layout_json(o).contains("zero_shards"));
}
