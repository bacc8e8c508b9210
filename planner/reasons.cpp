#include "planner/reasons.hpp"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string_view>

#include "costmodel/layers.hpp"
#include "profiles/topology.hpp"
#include "profiles/units.hpp"

namespace loom::planner {

using costmodel::Recompute;
using costmodel::Schedule;
using costmodel::Strategy;

namespace {

// The value of one dimension, for "X chosen over Y" explanations.
struct Dimension {
  const char* name;
  int (*value)(const Strategy&);
  std::string (*label)(int);
};

std::string int_label(int v) { return std::to_string(v); }
std::string recompute_label(int v) { return costmodel::to_string(static_cast<Recompute>(v)); }
std::string schedule_label(int v) { return costmodel::to_string(static_cast<Schedule>(v)); }
std::string on_off_label(int v) { return v != 0 ? "on" : "off"; }

constexpr Dimension kDimensions[] = {
    // dp alone changes only where the world size is searched (fewer ranks than cores on a CPU
    // node); elsewhere it follows from tp and pp.
    {"dp", [](const Strategy& s) { return s.dp; }, int_label},
    {"tp", [](const Strategy& s) { return s.tp; }, int_label},
    {"pp", [](const Strategy& s) { return s.pp; }, int_label},
    {"cp", [](const Strategy& s) { return s.cp; }, int_label},
    {"zero", [](const Strategy& s) { return s.zero; }, int_label},
    {"micro-batch", [](const Strategy& s) { return static_cast<int>(s.micro_batch); }, int_label},
    {"schedule", [](const Strategy& s) { return static_cast<int>(s.schedule); }, schedule_label},
    {"recompute", [](const Strategy& s) { return static_cast<int>(s.recompute); }, recompute_label},
    {"sequence-parallel", [](const Strategy& s) { return s.sequence_parallel ? 1 : 0; },
     on_off_label},
};

// Whether dimension `d` means anything for `s`: the schedule only orders a pipeline, sequence
// parallelism only shards over tensor-parallel ranks.
bool applies(const Dimension& d, const Strategy& s) {
  const std::string_view name(d.name);
  if (name == "schedule") return s.pp > 1;
  if (name == "sequence-parallel") return s.tp > 1;
  return true;
}

// Whether `other` is `best` with dimension `d` changed and nothing else the user could pin: every
// other dimension equal where it means something for both, virtual stages, recomputed layers and
// attention too. The derived counts follow: dp with tp and pp on the same devices, micro-batches
// per step with the micro-batch and dp.
bool one_dimension_apart(const Dimension& d, const Strategy& best, const Strategy& other) {
  if (d.value(other) == d.value(best)) return false;
  const bool dp = std::string_view(d.name) == "dp";
  for (const Dimension& e : kDimensions) {
    if (&e == &d || std::string_view(e.name) == "dp") continue;
    if (!applies(e, best) || !applies(e, other)) continue;
    if (e.value(best) != e.value(other)) return false;
  }
  if (!dp && best.world_size() != other.world_size()) return false;
  if (best.attention != other.attention) return false;
  if (best.pp > 1 && other.pp > 1 && best.virtual_stages != other.virtual_stages) return false;
  const bool both_full = best.recompute == Recompute::kFull && other.recompute == Recompute::kFull;
  return !both_full || best.recompute_layers == other.recompute_layers;
}

// Why a plan the search gave recompute_layers recomputes no more layers.
std::string fewest_layers_reason(const Strategy& s, const profiles::ModelSpec& model) {
  return "full recomputation of the first " + std::to_string(s.recompute_layers) +
         " of each chunk's " + std::to_string(costmodel::largest_chunk_layers(s, model.layers)) +
         " layers: the fewest that fit";
}

std::string ranges(const std::vector<costmodel::StageRange>& stages) {
  std::string out;
  for (const auto& r : stages) {
    if (!out.empty()) out += " | ";
    out += std::to_string(r.first_layer) + "-" + std::to_string(r.last_layer);
  }
  return out;
}

// The slowest stage's per-micro-batch time (forward + backward) under a partition.
double slowest_stage_s(const costmodel::CostModel& cost, const costmodel::Job& job,
                       const Strategy& s, const std::vector<costmodel::StageRange>& stages) {
  const costmodel::SequenceCosts c = cost.sequence_costs(job, s);
  const int last = costmodel::layer_sequence_length(cost.model()) - 1;
  std::vector<double> per_rank(static_cast<std::size_t>(s.pp), 0);
  for (std::size_t i = 0; i < stages.size(); ++i) {
    double t = 0;
    for (int e = stages[i].first_layer; e <= stages[i].last_layer; ++e) {
      const costmodel::EntryCost& k = e == 0 ? c.embedding : e == last ? c.head : c.layer;
      t += k.forward_s + k.backward_s;
    }
    per_rank[i % static_cast<std::size_t>(s.pp)] += t;
  }
  return *std::max_element(per_rank.begin(), per_rank.end());
}

// Megatron-LM pads the vocabulary to a multiple of this times tp (--make-vocab-size-divisible-by).
constexpr std::int64_t kVocabularyMultiple = 128;

// When the plan's vocabulary is not a multiple of 128 * tp and padding it makes the same plan
// faster by at least half a percent (a language-model head's products whose rows are not whole
// 16-byte vectors run slower: costmodel/gemm.hpp), says so with both analytical step times.
std::optional<std::string> vocabulary_note(const Plan& plan, const costmodel::CostModel& cost) {
  const Strategy& s = plan.strategy;
  const std::int64_t multiple = kVocabularyMultiple * s.tp;
  const std::int64_t vocab = plan.model.vocab;
  if (vocab % multiple == 0) return std::nullopt;
  profiles::ModelSpec padded = plan.model;
  padded.vocab = (vocab + multiple - 1) / multiple * multiple;
  const costmodel::Prediction now = cost.estimate(plan.job, s, plan.stages);
  const costmodel::Prediction then = cost.with_model(padded).estimate(plan.job, s, plan.stages);
  if (then.step_time_s > 0.995 * now.step_time_s) return std::nullopt;
  const profiles::Unit time = profiles::time_unit(now.step_time_s);
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "vocabulary %lld padded to %lld (a multiple of %lld x tp, as Megatron-LM's "
                "--make-vocab-size-divisible-by %lld pads it): %s per step vs %s (%+.1f %%), "
                "analytical; the LM head's products then read whole 16-byte vectors",
                static_cast<long long>(vocab), static_cast<long long>(padded.vocab),
                static_cast<long long>(kVocabularyMultiple),
                static_cast<long long>(kVocabularyMultiple),
                profiles::unit_text(then.step_time_s, time, 3).c_str(),
                profiles::unit_text(now.step_time_s, time, 3).c_str(),
                100.0 * (then.step_time_s / now.step_time_s - 1));
  return std::string(buf);
}

}  // namespace

std::vector<std::string> dimension_reasons(const Candidate& best, const std::vector<Candidate>& all,
                                           const profiles::ModelSpec& model, bool chose_layers) {
  std::vector<std::string> why;
  // Durations in the unit the plan's summary prints its step time in.
  const profiles::Unit time = profiles::time_unit(best.step_time_s);
  for (const Dimension& d : kDimensions) {
    if (!applies(d, best.strategy)) continue;
    int chosen = d.value(best.strategy);
    const Candidate* faster_other = nullptr;   // best feasible with another value
    const Candidate* leanest_other = nullptr;  // smallest memory with another value
    for (const Candidate& c : all) {
      if (!one_dimension_apart(d, best.strategy, c.strategy)) continue;
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
      std::snprintf(buf, sizeof buf, "%s=%s: %s vs %s per step (%+.1f %%)", d.name,
                    d.label(d.value(faster_other->strategy)).c_str(),
                    profiles::unit_text(best.step_time_s, time, 3).c_str(),
                    profiles::unit_text(faster_other->step_time_s, time, 3).c_str(),
                    100 * (faster_other->step_time_s / best.step_time_s - 1));
      why.push_back(head + buf);
    } else if (leanest_other != nullptr) {
      why.push_back(head + d.name + "=" + d.label(d.value(leanest_other->strategy)) + ": " +
                    d.name + "=" + d.label(d.value(leanest_other->strategy)) + " needs at least " +
                    profiles::gib_text(leanest_other->peak_memory_bytes, 1) + " on stage " +
                    std::to_string(leanest_other->peak_stage) + " (" +
                    costmodel::describe(leanest_other->strategy) + ")");
    }
  }
  if (chose_layers && best.strategy.recompute_layers > 0) {
    why.push_back(fewest_layers_reason(best.strategy, model));
  }
  return why;
}

std::vector<std::string> plan_reasons(const Plan& plan, const costmodel::CostModel& cost,
                                      bool pinned_stages) {
  std::vector<std::string> why;
  const Strategy& s = plan.strategy;
  const auto even = costmodel::even_partition(plan.model, s.pp * s.virtual_stages);
  char buf[256];
  // Durations in the unit the plan's summary prints its step time in.
  const profiles::Unit time = profiles::time_unit(plan.predicted.step_time_s);
  auto duration = [&](double seconds) { return profiles::unit_text(seconds, time, 3); };
  if (pinned_stages) {
    std::snprintf(buf, sizeof buf, "stages %s as pinned; slowest stage %s per micro-batch",
                  ranges(plan.stages).c_str(),
                  duration(slowest_stage_s(cost, plan.job, s, plan.stages)).c_str());
    why.emplace_back(buf);
  } else if (plan.stages != even) {
    std::snprintf(buf, sizeof buf,
                  "stages %s balanced by time and memory: slowest stage %s per micro-batch "
                  "vs %s with equal layer counts (%s)",
                  ranges(plan.stages).c_str(),
                  duration(slowest_stage_s(cost, plan.job, s, plan.stages)).c_str(),
                  duration(slowest_stage_s(cost, plan.job, s, even)).c_str(), ranges(even).c_str());
    why.emplace_back(buf);
  }
  for (const std::string& note : cost.profile_notes(plan.job, s)) {
    why.push_back("profile: " + note);
  }
  if (auto note = vocabulary_note(plan, cost)) why.push_back(*note);
  const std::vector<int>& mapping = cost.device_of_rank();
  bool identity = true;
  for (std::size_t r = 0; r < mapping.size(); ++r) identity = identity && mapping[r] == int(r);
  const profiles::Topology& topo = cost.topology();
  if (!identity) {
    const int dp = costmodel::gradient_view(s).dp;  // cp's ranks sit beside dp's
    const int inner = s.tp > 1 ? s.tp : dp > 1 ? dp : s.pp;
    const char* name = s.tp > 1 ? "tp" : dp > 1 ? (s.cp > 1 ? "cp and dp" : "dp") : "pp";
    std::vector<std::vector<int>> mapped, ordered;
    for (int n = 0; n < plan.cluster.devices_per_node; n += inner) {
      mapped.emplace_back(mapping.begin() + n, mapping.begin() + n + inner);
      ordered.emplace_back();
      for (int i = 0; i < inner; ++i) ordered.back().push_back(n + i);
    }
    std::string groups;
    for (const auto& g : mapped) {
      groups += groups.empty() ? "" : ", ";
      for (std::size_t i = 0; i < g.size(); ++i) {
        groups += (i ? "+" : "") + topo.device_name(g[i]);
      }
    }
    std::snprintf(buf, sizeof buf,
                  "%s groups placed on %s by link bandwidth: %.4g GB/s per ring hop vs %.4g GB/s "
                  "in device order",
                  name, groups.c_str(), topo.concurrent_rings(mapped).bandwidth_gbps,
                  topo.concurrent_rings(ordered).bandwidth_gbps);
    why.emplace_back(buf);
  }
  if (s.tp > 1) {
    // Megatron's f and g: two all-reduces of b*s*h forward and two backward per layer (two more
    // with full recomputation), each moving 2 (n-1)/n of the buffer per rank.
    const std::int64_t tokens = costmodel::rank_tokens(plan.job, s);
    const double act = static_cast<double>(s.micro_batch * tokens * plan.model.hidden) *
                       costmodel::element_bytes(plan.job.precision);
    const double per_layer = (s.recompute == costmodel::Recompute::kFull ? 6 : 4) * act;
    const double layers_per_rank = static_cast<double>(plan.model.layers) / s.pp;
    const double bytes = per_layer * layers_per_rank * static_cast<double>(s.num_micro_batches) *
                         2 * (s.tp - 1) / s.tp;
    std::vector<int> group(mapping.begin(), mapping.begin() + s.tp);
    const profiles::PathMetrics link = topo.slowest_link(group);
    const bool one_node = topo.node_of(group.front()) == topo.node_of(group.back());
    const std::string kind =
        one_node ? (plan.cluster.links.empty() ? plan.cluster.intra_node.kind : "declared links")
                 : (plan.cluster.inter_node ? plan.cluster.inter_node->kind : "inter-node");
    std::snprintf(buf, sizeof buf,
                  "tp=%d keeps %s per step per rank of tensor-parallel traffic on %s (%.4g GB/s, "
                  "%s)",
                  s.tp, profiles::bytes_text(bytes).c_str(), kind.c_str(), link.bandwidth_gbps,
                  one_node ? "inside a node" : "across nodes");
    why.emplace_back(buf);
  }
  return why;
}

std::vector<std::string> simulated_dimension_reasons(const std::vector<Plan>& ranked,
                                                     bool chose_layers) {
  const Plan& best = ranked.front();
  std::vector<std::string> why;
  const profiles::Unit time = profiles::time_unit(best.predicted.step_time_s);
  for (const Dimension& d : kDimensions) {
    if (!applies(d, best.strategy)) continue;
    const int chosen = d.value(best.strategy);
    const Plan* other = nullptr;
    for (std::size_t i = 1; i < ranked.size() && other == nullptr; ++i) {
      if (one_dimension_apart(d, best.strategy, ranked[i].strategy)) other = &ranked[i];
    }
    if (other == nullptr) continue;
    char line[200];
    std::snprintf(line, sizeof line,
                  "%s=%s chosen over %s=%s: %s vs %s per step simulated (%+.1f %%)", d.name,
                  d.label(chosen).c_str(), d.name, d.label(d.value(other->strategy)).c_str(),
                  profiles::unit_text(best.predicted.step_time_s, time, 3).c_str(),
                  profiles::unit_text(other->predicted.step_time_s, time, 3).c_str(),
                  100 * (other->predicted.step_time_s / best.predicted.step_time_s - 1));
    why.emplace_back(line);
  }
  if (chose_layers && best.strategy.recompute_layers > 0) {
    why.push_back(fewest_layers_reason(best.strategy, best.model));
  }
  return why;
}

}  // namespace loom::planner
