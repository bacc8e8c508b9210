// The `loom` subcommands. Each reads its inputs, calls one library function and writes its
// output; errors propagate as exceptions to main(), which turns them into one line and an exit
// code (2 for bad input, 1 for runtime failures).
#pragma once

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <ostream>
#include <string>

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
Runner add_logits_command(CLI::App& app);

// Checks of numeric flags that say what a good value is ("--steps: expected a number > 0, found
// 0"). CLI11's PositiveNumber and NonNegativeNumber print their range instead, as "0.000000 to "
// followed by the 309 digits of the largest double.
inline std::string check_number(const std::string& text, bool zero_allowed) {
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  const bool number = !text.empty() && end == text.c_str() + text.size() && std::isfinite(value);
  if (number && (value > 0 || (zero_allowed && value == 0))) return "";
  return std::string("expected a number ") + (zero_allowed ? ">= 0" : "> 0") + ", found " +
         (number ? text : "\"" + text + "\"");
}
inline const CLI::Validator kPositiveNumber(
    [](std::string& text) { return check_number(text, false); }, "", "POSITIVE");
inline const CLI::Validator kNonNegativeNumber(
    [](std::string& text) { return check_number(text, true); }, "", "NONNEGATIVE");

// This binary's path (/proc/self/exe), or "loom" when it cannot be read: what `loom launch`,
// `loom slurm` and `loom validate` run.
std::string self_executable();

// The LibTorch threads of a CPU rank when no CPU cluster says otherwise: this machine's cores
// shared by the ranks `loom launch` started on it (LOCAL_WORLD_SIZE; 1 outside a launch), at
// least 1. What `loom train` runs a GPU cluster's plan with on CPUs, and what `loom profile`
// measures with by default.
int local_cpu_threads();

// The human-readable summary of a plan: model, cluster, job, strategy, prediction, memory per
// stage and the reasons (`loom plan`, `loom simulate`).
void print_plan(std::ostream& out, const planner::Plan& plan);

}  // namespace loom::tools
