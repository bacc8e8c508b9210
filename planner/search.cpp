#include "planner/search.hpp"

#include <algorithm>
#include <cstdio>
#include <limits>

#include "costmodel/layers.hpp"

namespace loom::planner {

using costmodel::Recompute;
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

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", bytes / (1024.0 * 1024 * 1024));
  return buf;
}

std::string short_name(const Strategy& s) {
  std::string out = "tp=" + std::to_string(s.tp) + " pp=" + std::to_string(s.pp) +
                    " dp=" + std::to_string(s.dp) + " zero=" + std::to_string(s.zero) +
                    " micro-batch=" + std::to_string(s.micro_batch) + " " +
                    costmodel::to_string(s.schedule);
  if (s.virtual_stages > 1) out += " v=" + std::to_string(s.virtual_stages);
  return out + " recompute=" + costmodel::to_string(s.recompute);
}

// What the search remembers of every candidate, to rank and to explain.
struct Candidate {
  Strategy strategy;
  double step_time_s = 0;
  double peak_memory_bytes = 0;
  int peak_stage = 0;
  bool fits = false;
  std::int64_t order = 0;  // enumeration order, for deterministic ties
};

// The value of one dimension, for "X chosen over Y" explanations.
struct Dimension {
  const char* name;
  int (*value)(const Strategy&);
  std::string (*label)(int);
};

std::string int_label(int v) { return std::to_string(v); }
std::string recompute_label(int v) { return costmodel::to_string(static_cast<Recompute>(v)); }
std::string schedule_label(int v) { return costmodel::to_string(static_cast<Schedule>(v)); }

constexpr Dimension kDimensions[] = {
    {"tp", [](const Strategy& s) { return s.tp; }, int_label},
    {"pp", [](const Strategy& s) { return s.pp; }, int_label},
    {"zero", [](const Strategy& s) { return s.zero; }, int_label},
    {"micro-batch", [](const Strategy& s) { return static_cast<int>(s.micro_batch); }, int_label},
    {"schedule", [](const Strategy& s) { return static_cast<int>(s.schedule); }, schedule_label},
    {"recompute", [](const Strategy& s) { return static_cast<int>(s.recompute); }, recompute_label},
};

std::vector<std::string> explain(const Candidate& best, const std::vector<Candidate>& all) {
  std::vector<std::string> why;
  for (const Dimension& d : kDimensions) {
    int chosen = d.value(best.strategy);
    const Candidate* faster_other = nullptr;   // best feasible with another value
    const Candidate* leanest_other = nullptr;  // smallest memory with another value
    for (const Candidate& c : all) {
      if (d.value(c.strategy) == chosen) continue;
      if (c.fits && (faster_other == nullptr || c.step_time_s < faster_other->step_time_s)) {
        faster_other = &c;
      }
      if (leanest_other == nullptr || c.peak_memory_bytes < leanest_other->peak_memory_bytes) {
        leanest_other = &c;
      }
    }
    std::string head = std::string(d.name) + "=" + d.label(chosen) + " chosen over ";
    if (faster_other != nullptr) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "%s=%s: %.4g s vs %.4g s per step (%+.1f %%)", d.name,
                    d.label(d.value(faster_other->strategy)).c_str(), best.step_time_s,
                    faster_other->step_time_s,
                    100 * (faster_other->step_time_s / best.step_time_s - 1));
      why.push_back(head + buf);
    } else if (leanest_other != nullptr) {
      why.push_back(head + d.name + "=" + d.label(d.value(leanest_other->strategy)) + ": " +
                    d.name + "=" + d.label(d.value(leanest_other->strategy)) + " needs at least " +
                    gib(leanest_other->peak_memory_bytes) + " on stage " +
                    std::to_string(leanest_other->peak_stage) + " (" +
                    short_name(leanest_other->strategy) + ")");
    }
  }
  return why;
}

}  // namespace

std::string binding_constraint(const Plan& plan, double memory_margin) {
  const costmodel::Prediction& p = plan.predicted;
  double limit = memory_margin * static_cast<double>(plan.cluster.device.memory_bytes);
  if (p.peak_memory_bytes >= 0.9 * limit) return "memory";
  const costmodel::ExposedCommunication& e = p.exposed_communication_s;
  double bubble = p.bubble_fraction / (1 + p.bubble_fraction) *
                  (p.step_time_s - e.dp - e.zero - p.optimizer_s - e.tp - e.pp);
  std::pair<double, const char*> parts[] = {{bubble, "bubble"},    {e.tp, "tp comm"},
                                            {e.pp, "pp comm"},     {e.dp, "dp comm"},
                                            {e.zero, "zero comm"}, {p.optimizer_s, "optimizer"}};
  auto worst = *std::max_element(std::begin(parts), std::end(parts),
                                 [](const auto& a, const auto& b) { return a.first < b.first; });
  if (worst.first < 0.1 * p.step_time_s) return "compute";
  return worst.second;
}

SearchResult search(const costmodel::CostModel& cost, const costmodel::Job& job,
                    const SearchOptions& o) {
  const profiles::ModelSpec& model = cost.model();
  const profiles::Cluster& cluster = cost.cluster();
  const std::int64_t devices = cluster.device_count();
  const double limit = o.memory_margin * static_cast<double>(cluster.device.memory_bytes);

  SearchResult result;
  std::vector<Candidate> all;
  std::string first_refusal;
  std::int64_t order = 0;

  std::vector<int> tps = o.tp ? std::vector<int>{*o.tp} : divisors(devices);
  for (int tp : tps) {
    if (!o.tp &&
        (tp > cluster.devices_per_node || model.heads % tp != 0 || model.ffn_hidden % tp != 0)) {
      continue;
    }
    std::vector<int> pps = o.pp ? std::vector<int>{*o.pp} : divisors(devices / tp);
    for (int pp : pps) {
      if (!o.pp && pp > model.layers) continue;
      std::vector<int> dps;
      if (o.dp) {
        dps = {*o.dp};
      } else if (devices % (static_cast<std::int64_t>(tp) * pp) == 0) {
        dps = {static_cast<int>(devices / (static_cast<std::int64_t>(tp) * pp))};
      }
      for (int dp : dps) {
        std::vector<int> zeros = o.zero   ? std::vector<int>{*o.zero}
                                 : dp > 1 ? std::vector<int>{0, 1, 2, 3}
                                          : std::vector<int>{0};
        if (job.global_batch % dp != 0) {
          if (first_refusal.empty()) {
            first_refusal = "the global batch " + std::to_string(job.global_batch) +
                            " does not split over dp=" + std::to_string(dp);
          }
          continue;
        }
        std::vector<int> bs = o.micro_batch
                                  ? std::vector<int>{static_cast<int>(*o.micro_batch)}
                                  : divisors(std::min<std::int64_t>(job.global_batch / dp, 1024));
        for (int zero : zeros) {
          for (int b : bs) {
            if ((job.global_batch / dp) % b != 0) continue;
            std::int64_t m = job.global_batch / dp / b;
            std::vector<std::pair<Schedule, int>> schedules;
            if (o.schedule) {
              int v = o.virtual_stages.value_or(*o.schedule == Schedule::kInterleaved ? 2 : 1);
              schedules.emplace_back(*o.schedule, v);
            } else if (pp == 1) {
              schedules.emplace_back(Schedule::k1F1B, 1);
            } else {
              schedules.emplace_back(Schedule::k1F1B, 1);
              schedules.emplace_back(Schedule::kGpipe, 1);
              std::vector<int> vs = o.virtual_stages ? std::vector<int>{*o.virtual_stages}
                                                     : std::vector<int>{2, 3, 4, 6, 8};
              for (int v : vs) {
                if (std::int64_t{pp} * v <= model.layers &&
                    model.layers % (std::int64_t{pp} * v) == 0) {
                  schedules.emplace_back(Schedule::kInterleaved, v);
                }
              }
            }
            for (auto [schedule, v] : schedules) {
              std::vector<Recompute> recomputes =
                  o.recompute ? std::vector<Recompute>{*o.recompute}
                              : std::vector<Recompute>{Recompute::kNone, Recompute::kSelective,
                                                       Recompute::kFull};
              for (Recompute rc : recomputes) {
                Strategy s;
                s.tp = tp;
                s.pp = pp;
                s.dp = dp;
                s.zero = zero;
                s.micro_batch = b;
                s.num_micro_batches = m;
                s.schedule = schedule;
                s.virtual_stages = v;
                s.recompute = rc;
                if (auto why = costmodel::check_strategy(model, devices, job, s)) {
                  if (first_refusal.empty()) first_refusal = *why;
                  continue;
                }
                auto stages = costmodel::even_partition(model, pp * v);
                costmodel::Prediction p = cost.estimate(job, s, stages);
                ++result.searched;
                Candidate c;
                c.strategy = s;
                c.step_time_s = p.step_time_s;
                c.peak_memory_bytes = p.peak_memory_bytes;
                for (std::size_t r = 0; r < p.memory_by_stage.size(); ++r) {
                  if (p.memory_by_stage[r].total() == p.peak_memory_bytes) {
                    c.peak_stage = static_cast<int>(r);
                    break;
                  }
                }
                c.fits = p.peak_memory_bytes <= limit;
                c.order = order++;
                if (c.fits) ++result.feasible;
                all.push_back(c);
                // Recomputing more only adds time: once one fits, the rest cannot win.
                if (c.fits && !o.recompute) break;
              }
            }
          }
        }
      }
    }
  }

  if (result.feasible == 0) {
    if (all.empty()) {
      result.infeasible_reason =
          first_refusal.empty() ? "no strategy matches the pinned dimensions" : first_refusal;
      return result;
    }
    const Candidate& lean =
        *std::min_element(all.begin(), all.end(), [](const Candidate& a, const Candidate& b) {
          return a.peak_memory_bytes < b.peak_memory_bytes;
        });
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.2f", o.memory_margin);
    result.infeasible_reason = "does not fit: the smallest memory need is " +
                               gib(lean.peak_memory_bytes) + " per device at " +
                               short_name(lean.strategy) + "; the device has " +
                               gib(static_cast<double>(cluster.device.memory_bytes)) +
                               " and plans may use " + buf + " of it (" + gib(limit) + ")";
    return result;
  }

  std::vector<const Candidate*> ranked;
  for (const Candidate& c : all) {
    if (c.fits) ranked.push_back(&c);
  }
  std::stable_sort(ranked.begin(), ranked.end(), [](const Candidate* a, const Candidate* b) {
    if (a->step_time_s != b->step_time_s) return a->step_time_s < b->step_time_s;
    return a->order < b->order;
  });
  std::size_t keep =
      std::min<std::size_t>(ranked.size(), static_cast<std::size_t>(std::max(1, o.top)));
  for (std::size_t i = 0; i < keep; ++i) {
    Plan plan = evaluate_strategy(cost, job, ranked[i]->strategy);
    plan.why.clear();
    if (i == 0) {
      if (result.searched == 1) {
        plan.why.push_back("every dimension was pinned; evaluated as given");
      } else {
        plan.why = explain(*ranked[0], all);
      }
    } else {
      char buf[96];
      std::snprintf(buf, sizeof buf, "%.1f %% slower than the best plan",
                    100 * (ranked[i]->step_time_s / ranked[0]->step_time_s - 1));
      plan.why.push_back(buf);
    }
    result.plans.push_back(std::move(plan));
  }
  return result;
}

}  // namespace loom::planner
