#include "planner/replan.hpp"

#include <memory>

#include "costmodel/measured_profile.hpp"
#include "planner/search.hpp"

namespace loom::planner {

costmodel::SimulationResult simulate_plan(const Plan& plan,
                                          const costmodel::SimulationOptions& options) {
  return costmodel::simulate(cost_model_of(plan), plan.job, plan.strategy, plan.stages, options);
}

std::vector<Plan> alternatives_of(const Plan& plan, int top, double memory_margin) {
  costmodel::CostModel cost(plan.model, plan.cluster, plan.cost_options);
  if (plan.profile) {
    cost = cost.with_profile(
        std::make_shared<const costmodel::MeasuredProfile>(*plan.profile, plan.model));
  }
  SearchOptions options;
  options.top = top;
  options.memory_margin = memory_margin;
  return search(cost, plan.job, options).plans;
}

}  // namespace loom::planner
