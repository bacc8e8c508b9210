// Plan: a strategy with its stage partition, rank placement, prediction and provenance; the
// `loom-plan/1` document (docs/formats.md) that joins the planner, the simulator and the executor.
#pragma once

#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "costmodel/estimate.hpp"
#include "costmodel/strategy.hpp"

namespace loom::planner {

// The version written into every plan (the project version from CMake).
const char* loom_version();

// Where one rank runs and its coordinates in the dp x tp x pp (x cp) grid.
struct RankPlacement {
  int rank = 0;
  std::string device;
  int dp = 0;
  int tp = 0;
  int pp = 0;
  int cp = 0;  // JSON "cp", written when the strategy's cp > 1
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
  // The runtime calibration the cluster's values carry (planner/calibration_choice.hpp): its
  // name, "" for the hardware values alone. JSON "calibration" (an extension of loom-plan/1;
  // absent: "").
  std::string calibration;
  // The measurements the prediction used (`loom plan --profile`), written as "profile" (an
  // extension of loom-plan/1); the cluster then already carries the fitted links.
  std::shared_ptr<const profiles::Profile> profile;
  // The points the prediction needed that the profile did not measure, with what each was
  // derived from (planner/coverage.hpp), written as "extrapolated" when the plan has a profile.
  std::vector<costmodel::Extrapolation> extrapolated;
};

// Megatron-LM's rank order: tp varies fastest, then dp, then pp; rank r on device r.
std::vector<RankPlacement> megatron_placement(const costmodel::Strategy& strategy,
                                              const profiles::Cluster& cluster);
// The same coordinates with rank r on device device_of_rank[r].
std::vector<RankPlacement> placement(const costmodel::Strategy& strategy,
                                     const profiles::Cluster& cluster,
                                     const std::vector<int>& device_of_rank);

nlohmann::json plan_to_json(const Plan& plan);
// The plan's "extrapolated" array (one {"what", "wanted", "how", "from"} object per point).
nlohmann::json extrapolated_to_json(const Plan& plan);

// Reads a loom-plan/1 document (as written by plan_to_json). Checks what a plan must satisfy to
// be run: the model and cluster are valid, the strategy fits the cluster and the job, the stages
// partition the layer sequence, every rank appears once with coordinates matching Megatron's
// order and a device of the cluster, and the plan's loom version is not newer than this one.
// `predicted`, `why`, `cost_model`, `profile` and `extrapolated` are read when present. Throws
// InputError naming `source` and the JSON path.
Plan plan_from_json(const nlohmann::json& value, const std::string& source);

// The rank-to-device mapping a plan records (device indices of its cluster, by rank).
std::vector<int> device_of_rank(const Plan& plan);

// The cost model a plan was predicted with: its model, cluster, options, mapping and profile.
costmodel::CostModel cost_model_of(const Plan& plan);

// Reads `--profile` files, checks each is for `model` at `precision`, and merges them.
profiles::Profile read_profiles(const std::vector<std::string>& paths,
                                const profiles::ModelSpec& model, profiles::Precision precision);

// The plan re-predicted with the measurements of `paths` (loom simulate / validate --profile):
// they are checked against the plan's model and precision, the cluster gets their fitted links
// and the plan carries them (cost_model_of() then uses them).
void apply_profiles(Plan* plan, const std::vector<std::string>& paths);

// A profile applied: the cluster with the profile's fitted links and the cost model over it with
// the profile's layer figures; `notes` (may be null) say what the profile changed.
costmodel::CostModel calibrated_cost_model(const profiles::ModelSpec& model,
                                           const profiles::Cluster& cluster,
                                           const std::shared_ptr<const profiles::Profile>& profile,
                                           std::vector<std::string>* notes);

// Evaluates exactly `strategy` with the analytical cost model (rank r on
// cost.device_of_rank()[r]); `why` is left for the caller. With no `stages`, Megatron's even
// partition. Throws InputError (source "strategy" or "stages") when the strategy or the partition
// cannot run the job.
Plan evaluate_strategy(const costmodel::CostModel& model, const costmodel::Job& job,
                       const costmodel::Strategy& strategy,
                       std::vector<costmodel::StageRange> stages = {});

}  // namespace loom::planner
