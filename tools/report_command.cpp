// loom report: a plan as one self-contained HTML page (docs/README.md), optionally with the Chrome
// trace of the same simulated step and the measured step time of a run.
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "costmodel/simulator.hpp"
#include "costmodel/trace.hpp"
#include "executor/metrics.hpp"
#include "planner/plan.hpp"
#include "planner/replan.hpp"
#include "planner/report.hpp"
#include "profiles/json_reader.hpp"
#include "profiles/loader.hpp"
#include "tools/commands.hpp"

namespace loom::tools {

namespace {

struct ReportArgs {
  std::string plan;
  std::string output;
  std::string trace;
  std::string metrics;
};

int run_report(const ReportArgs& a) {
  const planner::Plan plan = planner::plan_from_json(
      profiles::parse_json_text(profiles::read_text_file(a.plan), a.plan), a.plan);
  planner::ReportOptions options;
  if (!a.metrics.empty()) {
    options.measured = executor::summarize_metrics(profiles::read_text_file(a.metrics), a.metrics);
  }
  const costmodel::SimulationResult sim = planner::simulate_plan(plan);
  const std::vector<planner::Plan> alternatives =
      planner::alternatives_of(plan, 5, options.memory_margin);
  const std::string page = planner::render_report(plan, sim, alternatives, options);
  // The trace first: when the page exists, everything it was made with exists too.
  if (!a.trace.empty()) {
    profiles::write_file_atomically(a.trace, costmodel::chrome_trace_json(sim));
  }
  profiles::write_file_atomically(a.output, page);
  std::cout << "report written to " << a.output << "\n";
  if (!a.trace.empty()) std::cout << "trace written to " << a.trace << "\n";
  return 0;
}

}  // namespace

Runner add_report_command(CLI::App& app) {
  auto args = std::make_shared<ReportArgs>();
  CLI::App* cmd = add_subcommand(app, "report");
  cmd->add_option("plan", args->plan, "PLAN.json (loom-plan/1)")->required();
  cmd->add_option("-o", args->output, "write the HTML page here")->required();
  cmd->add_option("--trace", args->trace, "also write the simulated step as a Chrome trace");
  cmd->add_option("--metrics", args->metrics,
                  "metrics.jsonl of a run: adds predicted vs measured (median step time)");
  return [args]() { return run_report(*args); };
}

}  // namespace loom::tools
