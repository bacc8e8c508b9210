#include "planner/search.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <exception>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <set>
#include <string_view>
#include <thread>
#include <tuple>

#include "costmodel/layers.hpp"
#include "costmodel/runtime.hpp"
#include "costmodel/simulator.hpp"
#include "planner/mapping.hpp"
#include "planner/partition.hpp"
#include "planner/reasons.hpp"
#include "planner/space.hpp"
#include "profiles/units.hpp"

namespace loom::planner {

using costmodel::Recompute;
using costmodel::Schedule;
using costmodel::Strategy;

namespace {

// A step time in whole nanoseconds: the rankings' key, so that plans whose times differ only by
// rounding (GPipe and 1F1B when memory allows both) tie and the tie goes to the smaller one.
std::int64_t nanoseconds(double seconds) { return std::llround(seconds * 1e9); }

}  // namespace

costmodel::Attention default_attention(const profiles::Cluster& cluster,
                                       profiles::Precision precision) {
  const bool half = costmodel::element_bytes(precision) == 2;
  const bool fused = cluster.device.kind == profiles::DeviceKind::kGpu && half &&
                     cluster.device.peak_tflops.bf16 > 0;
  return fused ? costmodel::Attention::kFlash : costmodel::Attention::kMath;
}

std::string binding_constraint(const Plan& plan, double memory_margin) {
  const costmodel::Prediction& p = plan.predicted;
  double limit = memory_margin * static_cast<double>(plan.cluster.device.memory_bytes);
  if (p.peak_memory_bytes >= 0.9 * limit) return "memory";
  const costmodel::ExposedCommunication& e = p.exposed_communication_s;
  double bubble = p.bubble_fraction / (1 + p.bubble_fraction) *
                  (p.step_time_s - e.dp - e.zero - p.optimizer_s - e.tp - e.pp);
  const double host = costmodel::runtime_host_s_per_step(plan.model, plan.job, plan.strategy);
  std::pair<double, const char*> parts[] = {{bubble, "bubble"},    {e.tp, "tp comm"},
                                            {e.pp, "pp comm"},     {e.dp, "dp comm"},
                                            {e.zero, "zero comm"}, {p.optimizer_s, "optimizer"},
                                            {host, "host hooks"}};
  auto worst = *std::max_element(std::begin(parts), std::end(parts),
                                 [](const auto& a, const auto& b) { return a.first < b.first; });
  if (worst.first < 0.1 * p.step_time_s) return "compute";
  return worst.second;
}

namespace {

// One CostModel per (tp, dp, pp) shape: the rank-to-device mapping depends on the shape only.
class ShapeCosts {
 public:
  explicit ShapeCosts(const costmodel::CostModel& base) : base_(base) {}
  const costmodel::CostModel& of(const Strategy& s) {
    auto key = std::make_tuple(s.tp, costmodel::gradient_view(s).dp, s.pp);
    auto it = costs_.find(key);
    if (it == costs_.end()) {
      std::vector<int> mapping = map_ranks(base_.topology(), base_.cluster(), s);
      it = costs_
               .emplace(key, std::make_unique<costmodel::CostModel>(
                                 base_.with_mapping(std::move(mapping))))
               .first;
    }
    return *it->second;
  }

 private:
  const costmodel::CostModel& base_;
  std::map<std::tuple<int, int, int>, std::unique_ptr<costmodel::CostModel>> costs_;
};

// Plans whose step has more tasks than this keep their analytical figure in the search (each
// such simulation takes tens of milliseconds; `loom simulate` plays any plan). About 60 000
// tasks keep the refinement of GPT-3 175B on 1024 GPUs inside the 1 s search budget.
constexpr std::int64_t kMaxSimulatedTasks = 60000;

// Replaces the analytical predictions of `plans` by simulated ones and re-ranks them; the best
// plan keeps its reasons and says how the simulation changed the figure.
void refine_by_simulation(ShapeCosts& costs, std::vector<Plan>* plans, bool pinned_stages,
                          bool chose_layers) {
  costmodel::SimulationOptions options;
  options.record_trace = false;
  options.max_tasks = kMaxSimulatedTasks;
  std::vector<double> analytical;
  std::vector<const costmodel::CostModel*> models;  // costs.of() is not thread-safe: first
  for (const Plan& p : *plans) {
    analytical.push_back(p.predicted.step_time_s);
    models.push_back(&costs.of(p.strategy));
  }
  // The simulations are independent (a CostModel's path cache has a lock): one per core at once.
  // Each writes only its own result, so the outcome is the same however they interleave.
  std::vector<costmodel::SimulationResult> sims(plans->size());
  std::vector<std::exception_ptr> errors(plans->size());
  std::atomic<std::size_t> next{0};
  auto work = [&]() {
    for (std::size_t i = next++; i < sims.size(); i = next++) {
      const Plan& p = (*plans)[i];
      try {
        sims[i] = costmodel::simulate(*models[i], p.job, p.strategy, p.stages, options);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    }
  };
  const std::size_t workers =
      std::min<std::size_t>(sims.size(), std::max(1U, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (std::size_t w = 1; w < workers; ++w) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  for (const std::exception_ptr& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  for (std::size_t i = 0; i < sims.size(); ++i) {
    if (!sims[i].skipped) (*plans)[i].predicted = sims[i].prediction;
  }
  std::vector<std::size_t> order(plans->size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const costmodel::Prediction& x = (*plans)[a].predicted;
    const costmodel::Prediction& y = (*plans)[b].predicted;
    const std::int64_t tx = nanoseconds(x.step_time_s), ty = nanoseconds(y.step_time_s);
    if (tx != ty) return tx < ty;
    return x.peak_memory_bytes < y.peak_memory_bytes;
  });
  std::vector<Plan> ranked;
  ranked.reserve(order.size());
  for (std::size_t i : order) ranked.push_back(std::move((*plans)[i]));
  if (order.front() != 0) {
    // The simulation overturned the analytical winner: the new first place gets reasons of its
    // own, per dimension against the best simulated plan with another value, then its partition,
    // placement and profile notes.
    Plan& best = ranked.front();
    best.why.clear();
    best.why = simulated_dimension_reasons(ranked, chose_layers);
    for (std::string& w : plan_reasons(best, costs.of(best.strategy), pinned_stages)) {
      best.why.push_back(std::move(w));
    }
  }
  char buf[200];
  const std::size_t first = order.front();
  const profiles::Unit time = profiles::time_unit(ranked.front().predicted.step_time_s);
  std::snprintf(
      buf, sizeof buf, "ranked by simulation of the top %zu: %s per step %s (%s analytical)%s",
      ranked.size(), profiles::unit_text(ranked.front().predicted.step_time_s, time, 3).c_str(),
      ranked.front().predicted.source == "simulation" ? "simulated"
                                                      : "(too large to simulate here)",
      profiles::unit_text(analytical[first], time, 3).c_str(),
      first == 0 ? "" : "; the simulation reordered the analytical ranking");
  ranked.front().why.insert(ranked.front().why.begin(), buf);
  for (std::size_t i = 1; i < ranked.size(); ++i) {
    std::snprintf(buf, sizeof buf, "%.1f %% slower than the best plan (simulated)",
                  100 * (ranked[i].predicted.step_time_s / ranked[0].predicted.step_time_s - 1));
    ranked[i].why = {buf};
  }
  *plans = std::move(ranked);
}

// The balanced partition, for the pipelined strategies that could win: within 30 % of the best
// feasible time with even stages (all pipelined ones when none fits). Counts its estimates in
// `evaluated`.
void rebalance(ShapeCosts& costs, const costmodel::Job& job, double limit,
               std::vector<Candidate>* all, std::int64_t* evaluated) {
  double best = std::numeric_limits<double>::infinity();
  for (const Candidate& c : *all) {
    if (c.fits) best = std::min(best, c.step_time_s);
  }
  for (Candidate& c : *all) {
    const Strategy& s = c.strategy;
    if (s.pp == 1 || s.schedule == Schedule::kInterleaved) continue;
    if (std::isfinite(best) && c.step_time_s > 1.3 * best) continue;
    const costmodel::CostModel& shaped = costs.of(s);
    const costmodel::StepTerms terms = shaped.step_terms(job, s);
    auto balanced = balanced_partition(shaped, terms, job, s, limit);
    if (!balanced || *balanced == c.stages) continue;
    const costmodel::Prediction p = shaped.estimate(terms, job, s, *balanced);
    ++*evaluated;
    const bool fits = p.peak_memory_bytes <= limit;
    if ((fits && !c.fits) || (fits == c.fits && p.step_time_s < c.step_time_s)) {
      c.stages = *balanced;
      c.step_time_s = p.step_time_s;
      c.peak_memory_bytes = p.peak_memory_bytes;
      c.fits = fits;
    }
  }
}

// One estimate of `s` on `stages` from its terms, numbered `order`.
Candidate estimated(const costmodel::CostModel& shaped, const costmodel::StepTerms& terms,
                    const costmodel::Job& job, const Strategy& s,
                    const std::vector<costmodel::StageRange>& stages, double limit,
                    std::int64_t order) {
  const costmodel::Prediction p = shaped.estimate(terms, job, s, stages);
  Candidate c;
  c.strategy = s;
  c.stages = stages;
  c.step_time_s = p.step_time_s;
  c.peak_memory_bytes = p.peak_memory_bytes;
  auto peak = std::max_element(p.memory_by_stage.begin(), p.memory_by_stage.end(),
                               [](const auto& x, const auto& y) { return x.total() < y.total(); });
  c.peak_stage = static_cast<int>(peak - p.memory_by_stage.begin());
  c.fits = p.peak_memory_bytes <= limit;
  c.order = order;
  return c;
}

// The same, computing the terms of `s`.
Candidate estimated(const costmodel::CostModel& shaped, const costmodel::Job& job,
                    const Strategy& s, const std::vector<costmodel::StageRange>& stages,
                    double limit, std::int64_t order) {
  return estimated(shaped, shaped.step_terms(job, s), job, s, stages, limit, order);
}

// `full` recomputes every layer and fits where recomputing none needs `none_peak_bytes`, more
// than `limit`: the fewest layers per chunk whose recomputation fits (Strategy::
// recompute_layers), or nullopt. The kept activations fall linearly in the count from none's
// peak to full's (less the working set of a layer run again, which only full pays), so the count
// that line gives is tried, then one fewer when it fits or one more when it does not.
std::optional<Candidate> fewest_recomputing(const costmodel::CostModel& shaped,
                                            const costmodel::Job& job, const Candidate& full,
                                            double none_peak_bytes, double limit,
                                            std::int64_t* evaluated) {
  const Strategy& s = full.strategy;
  const auto chunk_layers =
      static_cast<int>(costmodel::largest_chunk_layers(s, shaped.model().layers));
  if (chunk_layers < 2 || none_peak_bytes <= full.peak_memory_bytes) return std::nullopt;
  const double share = (none_peak_bytes - limit) / (none_peak_bytes - full.peak_memory_bytes);
  const int guess =
      std::clamp(static_cast<int>(std::ceil(share * chunk_layers)), 1, chunk_layers - 1);
  auto at = [&](int layers) {
    Strategy x = s;
    x.recompute_layers = layers;
    return estimated(shaped, job, x, full.stages, limit, (*evaluated)++);
  };
  Candidate c = at(guess);
  if (c.fits) {
    if (guess == 1) return c;
    Candidate fewer = at(guess - 1);
    return fewer.fits ? fewer : c;
  }
  if (guess + 1 >= chunk_layers) return std::nullopt;
  c = at(guess + 1);
  return c.fits ? std::optional<Candidate>(c) : std::nullopt;
}

// With full recomputation pinned, the reason line that says when recomputing fewer of the best
// plan's layers (or none) also fits, and how much faster that is; nullopt when nothing lighter
// fits.
std::optional<std::string> lighter_recompute_hint(const costmodel::CostModel& shaped,
                                                  const costmodel::Job& job, const Candidate& best,
                                                  double limit) {
  if (!best.fits) return std::nullopt;
  Strategy none = best.strategy;
  none.recompute = Recompute::kNone;
  none.recompute_layers = 0;
  std::int64_t evaluated = 0;
  const Candidate plain = estimated(shaped, job, none, best.stages, limit, 0);
  const std::optional<Candidate> lighter =
      plain.fits
          ? std::optional<Candidate>(plain)
          : fewest_recomputing(shaped, job, best, plain.peak_memory_bytes, limit, &evaluated);
  if (!lighter || lighter->step_time_s >= best.step_time_s) return std::nullopt;
  const int layers = lighter->strategy.recompute_layers;
  const std::string flag =
      layers > 0 ? "--recompute-layers " + std::to_string(layers) : std::string("--recompute none");
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s would also fit (%s) and is %.1f %% faster", flag.c_str(),
                profiles::gib_text(lighter->peak_memory_bytes, 1).c_str(),
                100 * (1 - lighter->step_time_s / best.step_time_s));
  return std::string(buf);
}

// The best plan's reasons: per dimension (or that every one was pinned), the lighter
// recomputation a pinned full one leaves aside, then its partition, placement and profile notes.
std::vector<std::string> first_reasons(const Plan& plan, const costmodel::CostModel& shaped,
                                       const costmodel::Job& job, const std::vector<Candidate>& all,
                                       const Candidate& best, const SearchOptions& o,
                                       bool all_pinned, double limit) {
  std::vector<std::string> why;
  if (all_pinned) {
    why.emplace_back("every dimension was pinned; evaluated as given");
  } else {
    why = dimension_reasons(best, all, plan.model, o.recompute_layers == 0);
  }
  if (o.recompute == Recompute::kFull && o.recompute_layers == 0) {
    if (auto hint = lighter_recompute_hint(shaped, job, best, limit)) why.push_back(*hint);
  }
  for (std::string& w : plan_reasons(plan, shaped, o.stages.has_value())) {
    why.push_back(std::move(w));
  }
  return why;
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
  SearchOptions pinned = o;
  if (o.stages) {
    const int stage_count = static_cast<int>(o.stages->size());
    if (o.pp && *o.pp != stage_count) {
      result.infeasible_reason = "--stages lists " + std::to_string(stage_count) +
                                 " stages but --pp is " + std::to_string(*o.pp);
      return result;
    }
    if (o.schedule == Schedule::kInterleaved) {
      result.infeasible_reason =
          "--stages pins one range per pipeline rank; the interleaved schedule needs pp*v chunks";
      return result;
    }
    pinned.pp = stage_count;
    if (!o.schedule && stage_count > 1) pinned.schedule = Schedule::k1F1B;
  }
  const std::vector<Recompute> recomputes =
      o.recompute
          ? std::vector<Recompute>{*o.recompute}
          : std::vector<Recompute>{Recompute::kNone, Recompute::kSelective, Recompute::kFull};
  ShapeCosts costs(cost);
  // (tp, pp, dp, zero, schedule, v, sp) whose leanest recomputation did not fit at a smaller
  // micro-batch: larger micro-batches cannot fit either.
  std::set<std::tuple<int, int, int, int, int, int, bool>> too_big;
  for (Strategy s : candidate_strategies(model, cluster, job, pinned, &first_refusal)) {
    const auto key = std::make_tuple(s.tp, s.pp, s.dp, s.zero, static_cast<int>(s.schedule),
                                     s.virtual_stages, s.sequence_parallel);
    result.searched += static_cast<std::int64_t>(recomputes.size());
    if (o.prune && too_big.count(key) != 0) continue;
    std::vector<costmodel::StageRange> stages =
        o.stages ? *o.stages : costmodel::even_partition(model, s.pp * s.virtual_stages);
    if (o.stages) {
      if (auto why = costmodel::check_partition(model, s, stages)) {
        if (first_refusal.empty()) first_refusal = "--stages: " + *why;
        continue;
      }
    }
    const costmodel::CostModel& shaped = costs.of(s);
    double none_peak_bytes = 0;
    bool lighter_fits = false;  // none or selective recomputation fits
    for (std::size_t k = 0; k < recomputes.size(); ++k) {
      const Recompute rc = recomputes[k];
      s.recompute = rc;
      s.recompute_layers = rc == Recompute::kFull ? o.recompute_layers : 0;
      const costmodel::StepTerms terms = shaped.step_terms(job, s);
      Candidate c = estimated(shaped, terms, job, s, stages, limit, result.evaluated++);
      if (rc == Recompute::kNone) none_peak_bytes = c.peak_memory_bytes;
      // Unpinned, full recomputation is of only as many layers as the plan needs to fit, where
      // nothing lighter fits.
      if (rc != Recompute::kFull) lighter_fits = lighter_fits || c.fits;
      if (rc == Recompute::kFull && c.fits && !o.recompute && !lighter_fits &&
          none_peak_bytes > limit) {
        if (auto fewer =
                fewest_recomputing(shaped, job, c, none_peak_bytes, limit, &result.evaluated)) {
          c = *fewer;
        }
      }
      all.push_back(c);
      // Recomputing more only adds time: once one fits, the rest cannot win. They keep less
      // than this one, so they fit too: counted as feasible without being evaluated.
      if (o.prune && c.fits) {
        result.feasible += static_cast<std::int64_t>(recomputes.size() - k - 1);
        break;
      }
      // Larger micro-batches cannot fit when no partition of this one fits (the rebalancing
      // below may still find one that its even split misses).
      if (rc == recomputes.back() && !c.fits) {
        const bool rebalanced = !o.stages && s.pp > 1 && s.schedule != Schedule::kInterleaved;
        if (!rebalanced || !balanced_partition(shaped, terms, job, s, limit)) {
          too_big.insert(key);
        }
      }
    }
  }

  if (!o.stages) rebalance(costs, job, limit, &all, &result.evaluated);
  for (const Candidate& c : all) {
    if (c.fits) ++result.feasible;
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
    result.infeasible_reason =
        "does not fit: the smallest memory need is " +
        profiles::gib_text(lean.peak_memory_bytes, 1) + " per device (stage " +
        std::to_string(lean.peak_stage) + ") at " + costmodel::describe(lean.strategy) +
        "; the device has " +
        profiles::gib_text(static_cast<double>(cluster.device.memory_bytes), 1) +
        " and plans may use " + buf + " of it (" + profiles::gib_text(limit, 1) + ")";
    return result;
  }

  std::vector<const Candidate*> ranked;
  for (const Candidate& c : all) {
    if (c.fits) ranked.push_back(&c);
  }
  std::stable_sort(ranked.begin(), ranked.end(), [](const Candidate* a, const Candidate* b) {
    // Equally fast (to the nanosecond): the one that holds less memory (1F1B over GPipe), then
    // enumeration order.
    const std::int64_t ta = nanoseconds(a->step_time_s), tb = nanoseconds(b->step_time_s);
    if (ta != tb) return ta < tb;
    if (a->peak_memory_bytes != b->peak_memory_bytes) {
      return a->peak_memory_bytes < b->peak_memory_bytes;
    }
    return a->order < b->order;
  });
  std::size_t keep =
      std::min<std::size_t>(ranked.size(), static_cast<std::size_t>(std::max(1, o.top)));
  for (std::size_t i = 0; i < keep; ++i) {
    const costmodel::CostModel& shaped = costs.of(ranked[i]->strategy);
    Plan plan = evaluate_strategy(shaped, job, ranked[i]->strategy, ranked[i]->stages);
    if (i == 0) {
      plan.why = first_reasons(plan, shaped, job, all, *ranked[0], o, result.searched == 1, limit);
    } else {
      char buf[96];
      std::snprintf(buf, sizeof buf, "%.1f %% slower than the best plan",
                    100 * (ranked[i]->step_time_s / ranked[0]->step_time_s - 1));
      plan.why.push_back(buf);
    }
    result.plans.push_back(std::move(plan));
  }
  if (o.simulate) {
    refine_by_simulation(costs, &result.plans, o.stages.has_value(), o.recompute_layers == 0);
  }
  return result;
}

}  // namespace loom::planner
