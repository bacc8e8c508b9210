// A saved plan played again: the simulation of its step and the search that produced it, re-run
// from what the plan carries (model, cluster, job, strategy, stages, cost options, profile), for
// the commands that read a plan file (`loom report`, `loom validate`). Pure functions, no I/O.
#pragma once

#include <vector>

#include "costmodel/simulator.hpp"
#include "planner/plan.hpp"

namespace loom::planner {

// The plan played by the simulator: its model, cluster, job, strategy and stages with its cost
// options and its rank-to-device mapping (device_of_rank(plan)). Throws std::invalid_argument
// when the plan does not pass check_strategy() / check_partition().
costmodel::SimulationResult simulate_plan(const Plan& plan,
                                          const costmodel::SimulationOptions& options = {});

// The search re-run for the plan's model, cluster, job and cost options (calibrated with the
// plan's profile when it carries one) with nothing pinned: the best `top` plans that fit under
// `memory_margin`, fastest first (empty when none fits).
std::vector<Plan> alternatives_of(const Plan& plan, int top = 5, double memory_margin = 0.9);

}  // namespace loom::planner
