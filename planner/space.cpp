#include "planner/space.hpp"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "costmodel/runtime.hpp"

namespace loom::planner {

using costmodel::Schedule;
using costmodel::Strategy;

namespace {

std::vector<int> divisors(std::int64_t n) {
  std::vector<int> out;
  for (std::int64_t d = 1; d <= n; ++d) {
    if (n % d == 0) out.push_back(static_cast<int>(d));
  }
  return out;
}

std::vector<std::pair<Schedule, int>> schedule_choices(const SearchOptions& o, int pp,
                                                       std::int64_t layers) {
  if (o.schedule) {
    return {
        {*o.schedule, o.virtual_stages.value_or(*o.schedule == Schedule::kInterleaved ? 2 : 1)}};
  }
  if (pp == 1) return {{Schedule::k1F1B, 1}};  // without a pipeline the schedules coincide
  std::vector<std::pair<Schedule, int>> out{{Schedule::k1F1B, 1}, {Schedule::kGpipe, 1}};
  std::vector<int> vs =
      o.virtual_stages ? std::vector<int>{*o.virtual_stages} : std::vector<int>{2, 3, 4, 6, 8};
  for (int v : vs) {
    std::int64_t chunks = std::int64_t{pp} * v;
    if (chunks <= layers && layers % chunks == 0) out.emplace_back(Schedule::kInterleaved, v);
  }
  return out;
}

// Sequence parallelism to try at `tp`: as pinned, else off, and on too when tp > 1 shards the
// sequence evenly on GPUs. CPU plans keep it off unless pinned: Gloo has no reduce-scatter, so
// Loom's executor all-reduces there and moves twice the bytes the model charges.
std::vector<bool> sequence_parallel_choices(const SearchOptions& o, bool gpu, int tp,
                                            std::int64_t seq_len) {
  if (o.sequence_parallel) return {*o.sequence_parallel};
  if (gpu && tp > 1 && seq_len % tp == 0) return {false, true};
  return {false};
}

// Context parallelism to try beside `tp` on `devices`: as pinned; else 1 and, where the job's
// runtime runs it, every cp dividing the devices left that leaves each rank at least
// kMinContextParallelTokens tokens (check_strategy refuses those that do not cut the sequence
// into 2 cp equal chunks).
std::vector<int> context_parallel_choices(const SearchOptions& o, const costmodel::Job& job,
                                          std::int64_t devices_left) {
  if (o.cp) return {*o.cp};
  std::vector<int> out = {1};
  if (!costmodel::runtime_rules(job.runtime).context_parallel) return out;
  for (int cp : divisors(devices_left)) {
    if (cp > 1 && job.seq_len / cp >= kMinContextParallelTokens) out.push_back(cp);
  }
  return out;
}

}  // namespace

// Every strategy to try, recomputation left at none (the caller walks that dimension). Strategies
// that a pinned dimension rules out are skipped; the first reason is kept for the error message.
std::vector<Strategy> candidate_strategies(const profiles::ModelSpec& model,
                                           const profiles::Cluster& cluster,
                                           const costmodel::Job& job, const SearchOptions& o,
                                           std::string* first_refusal) {
  const std::int64_t all_devices = cluster.device_count();
  auto refuse = [&](const std::string& why) {
    if (first_refusal->empty()) *first_refusal = why;
  };
  // World sizes: every device; on one CPU node also every divisor of its cores (fewer ranks,
  // more threads each).
  std::vector<int> worlds = {static_cast<int>(all_devices)};
  if (o.fewer_cpu_ranks && cluster.device.kind == profiles::DeviceKind::kCpu &&
      cluster.nodes == 1) {
    worlds = divisors(all_devices);
    std::reverse(worlds.begin(), worlds.end());  // all devices first (the order of ties)
  }
  const costmodel::Attention attention =
      o.attention.value_or(default_attention(cluster, job.precision));
  const bool gpu = cluster.device.kind == profiles::DeviceKind::kGpu;
  std::vector<Strategy> out;
  for (const int devices : worlds) {
    for (int tp : o.tp ? std::vector<int>{*o.tp} : divisors(devices)) {
      if (!o.tp &&
          (tp > cluster.devices_per_node || model.heads % tp != 0 || model.ffn_hidden % tp != 0)) {
        continue;
      }
      for (int cp : context_parallel_choices(o, job, devices / tp)) {
        for (int pp : o.pp ? std::vector<int>{*o.pp} : divisors(devices / tp / cp)) {
          if (!o.pp && pp > model.layers) continue;
          const std::int64_t replica = std::int64_t{tp} * pp * cp;
          if (!o.dp && devices % replica != 0) continue;
          const int dp = o.dp.value_or(static_cast<int>(devices / replica));
          if (job.global_batch % dp != 0) {
            refuse("the global batch " + std::to_string(job.global_batch) +
                   " does not split over dp=" + std::to_string(dp));
            continue;
          }
          const std::int64_t per_rank = job.global_batch / dp;
          std::vector<int> zeros = o.zero   ? std::vector<int>{*o.zero}
                                   : dp > 1 ? std::vector<int>{0, 1, 2, 3}
                                            : std::vector<int>{0};
          std::vector<int> bs = o.micro_batch ? std::vector<int>{static_cast<int>(*o.micro_batch)}
                                              : divisors(std::min<std::int64_t>(per_rank, 1024));
          for (int zero : zeros) {
            for (int b : bs) {
              if (per_rank % b != 0) {
                refuse("--micro-batch " + std::to_string(b) + " does not divide the " +
                       std::to_string(per_rank) + " samples per data-parallel rank (global batch " +
                       std::to_string(job.global_batch) + " over dp=" + std::to_string(dp) + ")");
                continue;
              }
              for (auto [schedule, v] : schedule_choices(o, pp, model.layers)) {
                for (const bool sp : sequence_parallel_choices(o, gpu, tp, job.seq_len)) {
                  Strategy s;
                  s.tp = tp;
                  s.pp = pp;
                  s.dp = dp;
                  s.zero = zero;
                  s.micro_batch = b;
                  s.num_micro_batches = per_rank / b;
                  s.schedule = schedule;
                  s.virtual_stages = v;
                  s.sequence_parallel = sp;
                  s.attention = attention;
                  s.cp = cp;
                  // check_strategy() also asks the job's runtime (runtime_refusal()).
                  if (auto why = costmodel::check_strategy(model, all_devices, job, s)) {
                    refuse(*why);
                    continue;
                  }
                  // Pinned dimensions can make two world sizes yield the same strategy.
                  if (worlds.size() == 1 || std::find(out.begin(), out.end(), s) == out.end()) {
                    out.push_back(s);
                  }
                }
              }
            }
          }
        }
      }
    }
  }
  return out;
}

}  // namespace loom::planner
