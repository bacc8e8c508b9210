// Times the analytical cost model: evaluates a million random strategies of GPT-3 175B
// (96 layers) on 1024 A100s and reports the time per evaluation (median of 5 runs).
// Usage: bench_estimate [evaluations]   (default 1000000)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "costmodel/estimate.hpp"
#include "profiles/loader.hpp"

using namespace loom;
using namespace loom::costmodel;

int main(int argc, char** argv) {
  long evaluations = argc > 1 ? std::atol(argv[1]) : 1000000;
  profiles::Cluster cluster =
      profiles::with_nodes(profiles::load_cluster("dgx-a100-80g"), 128, "bench");
  profiles::ModelSpec model = profiles::load_model("gpt3-175b");
  CostModel cost(model, cluster);

  // A pool of valid random strategies with their partitions, built before timing.
  std::mt19937 rng(7);
  auto pick = [&](const std::vector<int>& v) {
    return v[std::uniform_int_distribution<std::size_t>(0, v.size() - 1)(rng)];
  };
  struct Case {
    Job job;
    Strategy strategy;
    std::vector<StageRange> stages;
  };
  std::vector<Case> cases;
  while (cases.size() < 4096) {
    Strategy s;
    s.tp = pick({1, 2, 4, 8});
    s.pp = pick({1, 2, 4, 8, 16, 32});
    s.dp = 1024 / (s.tp * s.pp);
    s.zero = pick({0, 1, 2, 3});
    s.micro_batch = pick({1, 2, 4});
    s.num_micro_batches = pick({8, 16, 32, 64});
    s.schedule = static_cast<Schedule>(pick({0, 1, 2}));
    s.virtual_stages = s.schedule == Schedule::kInterleaved ? pick({2, 3}) : 1;
    s.recompute = static_cast<Recompute>(pick({0, 1, 2}));
    Job job{s.dp * s.micro_batch * s.num_micro_batches, 2048, Precision::kBf16, "adamw"};
    if (check_strategy(model, cluster.device_count(), job, s)) continue;
    cases.push_back({job, s, even_partition(model, s.pp * s.virtual_stages)});
  }
  // Warm the link cache (one topology computation per group shape).
  for (const Case& c : cases) cost.estimate(c.job, c.strategy, c.stages);

  std::vector<double> per_eval_us;
  double sink = 0;
  for (int run = 0; run < 5; ++run) {
    auto start = std::chrono::steady_clock::now();
    for (long i = 0; i < evaluations; ++i) {
      const Case& c = cases[static_cast<std::size_t>(i) % cases.size()];
      sink += cost.estimate(c.job, c.strategy, c.stages).step_time_s;
    }
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    per_eval_us.push_back(s / static_cast<double>(evaluations) * 1e6);
  }
  std::sort(per_eval_us.begin(), per_eval_us.end());
  std::printf("bench_estimate: %ld evaluations x 5 runs, gpt3-175b on 1024 A100, %zu strategies\n",
              evaluations, cases.size());
  std::printf("per evaluation: median %.3f us (min %.3f, max %.3f); target < 5 us\n",
              per_eval_us[2], per_eval_us[0], per_eval_us[4]);
  return sink > 0 ? 0 : 1;
}
