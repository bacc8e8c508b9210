// Times the event-driven simulator on one step of GPT-3 175B (96 layers) on 1024 A100s
// (dgx-a100-80g, 128 nodes), tp = 8, pp = 16, dp = 8, micro-batch 1, sequence 2048, bf16, and
// reports the simulated step time, the events processed, the wall time and the events per second
// (median of the runs). Target: under 1 s per simulated step.
// Usage: bench_simulate [runs]   (default 7)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "costmodel/simulator.hpp"
#include "costmodel/trace.hpp"
#include "profiles/loader.hpp"

using namespace loom;
using namespace loom::costmodel;

namespace {

struct Case {
  const char* label;
  Schedule schedule;
  int virtual_stages;
  std::int64_t micro_batches;
  int zero;
  bool trace;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int runs = argc > 1 ? std::max(1, std::atoi(argv[1])) : 7;
  profiles::Cluster cluster =
      profiles::with_nodes(profiles::load_cluster("dgx-a100-80g"), 128, "bench");
  CostModel cost(profiles::load_model("gpt3-175b"), cluster);
  const std::vector<Case> cases = {
      {"1f1b, 192 micro-batches (batch 1536)", Schedule::k1F1B, 1, 192, 0, false},
      {"1f1b, 192 micro-batches, with trace", Schedule::k1F1B, 1, 192, 0, true},
      {"1f1b, 96 micro-batches (batch 768)", Schedule::k1F1B, 1, 96, 0, false},
      {"gpipe, 192 micro-batches", Schedule::kGpipe, 1, 192, 0, false},
      {"interleaved v=2, 192 micro-batches", Schedule::kInterleaved, 2, 192, 0, false},
      {"1f1b, 192 micro-batches, ZeRO-1", Schedule::k1F1B, 1, 192, 1, false},
      {"1f1b, 192 micro-batches, ZeRO-3", Schedule::k1F1B, 1, 192, 3, false},
      {"1f1b, 192 micro-batches, ZeRO-2", Schedule::k1F1B, 1, 192, 2, false},
  };
  std::printf(
      "bench_simulate: gpt3-175b on 1024 A100 (dgx-a100-80g x 128), tp=8 pp=16 dp=8, "
      "micro-batch 1, seq 2048, bf16; median of %d runs\n",
      runs);
  std::printf("%-40s %10s %10s %9s %10s %12s\n", "case", "step_s", "estimate", "events", "wall_ms",
              "events/s");
  double sink = 0;
  for (const Case& c : cases) {
    Strategy s;
    s.tp = 8;
    s.pp = 16;
    s.dp = 8;
    s.zero = c.zero;
    s.micro_batch = 1;
    s.num_micro_batches = c.micro_batches;
    s.schedule = c.schedule;
    s.virtual_stages = c.virtual_stages;
    Job job{s.dp * s.micro_batch * s.num_micro_batches, 2048, Precision::kBf16, "adamw"};
    const std::vector<StageRange> stages = even_partition(cost.model(), s.pp * s.virtual_stages);
    const double estimate = cost.estimate(job, s, stages).step_time_s;
    std::vector<double> wall_s;
    SimulationResult result;
    for (int run = 0; run < runs; ++run) {
      auto start = std::chrono::steady_clock::now();
      result = simulate(cost, job, s, stages, SimulationOptions{c.trace});
      wall_s.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      sink += result.step_time_s;
    }
    const double wall = median(wall_s);
    std::printf("%-40s %10.4f %10.4f %9lld %10.1f %12.3g\n", c.label, result.step_time_s, estimate,
                static_cast<long long>(result.events_processed), wall * 1e3,
                static_cast<double>(result.events_processed) / wall);
    if (c.trace) {
      std::vector<double> trace_s;
      std::size_t bytes = 0;
      for (int run = 0; run < runs; ++run) {
        auto start = std::chrono::steady_clock::now();
        bytes = chrome_trace_json(result).size();
        trace_s.push_back(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      }
      std::printf("%-40s %zu slices, chrome_trace_json %.1f ms, %.2f MB\n", "",
                  result.slices.size(), median(trace_s) * 1e3, static_cast<double>(bytes) / 1e6);
    }
  }
  return sink > 0 ? 0 : 1;
}
