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

namespace {

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

// Every strategy to try, recomputation left at none (the caller walks that dimension). Strategies
// that a pinned dimension rules out are skipped; the first reason is kept for the error message.
std::vector<Strategy> candidate_strategies(const profiles::ModelSpec& model,
                                           const profiles::Cluster& cluster,
                                           const costmodel::Job& job, const SearchOptions& o,
                                           std::string* first_refusal) {
  const std::int64_t devices = cluster.device_count();
  auto refuse = [&](const std::string& why) {
    if (first_refusal->empty()) *first_refusal = why;
  };
  std::vector<Strategy> out;
  for (int tp : o.tp ? std::vector<int>{*o.tp} : divisors(devices)) {
    if (!o.tp &&
        (tp > cluster.devices_per_node || model.heads % tp != 0 || model.ffn_hidden % tp != 0)) {
      continue;
    }
    for (int pp : o.pp ? std::vector<int>{*o.pp} : divisors(devices / tp)) {
      if (!o.pp && pp > model.layers) continue;
      const std::int64_t replica = std::int64_t{tp} * pp;
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
          if (per_rank % b != 0) continue;
          for (auto [schedule, v] : schedule_choices(o, pp, model.layers)) {
            Strategy s;
            s.tp = tp;
            s.pp = pp;
            s.dp = dp;
            s.zero = zero;
            s.micro_batch = b;
            s.num_micro_batches = per_rank / b;
            s.schedule = schedule;
            s.virtual_stages = v;
            if (auto why = costmodel::check_strategy(model, devices, job, s)) {
              refuse(*why);
              continue;
            }
            out.push_back(s);
          }
        }
      }
    }
  }
  return out;
}

}  // namespace

SearchResult search(const costmodel::CostModel& cost, const costmodel::Job& job,
                    const SearchOptions& o) {
  const profiles::ModelSpec& model = cost.model();
  const profiles::Cluster& cluster = cost.cluster();
  const double limit = o.memory_margin * static_cast<double>(cluster.device.memory_bytes);

  SearchResult result;
  std::vector<Candidate> all;
  std::string first_refusal;
  const std::vector<Recompute> recomputes =
      o.recompute
          ? std::vector<Recompute>{*o.recompute}
          : std::vector<Recompute>{Recompute::kNone, Recompute::kSelective, Recompute::kFull};
  for (Strategy s : candidate_strategies(model, cluster, job, o, &first_refusal)) {
    const auto stages = costmodel::even_partition(model, s.pp * s.virtual_stages);
    for (Recompute rc : recomputes) {
      s.recompute = rc;
      const costmodel::Prediction p = cost.estimate(job, s, stages);
      Candidate c;
      c.strategy = s;
      c.step_time_s = p.step_time_s;
      c.peak_memory_bytes = p.peak_memory_bytes;
      auto peak =
          std::max_element(p.memory_by_stage.begin(), p.memory_by_stage.end(),
                           [](const auto& x, const auto& y) { return x.total() < y.total(); });
      c.peak_stage = static_cast<int>(peak - p.memory_by_stage.begin());
      c.fits = p.peak_memory_bytes <= limit;
      c.order = result.searched++;
      if (c.fits) ++result.feasible;
      all.push_back(c);
      // Recomputing more only adds time: once one fits, the rest cannot win.
      if (c.fits) break;
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
