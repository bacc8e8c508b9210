// loom tune: plans as `loom plan` does, runs the top K plans here through `loom validate` (child
// processes of this binary), re-ranks them by measured step time and writes the measured best as
// the plan, with the regret the prediction alone would have had (lab/tune.hpp, docs/tune.md).
//
// Planning loads no LibTorch: each measurement is `loom validate`, which runs `loom train` (in
// loom-torch) for the plan's ranks.
#include <fcntl.h>
#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "lab/tune.hpp"
#include "planner/validate_record.hpp"
#include "profiles/errors.hpp"
#include "profiles/json_reader.hpp"
#include "profiles/loader.hpp"
#include "tools/commands.hpp"
#include "tools/plan_args.hpp"

namespace loom::tools {

namespace {

namespace fs = std::filesystem;

struct TuneArgs {
  PlanArgs plan;
  std::int64_t steps = 10;  // loom validate's default
  std::optional<std::int64_t> warmup;
  std::string resume;
  std::string keep;
};

// Runs `argv` with stdout to `out` and stderr to `err`; returns the wait status.
int run_child(const std::vector<std::string>& argv_text, const fs::path& out, const fs::path& err) {
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error(std::string("fork failed: ") + std::strerror(errno));
  if (pid == 0) {
    const int out_fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int err_fd = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (out_fd < 0 || err_fd < 0 || ::dup2(out_fd, STDOUT_FILENO) < 0 ||
        ::dup2(err_fd, STDERR_FILENO) < 0) {
      ::_exit(127);
    }
    std::vector<std::string> copy = argv_text;
    std::vector<char*> argv;
    argv.reserve(copy.size() + 1);
    for (std::string& s : copy) argv.push_back(s.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}

// The last non-empty line of `path` without loom validate's prefix: why a run failed.
std::string failure_line(const fs::path& path, int status) {
  std::ifstream in(path);
  std::string last;
  for (std::string line; std::getline(in, line);) {
    if (line.find_first_not_of(" \t\r") != std::string::npos) last = line;
  }
  const std::string prefix = "loom validate: error: ";
  if (last.rfind(prefix, 0) == 0) last = last.substr(prefix.size());
  if (!last.empty()) return one_line(last);
  if (WIFSIGNALED(status)) return "killed by signal " + std::to_string(WTERMSIG(status));
  return "loom validate exited with status " + std::to_string(WEXITSTATUS(status));
}

// Runs `loom validate` on candidate `rank`'s plan (written to dir) and reads its JSON.
tune::TuneMeasurement measure(const planner::Plan& plan, int rank, const tune::TuneSteps& steps,
                              const fs::path& dir) {
  const std::string name = "candidate-" + std::to_string(rank);
  const fs::path plan_path = dir / (name + ".json");
  profiles::write_file_atomically(plan_path.string(), planner::plan_to_json(plan).dump(2) + "\n");
  const std::vector<std::string> argv = {self_executable(),
                                         "validate",
                                         plan_path.string(),
                                         "--steps",
                                         std::to_string(steps.steps),
                                         "--warmup",
                                         std::to_string(steps.warmup_steps),
                                         "--json"};
  const fs::path out = dir / (name + ".validate.json");
  const fs::path err = dir / (name + ".validate.log");
  const int status = run_child(argv, out, err);
  tune::TuneMeasurement m;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    m.failure = failure_line(err, status);
    return m;
  }
  try {
    const nlohmann::json doc =
        profiles::parse_json_text(profiles::read_text_file(out.string()), out.string());
    const planner::MeasuredRun measured = planner::measured_run_from_json(doc, out.string());
    m.step_time_s = measured.step_time_s;
    if (measured.peak_memory_bytes > 0) m.peak_memory_bytes = measured.peak_memory_bytes;
  } catch (const std::exception& e) {
    m.step_time_s.reset();
    m.failure = "unreadable output of loom validate: " + one_line(e.what());
  }
  return m;
}

// The strategy in a table cell: "dp=2 tp=1 pp=1 zero=0 mb=8x2 none", the schedule and the other
// dimensions only when they matter.
std::string strategy_cell(const costmodel::Strategy& s) {
  std::string out = "dp=" + std::to_string(s.dp) + " tp=" + std::to_string(s.tp) +
                    " pp=" + std::to_string(s.pp) + " zero=" + std::to_string(s.zero) +
                    " mb=" + std::to_string(s.micro_batch) + "x" +
                    std::to_string(s.num_micro_batches);
  if (s.pp > 1) out += std::string(" ") + costmodel::to_string(s.schedule);
  if (s.virtual_stages > 1) out += " v=" + std::to_string(s.virtual_stages);
  out += " " + costmodel::recompute_cell(s);
  if (s.sequence_parallel) out += " sp";
  if (s.attention == costmodel::Attention::kFlash) out += " flash";
  return out;
}

std::string percent(double fraction) {
  char text[32];
  std::snprintf(text, sizeof text, "%+.1f %%", 100 * fraction);
  return text;
}

void print_result(std::ostream& out, const tune::TuneResult& result, const tune::TuneSteps& steps) {
  char line[512];
  std::snprintf(line, sizeof line, "%-9s %-9s %-44s %11s %11s %9s\n", "measured", "predicted",
                "strategy", "predicted", "measured", "error");
  out << line;
  // Measured order first, then the failures in predicted order.
  std::vector<const tune::TuneCandidate*> order;
  for (const tune::TuneCandidate& c : result.candidates) order.push_back(&c);
  std::stable_sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
    const int ra = a->measured_rank.value_or(1 << 30);
    const int rb = b->measured_rank.value_or(1 << 30);
    return ra < rb;
  });
  for (const tune::TuneCandidate* c : order) {
    const std::string rank = c->measured_rank ? std::to_string(*c->measured_rank) : "-";
    char predicted[32];
    std::snprintf(predicted, sizeof predicted, "%.4f s", c->plan.predicted.step_time_s);
    if (c->measurement.step_time_s) {
      char measured[32];
      std::snprintf(measured, sizeof measured, "%.4f s", *c->measurement.step_time_s);
      std::snprintf(line, sizeof line, "%-9s %-9d %-44s %11s %11s %9s%s\n", rank.c_str(),
                    c->predicted_rank, strategy_cell(c->plan.strategy).c_str(), predicted, measured,
                    percent(*c->relative_error()).c_str(), c->resumed ? "  (from --resume)" : "");
    } else {
      std::snprintf(line, sizeof line, "%-9s %-9d %-44s %11s  failed: %s\n", rank.c_str(),
                    c->predicted_rank, strategy_cell(c->plan.strategy).c_str(), predicted,
                    c->measurement.failure.c_str());
    }
    out << line;
  }
  std::snprintf(line, sizeof line,
                "(each the median of steps %lld-%lld; error = (predicted - "
                "measured) / measured)\n",
                static_cast<long long>(steps.warmup_steps) + 1,
                static_cast<long long>(steps.steps));
  out << line;
  const tune::TuneCandidate& best = result.candidates.at(result.best);
  const tune::TuneCandidate& first = result.candidates.front();
  if (result.regret) {
    std::snprintf(line, sizeof line,
                  "regret of the predicted-first plan: %.1f %% (it measured %.4f s, the best "
                  "%.4f s)\n",
                  100 * *result.regret, *first.measurement.step_time_s,
                  *best.measurement.step_time_s);
    out << line;
  } else {
    out << "regret of the predicted-first plan: - (it failed to run: " << first.measurement.failure
        << ")\n";
  }
  out << "measured best: predicted #" << best.predicted_rank << ", "
      << strategy_cell(best.plan.strategy) << "\n";
}

int run_tune(const TuneArgs& a) {
  tune::TuneSteps steps;
  steps.steps = a.steps;
  steps.warmup_steps = a.warmup.value_or(std::min<std::int64_t>(2, a.steps - 1));
  if (steps.warmup_steps >= steps.steps) {
    throw InputError("--warmup", "",
                     "fewer warm-up steps than --steps (" + std::to_string(a.steps) + ")");
  }
  // The candidates run on Loom's executor, which steps with its fused AdamW.
  if (a.plan.optimizer_kernels && *a.plan.optimizer_kernels != "fused") {
    throw InputError("--optimizer-kernels", "",
                     "loom tune measures Loom's executor, which steps with its fused AdamW: "
                     "fused or none, found " +
                         *a.plan.optimizer_kernels);
  }
  if (a.plan.optimizer_dtype && *a.plan.optimizer_dtype != "fp32") {
    throw InputError("--optimizer-dtype", "",
                     "loom tune measures Loom's executor, whose AdamW keeps fp32 states: fp32 or "
                     "none, found " +
                         *a.plan.optimizer_dtype);
  }
  const PlanSearch search = search_plans(a.plan);
  const std::vector<planner::Plan>& plans = search.result.plans;
  // The points the profile lacks, as loom plan says them: the candidates' measurements settle
  // the ranking, but the first plan's prediction is the one the regret judges.
  print_extrapolated(std::cerr, plans.front());
  const std::string setting = tune::tune_setting(plans.front(), steps);
  tune::TuneLog log;
  log.setting = setting;
  if (!a.resume.empty() && fs::exists(a.resume)) {
    log = tune::tune_log_from_json(
        profiles::parse_json_text(profiles::read_text_file(a.resume), a.resume), a.resume);
    tune::check_tune_setting(log, setting, a.resume);
  }

  const WorkFolder work(a.keep, "loom-tune");
  const fs::path& dir = work.path();

  const std::size_t count = plans.size();
  auto measure_one = [&](const planner::Plan& plan, int rank) {
    std::cerr << "measuring #" << rank << " of " << count << ": " << strategy_cell(plan.strategy)
              << " (" << plan.strategy.world_size() << " rank(s), " << steps.steps
              << " steps)...\n";
    tune::TuneMeasurement m = measure(plan, rank, steps, dir);
    if (!m.step_time_s) std::cerr << "  failed: " << m.failure << "\n";
    return m;
  };
  auto save = [&](const tune::TuneLog& so_far) {
    if (a.resume.empty()) return;
    profiles::write_file_atomically(a.resume, tune::tune_log_to_json(so_far).dump(2) + "\n");
  };
  const tune::TuneResult result = tune::tune(plans, &log, measure_one, save);
  if (!a.plan.output.empty()) {
    profiles::write_file_atomically(a.plan.output,
                                    tune::tuned_plan_json(result, steps).dump(2) + "\n");
  }
  const planner::Plan& first = plans.front();
  std::cout << "model    " << first.model.name << ", global batch " << first.job.global_batch
            << ", seq " << first.job.seq_len << ", " << first.cluster.name << " ("
            << first.cluster.device_count() << " devices)\n"
            << "tuned    the top " << count << " of the prediction, measured here\n\n";
  print_result(std::cout, result, steps);
  if (!a.plan.output.empty()) std::cout << "wrote " << a.plan.output << "\n";
  return 0;
}

}  // namespace

Runner add_tune_command(CLI::App& app) {
  auto args = std::make_shared<TuneArgs>();
  args->plan.top = 3;
  CLI::App* cmd = add_subcommand(app, "tune");
  add_plan_options(cmd, &args->plan);
  cmd->add_option("--top", args->plan.top, "plans to measure: the prediction's best K (default 3)")
      ->check(kPositiveNumber);
  cmd->add_option("--steps", args->steps, "steps each plan runs (default 10, as loom validate)")
      ->check(kPositiveNumber);
  cmd->add_option("--warmup", args->warmup,
                  "first steps left out of each median (default 2, at most --steps - 1)")
      ->check(kNonNegativeNumber);
  cmd->add_option("--resume", args->resume,
                  "measurements so far (loom-tune/1): read when it exists, rewritten after each "
                  "measurement; measured candidates are not run again");
  cmd->add_option("--keep", args->keep,
                  "keep the candidates' plans and loom validate's output in this folder");
  cmd->add_option("-o", args->plan.output,
                  "write the measured best plan (loom-plan/1 with a \"tuned\" record) here");
  return [args]() { return run_tune(*args); };
}

}  // namespace loom::tools
