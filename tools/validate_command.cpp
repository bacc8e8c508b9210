// loom validate: runs a plan for N steps on this machine and prints the measured step time and
// peak memory next to the prediction, with the relative error (docs/README.md).
//
// The run is `loom train` in child processes (through `loom launch` when the plan has several
// ranks), each rank writing its own metrics; the step time is the median over the steps after the
// warm-up (the largest over ranks), the peak memory the largest rank's. The prediction is the
// simulator's for the plan, calibrated with --profile when given (else with the profile the plan
// carries, else the roofline).
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "costmodel/measured_profile.hpp"
#include "costmodel/runtime.hpp"
#include "costmodel/simulator.hpp"
#include "executor/dataset.hpp"
#include "executor/metrics.hpp"
#include "planner/coverage.hpp"
#include "planner/plan.hpp"
#include "planner/replan.hpp"
#include "planner/report.hpp"
#include "planner/validate_record.hpp"
#include "profiles/errors.hpp"
#include "profiles/json_reader.hpp"
#include "profiles/loader.hpp"
#include "profiles/profile.hpp"
#include "tools/commands.hpp"
#include "tools/ports.hpp"

namespace loom::tools {

WorkFolder::WorkFolder(const std::string& keep, const std::string& prefix)
    : path_(keep.empty() ? std::filesystem::temp_directory_path() /
                               (prefix + "-" + std::to_string(::getpid()))
                         : std::filesystem::path(keep)),
      keep_(!keep.empty()) {
  std::filesystem::create_directories(path_);
}

WorkFolder::~WorkFolder() {
  std::error_code ec;
  if (!keep_) std::filesystem::remove_all(path_, ec);
}

namespace {

namespace fs = std::filesystem;

struct ValidateArgs {
  std::string plan;
  std::int64_t steps = 10;
  std::int64_t warmup = 2;
  std::vector<std::string> profile;
  bool json = false;
  std::string data = "synthetic:2000";
  std::string tokenizer;
  std::string init;
  std::uint64_t seed = 42;
  std::string device;  // "" = the plan's (loom train's default)
  double comm_timeout_s = 300;
  std::string keep;  // folder to keep the run's logs and metrics in
};

// Runs `argv` with stdout and stderr to `log`; returns the exit status.
int run_logged(const std::vector<std::string>& argv_text, const fs::path& log) {
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error(std::string("fork failed: ") + std::strerror(errno));
  if (pid == 0) {
    FILE* out = std::freopen(log.c_str(), "w", stdout);
    if (out == nullptr || dup2(fileno(stdout), STDERR_FILENO) < 0) _exit(127);
    std::vector<std::string> copy = argv_text;
    std::vector<char*> argv;
    argv.reserve(copy.size() + 1);
    for (std::string& s : copy) argv.push_back(s.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}

std::string tail_of(const fs::path& path, std::size_t lines) {
  std::ifstream in(path);
  std::vector<std::string> all;
  for (std::string line; std::getline(in, line);) all.push_back(line);
  std::string out;
  for (std::size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i) {
    out += all[i] + "\n";
  }
  return out;
}

// The simulator's phases of global rank `rank` (its pipeline stage's representative), keyed as
// metrics.jsonl's phases_s.
nlohmann::json predicted_phases(const costmodel::SimulationResult& simulation, int rank) {
  nlohmann::json phases = nlohmann::json::object();
  const costmodel::RankTimeline& t = simulation.timeline_of(rank);
  for (int p = 0; p < costmodel::kPhaseCount; ++p) {
    phases[costmodel::to_string(static_cast<costmodel::Phase>(p))] =
        t.phases_s[static_cast<std::size_t>(p)];
  }
  return phases;
}

// The largest rank's predicted bytes of one kind: MemoryBreakdown::tensor_bytes is what the
// caching allocator's peak measures; MemoryBreakdown::total adds the process lines (CUDA context,
// workspaces, NCCL, fragmentation), which the device's used memory (cudaMemGetInfo) shows on a GPU
// and the allocator does not; on CPUs there are none.
double largest_stage_bytes(const costmodel::Prediction& p,
                           double (costmodel::MemoryBreakdown::*bytes)() const) {
  double out = 0;
  for (const costmodel::MemoryBreakdown& m : p.memory_by_stage) out = std::max(out, (m.*bytes)());
  return p.memory_by_stage.empty() ? p.peak_memory_bytes : out;
}

double relative_error(double predicted, double measured) {
  return measured > 0 ? (predicted - measured) / measured : 0;
}

// Runs `plan` for a.steps steps with loom train (through loom launch for several ranks), each
// rank writing dir/metrics.RANK.jsonl; the run's log goes to dir/train.log. A failed run throws its
// last error line (an InputError when the run blamed its input).
void run_training(const ValidateArgs& a, const planner::Plan& plan, const fs::path& dir) {
  const int world = plan.strategy.world_size();
  const fs::path plan_copy = dir / "plan.json";
  profiles::write_file_atomically(plan_copy.string(), planner::plan_to_json(plan).dump(2) + "\n");
  const std::string self = self_executable();
  std::vector<std::string> argv;
  if (world > 1) {
    argv = {self,
            "launch",
            "--nproc",
            std::to_string(world),
            "--master-port",
            std::to_string(free_port()),
            "--",
            "loom"};
  } else {
    argv = {self};
  }
  const std::vector<std::string> train = {
      "train",          plan_copy.string(),
      "--steps",        std::to_string(a.steps),
      "--data",         a.data,
      "--seed",         std::to_string(a.seed),
      "--comm-timeout", std::to_string(a.comm_timeout_s),
      "--metrics",      (dir / "metrics.{rank}.jsonl").string()};
  argv.insert(argv.end(), train.begin(), train.end());
  if (!a.device.empty()) argv.insert(argv.end(), {"--device", a.device});
  if (!a.tokenizer.empty()) argv.insert(argv.end(), {"--tokenizer", a.tokenizer});
  if (!a.init.empty()) argv.insert(argv.end(), {"--init", a.init});
  const fs::path log = dir / "train.log";
  executor::check_data_spec(a.data);  // before the progress line: one line for a bad --data
  if (!a.json) {
    std::cerr << "running " << world << " rank(s) for " << a.steps << " steps...\n";
  }
  const int status = run_logged(argv, log);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
    std::string last = tail_of(log, 1);
    if (!last.empty() && last.back() == '\n') last.pop_back();
    for (const char* prefix : {"loom train: error: ", "loom launch: error: "}) {
      const auto at = last.find(prefix);
      if (at != std::string::npos) last = last.substr(at + std::strlen(prefix));
    }
    // The run's own error names the input at fault (a flag, the data, the plan): kept as it is.
    if (code == 2) {
      const auto colon = last.find(": ");
      if (colon == std::string::npos) throw InputError(a.plan, "", last);
      throw InputError(last.substr(0, colon), "", last.substr(colon + 2));
    }
    throw std::runtime_error("the run failed: " + last);
  }
}

int run_validate(const ValidateArgs& a) {
  planner::Plan plan = planner::plan_from_json(
      profiles::parse_json_text(profiles::read_text_file(a.plan), a.plan), a.plan);
  if (a.warmup >= a.steps) {
    throw InputError("--warmup", "",
                     "fewer warm-up steps than --steps (" + std::to_string(a.steps) + ")");
  }
  if (!a.profile.empty()) planner::apply_profiles(&plan, a.profile);
  // The run is Loom's executor, so the prediction it is compared with is runtime loom's.
  const costmodel::Runtime planned_runtime = plan.job.runtime;
  const costmodel::OptimizerKernels planned_kernels = plan.job.optimizer_kernels;
  plan.job = costmodel::executor_job(plan.job);
  // The points the profile lacks (docs/validate.md): said on stderr, and in --json.
  plan.extrapolated = planner::extrapolated_points(plan);
  print_extrapolated(std::cerr, plan);
  const costmodel::SimulationResult simulation = planner::simulate_plan(plan);
  const costmodel::Prediction& predicted = simulation.prediction;

  // The run, in a temporary folder (or --keep).
  const int world = plan.strategy.world_size();
  const WorkFolder work(a.keep, "loom-validate");
  const fs::path& dir = work.path();
  run_training(a, plan, dir);

  // Per rank: the median step time after the warm-up and the peak memory.
  planner::MeasuredRun run;
  run.steps = a.steps;
  run.warmup_steps = a.warmup;
  nlohmann::json predicted_ranks = nlohmann::json::array();
  for (int r = 0; r < world; ++r) {
    predicted_ranks.push_back({{"rank", r}, {"phases_s", predicted_phases(simulation, r)}});
    const fs::path metrics = dir / ("metrics." + std::to_string(r) + ".jsonl");
    const planner::MeasuredSteps m = executor::summarize_metrics(
        profiles::read_text_file(metrics.string()), metrics.string(), a.warmup);
    run.step_time_s = std::max(run.step_time_s, m.median_step_time_s);
    run.peak_memory_bytes = std::max(run.peak_memory_bytes, m.peak_memory_bytes.value_or(0));
    if (m.device_used_bytes) {
      run.device_used_bytes = std::max(run.device_used_bytes.value_or(0), *m.device_used_bytes);
    }
    run.ranks.push_back(
        {r, m.median_step_time_s, m.peak_memory_bytes.value_or(0), m.median_phases_s});
  }
  const double step_time_s = run.step_time_s;
  const double peak_bytes = run.peak_memory_bytes;
  const std::optional<double> device_bytes = run.device_used_bytes;
  const double time_error = relative_error(predicted.step_time_s, step_time_s);
  // The allocator's peak holds tensors only: the process lines (CUDA context, NCCL buffers) are
  // what the device's used memory adds, which loom train records on CUDA (device_used_bytes).
  const double predicted_peak_bytes =
      largest_stage_bytes(predicted, &costmodel::MemoryBreakdown::tensor_bytes);
  const double memory_error = relative_error(predicted_peak_bytes, peak_bytes);
  const double predicted_total_bytes =
      largest_stage_bytes(predicted, &costmodel::MemoryBreakdown::total);
  if (a.json) {
    nlohmann::json doc;
    doc["predicted"] = costmodel::prediction_to_json(predicted);
    doc["predicted"]["ranks"] = predicted_ranks;
    doc["measured"] = planner::measured_run_to_json(run);
    doc["relative_error"] = {{"step_time", time_error}, {"peak_memory", memory_error}};
    if (device_bytes) {
      doc["predicted"]["device_used_bytes"] = std::llround(predicted_total_bytes);
      doc["relative_error"]["device_memory"] = relative_error(predicted_total_bytes, *device_bytes);
    }
    doc["calibration"] = plan.profile ? "profile" : "roofline";
    if (plan.profile) doc["extrapolated"] = planner::extrapolated_to_json(plan);
    doc["plan"] = planner::plan_to_json(plan);  // what `loom calibrate` predicts the run with
    std::cout << doc.dump(2) << "\n";
    return 0;
  }
  const costmodel::Strategy& s = plan.strategy;
  std::cout << "plan: " << costmodel::describe(s) << ", " << plan.model.name << ", "
            << (plan.profile ? "calibrated with a measured profile" : "roofline (no --profile)")
            << "\n";
  if (planned_runtime != costmodel::Runtime::kLoom) {
    std::cout << "(the plan predicts runtime " << costmodel::to_string(planned_runtime)
              << "; this run is Loom's executor, compared with runtime loom's prediction)\n";
  }
  if (planned_kernels != costmodel::OptimizerKernels::kFused) {
    std::cout << "(the plan's AdamW is " << costmodel::to_string(planned_kernels)
              << "; Loom's executor steps with its fused kernel, and so does the prediction)\n";
  }
  char line[256];
  std::snprintf(line, sizeof line, "%-18s %14s %14s %10s\n", "", "predicted", "measured", "error");
  std::cout << line;
  std::snprintf(line, sizeof line, "%-18s %12.4f s %12.4f s %+9.1f %%\n", "step time",
                predicted.step_time_s, step_time_s, 100 * time_error);
  std::cout << line;
  std::snprintf(line, sizeof line, "%-18s %10.1f MiB %10.1f MiB %+9.1f %%\n", "peak memory",
                predicted_peak_bytes / (1 << 20), peak_bytes / (1 << 20), 100 * memory_error);
  std::cout << line;
  if (device_bytes) {
    std::snprintf(line, sizeof line, "%-18s %10.1f MiB %10.1f MiB %+9.1f %%\n", "device memory",
                  predicted_total_bytes / (1 << 20), *device_bytes / (1 << 20),
                  100 * relative_error(predicted_total_bytes, *device_bytes));
    std::cout << line;
  }
  for (const planner::RankRun& r : run.ranks) {
    std::snprintf(line, sizeof line, "  rank %-3d %21.4f s %10.1f MiB\n", r.rank, r.step_time_s,
                  r.peak_memory_bytes / (1 << 20));
    std::cout << line;
    // Where the rank's step went, predicted (the simulator's phases) and measured (loom train's
    // phases_s, medians), in ms.
    const auto& measured_phases = r.phases_s;
    if (measured_phases.empty()) continue;
    const nlohmann::json& predicted_phases_s =
        predicted_ranks[static_cast<std::size_t>(r.rank)]["phases_s"];
    std::string head = "    ms       ";
    std::string ahead = "    predicted";
    std::string seen = "    measured ";
    for (const auto& [name, seconds] : measured_phases) {
      std::string label = name == "pipeline_wait" ? "pipe wait" : name;
      std::snprintf(line, sizeof line, " %9s", label.c_str());
      head += line;
      std::snprintf(line, sizeof line, " %9.1f", predicted_phases_s.value(name, 0.0) * 1e3);
      ahead += line;
      std::snprintf(line, sizeof line, " %9.1f", seconds * 1e3);
      seen += line;
    }
    std::cout << head << "\n" << ahead << "\n" << seen << "\n";
  }
  std::snprintf(line, sizeof line, "(median of steps %lld-%lld)\n",
                static_cast<long long>(a.warmup) + 1, static_cast<long long>(a.steps));
  std::cout << line;
  return 0;
}

}  // namespace

Runner add_validate_command(CLI::App& app) {
  auto args = std::make_shared<ValidateArgs>();
  CLI::App* cmd = add_subcommand(app, "validate");
  cmd->add_option("plan", args->plan, "PLAN.json (loom-plan/1)")->required();
  cmd->add_option("--steps", args->steps, "steps to run (default 10)")->check(kPositiveNumber);
  cmd->add_option("--warmup", args->warmup, "first steps left out of the median (default 2)")
      ->check(kNonNegativeNumber);
  cmd->add_option("--profile", args->profile,
                  "measured loom-profile JSON (repeatable): predict with these measurements")
      ->allow_extra_args(false);
  cmd->add_option("--data", args->data,
                  "aclImdb/ folder, IMDB CSV or synthetic[:N] (default synthetic:2000)");
  cmd->add_option("--tokenizer", args->tokenizer,
                  "vocab.txt, tokenizer.json, or a folder holding vocab.txt, vocab.json + "
                  "merges.txt or tokenizer.json");
  cmd->add_option("--init", args->init, "Hugging Face checkpoint folder");
  cmd->add_option("--seed", args->seed, "seed of initialisation, data order and dropout")
      ->check(kSeed);
  cmd->add_option("--device", args->device,
                  "cpu | cuda (default: the plan's: cuda for a GPU cluster, cpu for a CPU one)");
  cmd->add_option("--comm-timeout", args->comm_timeout_s,
                  "seconds any collective may wait for a peer (default 300)")
      ->check(kPositiveNumber);
  cmd->add_option("--keep", args->keep, "keep the run's plan, logs and metrics in this folder");
  cmd->add_flag("--json", args->json, "print one JSON document");
  return [args]() { return run_validate(*args); };
}

}  // namespace loom::tools
