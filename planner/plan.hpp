// Plan: a strategy with its stage partition, rank placement, prediction and provenance; the
// `loom-plan/1` document (spec/formats.md) that joins the planner, the simulator and the executor.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "costmodel/estimate.hpp"
#include "costmodel/strategy.hpp"

namespace loom::planner {

// The version written into every plan (the project version from CMake).
const char* loom_version();

// Where one rank runs and its coordinates in the dp x tp x pp grid.
struct RankPlacement {
  int rank = 0;
  std::string device;
  int dp = 0;
  int tp = 0;
  int pp = 0;
  bool operator==(const RankPlacement&) const = default;
};

struct Plan {
  std::string loom_version;
  profiles::ModelSpec model;
  profiles::Cluster cluster;
  costmodel::Job job;
  costmodel::Strategy strategy;
  std::vector<costmodel::StageRange> stages;
  std::vector<RankPlacement> ranks;
  costmodel::Prediction predicted;
  std::vector<std::string> why;
  costmodel::CostOptions cost_options;  // provenance: the cost-model settings used
};

// Megatron-LM's rank order: tp varies fastest, then dp, then pp; rank r on device r.
std::vector<RankPlacement> megatron_placement(const costmodel::Strategy& strategy,
                                              const profiles::Cluster& cluster);

nlohmann::json plan_to_json(const Plan& plan);

// Evaluates exactly `strategy` (even stage partition, Megatron placement) with the analytical
// cost model; `why` is left for the caller. Throws InputError (source "strategy") when the strategy
// cannot run the job.
Plan evaluate_strategy(const costmodel::CostModel& model, const costmodel::Job& job,
                       const costmodel::Strategy& strategy);

}  // namespace loom::planner
