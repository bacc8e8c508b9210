// The `loom` subcommands. Each reads its inputs, calls one library function and writes its
// output; errors propagate as exceptions to main(), which turns them into one line and an exit
// code (2 for bad input, 1 for runtime failures).
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <ostream>

#include "planner/plan.hpp"

namespace loom::tools {

// Adds a subcommand to `app`; the returned function runs it after parsing and returns the exit
// code.
using Runner = std::function<int()>;
Runner add_plan_command(CLI::App& app);
Runner add_demo_command(CLI::App& app);
Runner add_train_command(CLI::App& app);
Runner add_simulate_command(CLI::App& app);
Runner add_report_command(CLI::App& app);
Runner add_launch_command(CLI::App& app);
Runner add_slurm_command(CLI::App& app);
Runner add_profile_command(CLI::App& app);
Runner add_validate_command(CLI::App& app);

// The human-readable summary of a plan: model, cluster, job, strategy, prediction, memory per
// stage and the reasons (`loom plan`, `loom simulate`).
void print_plan(std::ostream& out, const planner::Plan& plan);

}  // namespace loom::tools
