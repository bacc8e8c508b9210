#include "planner/plan.hpp"

#include <nlohmann/json.hpp>

#include "profiles/errors.hpp"

#ifndef LOOM_VERSION
#define LOOM_VERSION "0.0.0"
#endif

namespace loom::planner {

const char* loom_version() { return LOOM_VERSION; }

std::vector<RankPlacement> megatron_placement(const costmodel::Strategy& s,
                                              const profiles::Cluster& cluster) {
  std::vector<RankPlacement> out;
  for (int rank = 0; rank < s.world_size(); ++rank) {
    RankPlacement p;
    p.rank = rank;
    p.device = profiles::device_name(cluster, rank);
    p.tp = rank % s.tp;
    p.dp = (rank / s.tp) % s.dp;
    p.pp = rank / (s.tp * s.dp);
    out.push_back(p);
  }
  return out;
}

nlohmann::json plan_to_json(const Plan& plan) {
  nlohmann::json j;
  j["format"] = "loom-plan/1";
  j["loom_version"] = plan.loom_version;
  j["model"] = profiles::model_to_json(plan.model);
  j["cluster"] = profiles::cluster_to_json(plan.cluster);
  j["job"] = costmodel::job_to_json(plan.job);
  j["strategy"] = costmodel::strategy_to_json(plan.strategy);
  nlohmann::json stages = nlohmann::json::array();
  for (std::size_t i = 0; i < plan.stages.size(); ++i) {
    stages.push_back({{"stage", i},
                      {"first_layer", plan.stages[i].first_layer},
                      {"last_layer", plan.stages[i].last_layer}});
  }
  j["stages"] = stages;
  nlohmann::json ranks = nlohmann::json::array();
  for (const RankPlacement& r : plan.ranks) {
    ranks.push_back(
        {{"rank", r.rank}, {"device", r.device}, {"dp", r.dp}, {"tp", r.tp}, {"pp", r.pp}});
  }
  j["ranks"] = ranks;
  j["predicted"] = costmodel::prediction_to_json(plan.predicted);
  j["why"] = plan.why;
  j["cost_model"] = costmodel::cost_options_to_json(plan.cost_options);
  return j;
}

Plan evaluate_strategy(const costmodel::CostModel& cost, const costmodel::Job& job,
                       const costmodel::Strategy& strategy) {
  if (auto why =
          costmodel::check_strategy(cost.model(), cost.cluster().device_count(), job, strategy)) {
    throw InputError("strategy", "", *why);
  }
  Plan plan;
  plan.loom_version = loom_version();
  plan.model = cost.model();
  plan.cluster = cost.cluster();
  plan.job = job;
  plan.strategy = strategy;
  plan.stages = costmodel::even_partition(cost.model(), strategy.pp * strategy.virtual_stages);
  plan.ranks = megatron_placement(strategy, cost.cluster());
  plan.predicted = cost.estimate(job, strategy, plan.stages);
  plan.cost_options = cost.options();
  return plan;
}

}  // namespace loom::planner
