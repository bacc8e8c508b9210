// loom simulate: plays a plan's step on the event-driven simulator (docs/README.md).
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "costmodel/runtime.hpp"
#include "costmodel/simulator.hpp"
#include "costmodel/trace.hpp"
#include "planner/coverage.hpp"
#include "planner/plan.hpp"
#include "profiles/json_reader.hpp"
#include "profiles/loader.hpp"
#include "profiles/profile.hpp"
#include "profiles/units.hpp"
#include "tools/commands.hpp"

namespace loom::tools {

namespace {

struct SimulateArgs {
  std::string plan;
  std::string trace;
  std::vector<std::string> profile;
  std::optional<std::string> runtime;
  bool json = false;
};

int run_simulate(const SimulateArgs& a) {
  const auto start = std::chrono::steady_clock::now();
  planner::Plan plan = planner::plan_from_json(
      profiles::parse_json_text(profiles::read_text_file(a.plan), a.plan), a.plan);
  // Re-predict with these measurements: the plan's model, strategy and placement stay.
  if (!a.profile.empty()) planner::apply_profiles(&plan, a.profile);
  if (a.runtime) {
    plan.job.runtime = *costmodel::parse_runtime(*a.runtime);
    // The overlap of the tp exchanges is the new runtime's to run or not (its default).
    plan.job.tp_comm_overlap = costmodel::runtime_rules(plan.job.runtime).overlaps_tp_communication;
  }
  // The points the profile lacks (docs/simulate.md): said on stderr, and in --json.
  plan.extrapolated = planner::extrapolated_points(plan);
  print_extrapolated(std::cerr, plan);
  const costmodel::CostModel cost = planner::cost_model_of(plan);
  costmodel::SimulationOptions options;
  options.record_trace = !a.trace.empty();
  const costmodel::SimulationResult sim =
      costmodel::simulate(cost, plan.job, plan.strategy, plan.stages, options);
  const double elapsed_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!a.trace.empty()) {
    profiles::write_file_atomically(a.trace, costmodel::chrome_trace_json(sim));
  }
  if (a.json) {
    nlohmann::json doc = costmodel::prediction_to_json(sim.prediction);
    if (plan.profile) doc["extrapolated"] = planner::extrapolated_to_json(plan);
    std::cout << doc.dump(2) << "\n";
    return 0;
  }
  const costmodel::Prediction recorded = plan.predicted;
  plan.predicted = sim.prediction;
  PlanTextOptions text;
  text.simulation = &sim;
  print_plan(std::cout, plan, text);
  // In print_plan's unit of durations (the simulated step's).
  const profiles::Unit time = profiles::time_unit(sim.step_time_s);
  if (recorded.step_time_s > 0) {
    char change[32];
    std::snprintf(change, sizeof change, "%+.1f %%",
                  100 * (recorded.step_time_s / sim.step_time_s - 1));
    std::cout << "\nsimulated step " << profiles::unit_text(sim.step_time_s, time, 3)
              << "; the plan recorded " << profiles::unit_text(recorded.step_time_s, time, 3)
              << " (" << recorded.source << ", " << change << ")\n";
  }
  char line[128];
  std::snprintf(line, sizeof line, "%lld events in %.1f ms\n",
                static_cast<long long>(sim.events_processed), elapsed_s * 1e3);
  std::cout << line;
  if (!a.trace.empty()) std::cout << "trace written to " << a.trace << "\n";
  return 0;
}

}  // namespace

Runner add_simulate_command(CLI::App& app) {
  auto args = std::make_shared<SimulateArgs>();
  CLI::App* cmd = add_subcommand(app, "simulate");
  cmd->add_option("plan", args->plan, "PLAN.json (loom-plan/1)")->required();
  cmd->add_option("--trace", args->trace, "write a Chrome trace (open in Perfetto)");
  cmd->add_option("--profile", args->profile,
                  "measured loom-profile JSON (repeatable): predict with these measurements")
      ->allow_extra_args(false);
  cmd->add_option("--runtime", args->runtime,
                  "loom | megatron | deepspeed | fsdp | nemo: predict for this runtime instead of "
                  "the plan's job.runtime")
      ->check(CLI::IsMember(costmodel::runtime_names()));
  cmd->add_flag("--json", args->json, "print the plan's `predicted` object, simulated");
  return [args]() { return run_simulate(*args); };
}

}  // namespace loom::tools
