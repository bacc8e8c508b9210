// The planner's search: every dp x tp x pp factorisation of the devices, ZeRO stage, micro-batch
// size, schedule (with virtual stages) and recomputation, each dimension optionally pinned;
// every candidate is estimated analytically, the ones that fit are ranked by step time.
// Deterministic: the same input gives the same plans in the same order.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "costmodel/estimate.hpp"
#include "planner/plan.hpp"

namespace loom::planner {

// Dimensions the user pinned; nullopt ones are searched.
struct SearchOptions {
  std::optional<int> tp;
  std::optional<int> pp;
  std::optional<int> dp;
  std::optional<int> zero;
  std::optional<std::int64_t> micro_batch;
  std::optional<costmodel::Schedule> schedule;
  std::optional<int> virtual_stages;
  std::optional<costmodel::Recompute> recompute;
  double memory_margin = 0.9;  // fraction of device memory a plan may use
  int top = 5;
};

struct SearchResult {
  std::vector<Plan> plans;    // the best `top` feasible plans, fastest first
  std::int64_t searched = 0;  // candidates estimated
  std::int64_t feasible = 0;  // of which fit in memory
  // When nothing fits: which limit was hit and by how much (empty otherwise).
  std::string infeasible_reason;
};

SearchResult search(const costmodel::CostModel& cost, const costmodel::Job& job,
                    const SearchOptions& options);

// One short label for what limits a plan most: "memory", "bubble", "tp comm", "pp comm",
// "dp comm", "zero comm", "optimizer" or "compute".
std::string binding_constraint(const Plan& plan, double memory_margin);

}  // namespace loom::planner
