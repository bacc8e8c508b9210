// loom demo: the whole path on this machine with no arguments (spec/cli.md): plan a small encoder
// for the local CPU, simulate the plan, train it on synthetic reviews, and print the prediction
// next to the measurement. The ranks of the plan (the local-cpu cluster's two CPU ranks) run as
// threads of this process over Gloo.
#include <cstdio>
#include <iostream>

#include "costmodel/simulator.hpp"
#include "executor/dataset.hpp"
#include "executor/tokenizer.hpp"
#include "executor/train.hpp"
#include "planner/search.hpp"
#include "profiles/loader.hpp"
#include "tools/commands.hpp"

namespace loom::tools {

namespace {

int run_demo() {
  const profiles::Cluster cluster = profiles::load_cluster("local-cpu");
  const profiles::ModelSpec model = profiles::load_model("tiny-bert");
  const costmodel::Job job{16, 64, profiles::Precision::kFp32, "adamw"};
  std::cout << "loom demo: tiny-bert fine-tuned on synthetic reviews on this machine's CPU\n"
            << "(equivalent: loom plan --model tiny-bert --cluster local-cpu --global-batch 16 "
               "--seq-len 64 --precision fp32 --micro-batch 8 -o plan.json; then loom launch "
               "--nproc 2 -- loom train plan.json --data synthetic:1200 --steps 80)\n\n";

  planner::SearchOptions o;
  o.micro_batch = 8;
  o.fewer_cpu_ranks = false;  // the demo trains across the machine's ranks
  const planner::SearchResult found = planner::search(costmodel::CostModel(model, cluster), job, o);
  const planner::Plan& plan = found.plans.at(0);
  print_plan(std::cout, plan);

  executor::TrainOptions t = executor::train_options_from_plan(plan);
  t.steps = 80;
  t.lr = 1e-3;
  t.warmup_steps = 4;
  t.eval_every = 40;
  t.progress = false;
  const executor::WordPieceTokenizer tokenizer = executor::WordPieceTokenizer::from_tokens(
      executor::synthetic_vocabulary(), true, "the synthetic vocabulary");
  const executor::TrainValidation data =
      executor::split_train_validation(executor::synthetic_reviews(1200, 1), 0.2, 42);
  auto encode = [&](const std::vector<executor::Review>& reviews) {
    std::vector<executor::EncodedExample> out;
    out.reserve(reviews.size());
    for (const executor::Review& r : reviews) out.push_back(tokenizer.encode(r.text, 64, r.label));
    return out;
  };
  std::cout << "\ntraining 80 steps on " << plan.strategy.world_size() << " ranks, "
            << data.train.size() << " synthetic reviews (" << data.validation.size()
            << " held out)...\n";
  const executor::TrainSummary s =
      executor::train_local_ranks(t, encode(data.train), encode(data.validation));

  char line[256];
  std::snprintf(line, sizeof line, "\n%-22s %14s %14s\n", "", "predicted", "measured");
  std::cout << line;
  std::snprintf(line, sizeof line, "%-22s %12.4f s %12.4f s  (%+.0f %%)\n", "step time",
                plan.predicted.step_time_s, s.median_step_time_s,
                100 * (plan.predicted.step_time_s / s.median_step_time_s - 1));
  std::cout << line;
  std::snprintf(line, sizeof line, "%-22s %10.1f MiB %10.1f MiB\n", "peak memory",
                plan.predicted.peak_memory_bytes / (1 << 20),
                static_cast<double>(s.peak_memory_bytes) / (1 << 20));
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
