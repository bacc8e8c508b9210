// loom demo: the whole path on this machine with no arguments (spec/cli.md): plan a small encoder
// for the local CPU, simulate the plan, train it on synthetic reviews, and print the prediction
// next to the measurement. The ranks of the plan (the local-cpu cluster's two CPU ranks) run as
// threads of this process over Gloo. It first prints the `loom plan` and `loom launch` commands
// that do the same as separate processes.
#include <cstdio>
#include <iostream>
#include <optional>
#include <string>

#include "costmodel/simulator.hpp"
#include "executor/dataset.hpp"
#include "executor/tokenizer.hpp"
#include "executor/train.hpp"
#include "planner/search.hpp"
#include "profiles/loader.hpp"
#include "profiles/units.hpp"
#include "tools/commands.hpp"

namespace loom::tools {

namespace {

// The demo's settings, shared by what it runs and the commands it prints as its equivalent.
constexpr std::int64_t kGlobalBatch = 16;
constexpr std::int64_t kSeqLen = 64;
constexpr std::int64_t kMicroBatch = 8;
constexpr std::int64_t kReviews = 1200;
constexpr double kValidationFraction = 0.2;
constexpr std::int64_t kSteps = 80;
constexpr double kLr = 1e-3;  // trained from scratch: the fine-tuning rate 2e-5 learns nothing here
constexpr std::int64_t kWarmupSteps = 4;
constexpr std::int64_t kEvalEvery = 40;

// `loom plan` and `loom launch ... loom train` with the flags that reproduce the demo: the plan
// over all the cluster's devices (--gpus, as the demo's search does), the same ranks, data,
// learning rate, warm-up and evaluation.
std::string equivalent_commands(const profiles::Cluster& cluster, const planner::Plan& plan) {
  char text[640];
  std::snprintf(text, sizeof text,
                "equivalent:\n"
                "  loom plan --model tiny-bert --cluster %s --gpus %lld --global-batch %lld "
                "--seq-len %lld --precision fp32 --micro-batch %lld -o plan.json\n"
                "  loom launch --nproc %d -- loom train plan.json --data synthetic:%lld "
                "--validation-fraction %g --steps %lld --lr %g --warmup-steps %lld "
                "--eval-every %lld\n",
                cluster.name.c_str(), static_cast<long long>(cluster.device_count()),
                static_cast<long long>(kGlobalBatch), static_cast<long long>(kSeqLen),
                static_cast<long long>(kMicroBatch), plan.strategy.world_size(),
                static_cast<long long>(kReviews), kValidationFraction,
                static_cast<long long>(kSteps), kLr, static_cast<long long>(kWarmupSteps),
                static_cast<long long>(kEvalEvery));
  return text;
}

int run_demo() {
  const profiles::Cluster cluster = profiles::load_cluster("local-cpu");
  const profiles::ModelSpec model =
      profiles::with_head(profiles::load_model("tiny-bert"), std::nullopt);
  const costmodel::Job job{kGlobalBatch, kSeqLen, profiles::Precision::kFp32, "adamw"};
  planner::SearchOptions o;
  o.micro_batch = kMicroBatch;
  o.fewer_cpu_ranks = false;  // the demo trains across the machine's ranks, as --gpus plans
  const planner::SearchResult found = planner::search(costmodel::CostModel(model, cluster), job, o);
  const planner::Plan& plan = found.plans.at(0);
  std::cout << "loom demo: tiny-bert fine-tuned on synthetic reviews on this machine's CPU\n"
            << equivalent_commands(cluster, plan) << "\n";
  print_plan(std::cout, plan);

  executor::TrainOptions t = executor::train_options_from_plan(plan);
  t.steps = kSteps;
  t.lr = kLr;
  t.warmup_steps = kWarmupSteps;
  t.eval_every = kEvalEvery;
  t.progress = false;
  const executor::WordPieceTokenizer tokenizer = executor::WordPieceTokenizer::from_tokens(
      executor::synthetic_vocabulary(), true, "the synthetic vocabulary");
  const executor::TrainValidation data = executor::split_train_validation(
      executor::load_reviews("synthetic:" + std::to_string(kReviews), "train"), kValidationFraction,
      t.seed);
  auto encode = [&](const std::vector<executor::Review>& reviews) {
    std::vector<executor::EncodedExample> out;
    out.reserve(reviews.size());
    for (const executor::Review& r : reviews) {
      out.push_back(tokenizer.encode(r.text, kSeqLen, r.label));
    }
    return out;
  };
  std::cout << "\ntraining " << kSteps << " steps on " << plan.strategy.world_size() << " ranks, "
            << data.train.size() << " synthetic reviews (" << data.validation.size()
            << " held out)...\n";
  const executor::TrainSummary s =
      executor::train_local_ranks(t, encode(data.train), encode(data.validation));

  // In the units of the plan printed above.
  const profiles::Unit time = profiles::time_unit(plan.predicted.step_time_s);
  const profiles::Unit bytes = profiles::byte_unit(plan.predicted.peak_memory_bytes);
  char line[256];
  std::snprintf(line, sizeof line, "\n%-22s %14s %14s\n", "", "predicted", "measured");
  std::cout << line;
  std::snprintf(line, sizeof line, "%-22s %14s %14s  (%+.0f %%)\n", "step time",
                profiles::unit_text(plan.predicted.step_time_s, time, 3).c_str(),
                profiles::unit_text(s.median_step_time_s, time, 3).c_str(),
                100 * (plan.predicted.step_time_s / s.median_step_time_s - 1));
  std::cout << line;
  std::snprintf(line, sizeof line, "%-22s %14s %14s\n", "peak memory",
                profiles::unit_text(plan.predicted.peak_memory_bytes, bytes, 2).c_str(),
                profiles::unit_text(static_cast<double>(s.peak_memory_bytes), bytes, 2).c_str());
  std::cout << line;
  std::snprintf(line, sizeof line, "validation accuracy %.1f %%, loss %.4f after %lld steps\n",
                100 * s.validation_accuracy.value_or(0), s.validation_loss.value_or(0),
                static_cast<long long>(s.steps));
  std::cout << line
            << "(the prediction uses the local-cpu datasheet rates: `loom profile` measures this "
               "machine and `loom validate PLAN.json --profile P` compares again; measured memory "
               "is rank 0's tensors as its thread saw them)\n";
  return 0;
}

}  // namespace

Runner add_demo_command(CLI::App& app) {
  add_subcommand(app, "demo");
  return []() { return run_demo(); };
}

}  // namespace loom::tools
