// The reasons a search gives for its best plan, as lines for people:
// - per dimension, why the chosen value beat another one (dimension_reasons): the fastest plan
//   that differs in that dimension alone, or the leanest one when none of those fits;
// - about the plan itself (plan_reasons): its partition against the even split, its profile and
//   vocabulary notes, its rank placement, its tensor-parallel traffic.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "costmodel/estimate.hpp"
#include "planner/plan.hpp"

namespace loom::planner {

// What the search remembers of every candidate, to rank and to explain.
struct Candidate {
  costmodel::Strategy strategy;
  std::vector<costmodel::StageRange> stages;
  double step_time_s = 0;
  double peak_memory_bytes = 0;
  int peak_stage = 0;
  bool fits = false;
  std::int64_t order = 0;  // enumeration order, for deterministic ties
};

// Per dimension the user did not pin, why the best plan's value beat another (the other
// dimensions equal): "tp=2 chosen over tp=4: ...". `chose_layers`: the search, not the user, set
// the best plan's recompute_layers.
std::vector<std::string> dimension_reasons(const Candidate& best, const std::vector<Candidate>& all,
                                           const profiles::ModelSpec& model, bool chose_layers);

// The same among simulated plans: `ranked` in simulated order, its first the best; each reason
// names the fastest simulated plan that differs in that dimension alone.
std::vector<std::string> simulated_dimension_reasons(const std::vector<Plan>& ranked,
                                                     bool chose_layers);

// Lines about `plan` itself under `cost` (its CostModel, rank mapping included);
// `pinned_stages`: the user gave the partition.
std::vector<std::string> plan_reasons(const Plan& plan, const costmodel::CostModel& cost,
                                      bool pinned_stages);

}  // namespace loom::planner
