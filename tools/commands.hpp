// The `loom` subcommands. Each reads its inputs, calls one library function and writes its
// output; errors propagate as exceptions to main(), which turns them into one line and an exit
// code (2 for bad input, 1 for runtime failures).
#pragma once

#include <CLI/CLI.hpp>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <ostream>
#include <stdexcept>
#include <string>
#include <string_view>

#include "planner/plan.hpp"

namespace loom::costmodel {
struct SimulationResult;
}  // namespace loom::costmodel

namespace loom::tools {

// One subcommand: its name, the line `loom --help` shows for it, and whether it computes with
// LibTorch (then it is built into loom-torch, the rest into loom; tools/cli.hpp).
struct CommandInfo {
  const char* name;
  const char* description;
  bool needs_torch;
};

// Every subcommand, in the order `loom --help` lists them.
inline constexpr std::array<CommandInfo, 13> kCommands{{
    {"plan", "Search parallel strategies; predict step time and memory of the best", false},
    {"demo", "Plan, simulate and train a small encoder on this machine", true},
    {"train", "Train as one rank of a plan", true},
    {"simulate", "Play a plan's step on the event-driven simulator", false},
    {"report", "Write a self-contained HTML report of a plan: timeline, memory, alternatives",
     false},
    {"launch", "Start N local ranks of a command: -- loom train PLAN.json ...", false},
    {"slurm", "Write an sbatch script that runs a plan with srun", false},
    {"profile", "Measure the model's layers on this device, or the links of a launched group",
     true},
    {"validate", "Run a plan for N steps here; print predicted vs measured step time and memory",
     false},
    {"calibrate", "Fit a runtime calibration (or a cluster's parameters) to measured runs",
     false},
    {"logits", "A classifier's logits for given token ids, from a Hugging Face checkpoint", true},
    {"export", "Write a Hugging Face model folder from a checkpoint of loom train", true},
    {"tune", "Run the best K plans here; write the measured fastest with both figures", false},
}};

// The kCommands entry named `name`; throws std::logic_error for another name.
inline const CommandInfo& command_info(std::string_view name) {
  for (const CommandInfo& c : kCommands) {
    if (name == c.name) return c;
  }
  throw std::logic_error("no subcommand " + std::string(name));
}

// Adds `name` (one of kCommands) to `app` with its description.
inline CLI::App* add_subcommand(CLI::App& app, std::string_view name) {
  return app.add_subcommand(std::string(name), command_info(name).description);
}

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
Runner add_calibrate_command(CLI::App& app);
Runner add_logits_command(CLI::App& app);
Runner add_export_command(CLI::App& app);
Runner add_tune_command(CLI::App& app);

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

// --dropout: a probability in [0, 1).
inline std::string check_probability(const std::string& text) {
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  const bool number = !text.empty() && end == text.c_str() + text.size() && std::isfinite(value);
  if (number && value >= 0 && value < 1) return "";
  return "expected a probability in [0, 1), found " + (number ? text : "\"" + text + "\"");
}
inline const CLI::Validator kProbability([](std::string& text) { return check_probability(text); },
                                         "", "PROBABILITY");

// --seed: an integer in [0, 2^64 - 1], written in decimal digits (CLI11 would wrap "-1").
inline std::string check_seed(const std::string& text) {
  const bool digits = !text.empty() && text.size() <= 20 &&
                      text.find_first_not_of("0123456789") == std::string::npos;
  if (digits && (text.size() < 20 || text <= "18446744073709551615")) return "";
  return "expected an integer from 0 to 18446744073709551615, found \"" + text + "\"";
}
inline const CLI::Validator kSeed([](std::string& text) { return check_seed(text); }, "", "SEED");

// An error message as the one line loom prints after "loom SUB: error: ": a LibTorch backtrace
// (from "\nException raised from") and trailing line breaks cut off, every other control
// character written as <U+00XX>, so that an input echoed in a message cannot break it over
// lines.
inline std::string one_line(std::string_view message) {
  const std::size_t backtrace = message.find("\nException raised from");
  if (backtrace != std::string_view::npos) message = message.substr(0, backtrace);
  while (!message.empty() && (message.back() == '\n' || message.back() == '\r')) {
    message.remove_suffix(1);
  }
  std::string out;
  for (const char c : message) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      char escaped[12];
      std::snprintf(escaped, sizeof escaped, "<U+%04X>", u);
      out += escaped;
    } else {
      out += c;
    }
  }
  return out;
}

// This binary's path (/proc/self/exe), or "loom" when it cannot be read: what `loom launch`,
// `loom slurm` and `loom validate` run.
std::string self_executable();

// The LibTorch threads of a CPU rank when no CPU cluster says otherwise: this machine's cores
// shared by the ranks `loom launch` started on it (LOCAL_WORLD_SIZE; 1 outside a launch), at
// least 1. What `loom train` runs a GPU cluster's plan with on CPUs, and what `loom profile`
// measures with by default.
int local_cpu_threads();

// What print_plan says beyond the plan itself.
struct PlanTextOptions {
  // Said after the job's precision when the command chose it ("the best the A100-SXM4-80GB runs;
  // --precision to choose"); empty when the user did.
  std::string precision_note;
  // The plan's step as the simulator played it, for the share of device time left idle; null:
  // print_plan plays it (and omits the figure for a step too large to play quickly).
  const costmodel::SimulationResult* simulation = nullptr;
};

// The human-readable summary of a plan: model, head, cluster, job, strategy, prediction, memory
// per stage and the reasons (`loom plan`, `loom simulate`, `loom demo`). Durations share one unit
// (the step time's), sizes another (the peak memory's); the pipeline schedule is named only when
// there is a pipeline.
void print_plan(std::ostream& out, const planner::Plan& plan, const PlanTextOptions& options = {});

// One line "extrapolated: WHAT WANTED: HOW from FROM" per point of plan.extrapolated (what
// `loom plan`, `simulate` and `validate` say on stderr when a profile lacks points).
void print_extrapolated(std::ostream& out, const planner::Plan& plan);

// A command's work folder: `keep` when given (kept afterwards), else a fresh folder
// `prefix`-PID under the system's temporary directory, removed when this goes out of scope.
class WorkFolder {
 public:
  WorkFolder(const std::string& keep, const std::string& prefix);
  WorkFolder(const WorkFolder&) = delete;
  WorkFolder& operator=(const WorkFolder&) = delete;
  ~WorkFolder();
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  bool keep_;
};

}  // namespace loom::tools
