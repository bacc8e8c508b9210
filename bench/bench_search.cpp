// Full planner search times (the performance targets): bert-large on 8 to 64 GPUs of
// dgx-a100-80g (target < 50 ms each) and GPT-3 175B on 128 nodes = 1024 GPUs (target < 0.5 s),
// single thread, every dimension searched (sequence parallelism included; GPU plans run flash
// attention) and the top 5 refined by the simulator. The last case plans GPT-3 175B for runtime
// megatron, which also searches context parallelism (cp 1 and 2 at sequence 2048). Prints, per
// case, the median wall time over repeated searches (and the median CPU time of the process, which
// a machine shared with other work inflates less) and the number of strategies searched, evaluated
// and feasible.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <vector>

#include "planner/search.hpp"
#include "profiles/loader.hpp"

namespace {

struct Case {
  const char* model;
  std::int64_t nodes;
  std::int64_t global_batch;
  std::int64_t seq_len;
  loom::costmodel::Runtime runtime = loom::costmodel::Runtime::kLoom;
};

}  // namespace

int main() {
  using namespace loom;
  const Case cases[] = {{"bert-large", 1, 512, 512},
                        {"bert-large", 2, 512, 512},
                        {"bert-large", 4, 512, 512},
                        {"bert-large", 8, 512, 512},
                        {"gpt3-175b", 128, 1536, 2048},
                        {"gpt3-175b", 128, 1536, 2048, costmodel::Runtime::kMegatron}};
  std::printf("%-11s %5s %-8s %9s %9s %9s %12s %12s  %s\n", "model", "gpus", "runtime", "searched",
              "evaluated", "feasible", "median ms", "cpu ms", "best");
  for (const Case& c : cases) {
    const profiles::Cluster cluster =
        profiles::with_nodes(profiles::load_cluster("dgx-a100-80g"), c.nodes, "bench");
    costmodel::Job job{c.global_batch, c.seq_len, profiles::Precision::kBf16, "adamw"};
    job.runtime = c.runtime;
    std::vector<double> times_ms;
    std::vector<double> cpu_ms;
    planner::SearchResult result;
    for (int run = 0; run < 7; ++run) {
      const auto start = std::chrono::steady_clock::now();
      const std::clock_t cpu_start = std::clock();
      // The cost model (topology included) is built inside the timed region, as `loom plan` does.
      costmodel::CostModel cost(profiles::load_model(c.model), cluster);
      result = planner::search(cost, job, {});
      times_ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count());
      cpu_ms.push_back(1e3 * static_cast<double>(std::clock() - cpu_start) / CLOCKS_PER_SEC);
    }
    std::sort(times_ms.begin(), times_ms.end());
    std::sort(cpu_ms.begin(), cpu_ms.end());
    const costmodel::Strategy& s = result.plans.at(0).strategy;
    std::printf(
        "%-11s %5lld %-8s %9lld %9lld %9lld %12.2f %12.2f  dp=%d tp=%d pp=%d cp=%d zero=%d mb=%lld "
        "%s%s %s\n",
        c.model, static_cast<long long>(cluster.device_count()), costmodel::to_string(c.runtime),
        static_cast<long long>(result.searched), static_cast<long long>(result.evaluated),
        static_cast<long long>(result.feasible), times_ms[times_ms.size() / 2],
        cpu_ms[cpu_ms.size() / 2], s.dp, s.tp, s.pp, s.cp, s.zero,
        static_cast<long long>(s.micro_batch), costmodel::to_string(s.schedule),
        s.sequence_parallel ? " sp" : "", costmodel::to_string(s.attention));
  }
  return 0;
}
