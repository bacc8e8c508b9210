// loom demo: the whole path on this machine with no arguments (docs/README.md): plan a small
// encoder for the local CPU, simulate the plan, train it on synthetic reviews, and print the
// prediction next to the measurement. It prints the `loom plan` and `loom launch` commands that do
// the same and trains by running exactly that launch (one process per rank, in a temporary folder),
// so the demo's figures are those commands' figures, the same on every run: ranks that were threads
// of one process would share LibTorch's default generator, and their dropout masks would depend
// on how the threads interleave.
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>

#include "costmodel/simulator.hpp"
#include "planner/plan.hpp"
#include "planner/search.hpp"
#include "profiles/errors.hpp"
#include "profiles/loader.hpp"
#include "profiles/units.hpp"
#include "tools/commands.hpp"

namespace loom::tools {

namespace {

// The demo's settings, shared by what it runs and the commands it prints as its equivalent.
constexpr std::int64_t kGlobalBatch = 16;
constexpr std::int64_t kSeqLen = 64;
constexpr std::int64_t kMicroBatch = 8;
constexpr std::int64_t kReviews = 1200;
constexpr double kValidationFraction = 0.2;
constexpr std::int64_t kSteps = 80;
constexpr double kLr = 1e-3;  // trained from scratch: the fine-tuning rate 2e-5 learns nothing here
constexpr std::int64_t kWarmupSteps = 4;
constexpr std::int64_t kEvalEvery = 40;

// `loom train`'s flags for the demo's run: its data, learning rate, warm-up and evaluation.
std::string train_flags() {
  char text[256];
  std::snprintf(text, sizeof text,
                "--data synthetic:%lld --validation-fraction %g --steps %lld --lr %g "
                "--warmup-steps %lld --eval-every %lld",
                static_cast<long long>(kReviews), kValidationFraction,
                static_cast<long long>(kSteps), kLr, static_cast<long long>(kWarmupSteps),
                static_cast<long long>(kEvalEvery));
  return text;
}

// `loom plan` and `loom launch ... loom train` with the flags that reproduce the demo: the plan
// over all the cluster's devices (--gpus, as the demo's search does), the same ranks, data,
// learning rate, warm-up and evaluation.
std::string equivalent_commands(const profiles::Cluster& cluster, const planner::Plan& plan) {
  char text[640];
  std::snprintf(text, sizeof text,
                "equivalent:\n"
                "  loom plan --model tiny-bert --cluster %s --gpus %lld --global-batch %lld "
                "--seq-len %lld --precision fp32 --micro-batch %lld -o plan.json\n"
                "  loom launch --nproc %d -- loom train plan.json %s\n",
                cluster.name.c_str(), static_cast<long long>(cluster.device_count()),
                static_cast<long long>(kGlobalBatch), static_cast<long long>(kSeqLen),
                static_cast<long long>(kMicroBatch), plan.strategy.world_size(),
                train_flags().c_str());
  return text;
}

// A shell word: `text` in single quotes.
std::string quoted(const std::string& text) {
  std::string out = "'";
  for (const char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// Runs the printed launch in a fresh temporary folder (removed at the end) and returns rank 0's
// `loom train --json` summary. std::runtime_error with the ranks' output when it fails.
nlohmann::json run_launch(const planner::Plan& plan) {
  namespace fs = std::filesystem;
  std::string pattern = (fs::temp_directory_path() / "loom-demo.XXXXXX").string();
  if (::mkdtemp(pattern.data()) == nullptr) {
    throw std::runtime_error("cannot create a temporary folder for the demo's run");
  }
  const fs::path dir = pattern;
  struct Remove {
    fs::path dir;
    ~Remove() {
      std::error_code error;
      fs::remove_all(dir, error);
    }
  } remove{dir};
  profiles::write_file_atomically((dir / "plan.json").string(),
                                  planner::plan_to_json(plan).dump(2));
  const std::string loom = (fs::path(self_executable()).parent_path() / "loom").string();
  const std::string command = "cd " + quoted(dir.string()) + " && " + quoted(loom) +
                              " launch --nproc " + std::to_string(plan.strategy.world_size()) +
                              " -- " + quoted(loom) + " train plan.json " + train_flags() +
                              " --json </dev/null >summary.txt 2>log.txt";
  const int status = std::system(command.c_str());
  auto text_of = [&](const char* name) {
    std::ifstream in(dir / name);
    std::ostringstream out;
    out << in.rdbuf();
    return out.str();
  };
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    throw std::runtime_error("the demo's training run failed: " + text_of("log.txt"));
  }
  // Each line of a rank's output is prefixed with "[rank k] " (loom launch); rank 0 prints the
  // summary.
  std::string json;
  std::istringstream lines(text_of("summary.txt"));
  for (std::string line; std::getline(lines, line);) {
    const std::string prefix = "[rank 0] ";
    if (line.rfind(prefix, 0) == 0) json += line.substr(prefix.size()) + "\n";
  }
  return nlohmann::json::parse(json);
}

int run_demo() {
  const profiles::Cluster cluster = profiles::load_cluster("local-cpu");
  const profiles::ModelSpec model =
      profiles::with_head(profiles::load_model("tiny-bert"), std::nullopt);
  const costmodel::Job job{kGlobalBatch, kSeqLen, profiles::Precision::kFp32, "adamw"};
  planner::SearchOptions o;
  o.micro_batch = kMicroBatch;
  o.fewer_cpu_ranks = false;  // the demo trains across the machine's ranks, as --gpus plans
  const planner::SearchResult found = planner::search(costmodel::CostModel(model, cluster), job, o);
  const planner::Plan& plan = found.plans.at(0);
  std::cout << "loom demo: tiny-bert fine-tuned on synthetic reviews on this machine's CPU\n"
            << equivalent_commands(cluster, plan) << "\n";
  print_plan(std::cout, plan);

  const std::int64_t held_out = std::llround(kValidationFraction * static_cast<double>(kReviews));
  std::cout << "\ntraining " << kSteps << " steps on " << plan.strategy.world_size() << " ranks, "
            << kReviews - held_out << " synthetic reviews (" << held_out << " held out)...\n"
            << std::flush;
  const nlohmann::json s = run_launch(plan);
  const double median_step_time_s = s.at("median_step_time_s").get<double>();
  const double peak_memory_bytes = s.at("peak_memory_bytes").get<double>();

  // In the units of the plan printed above.
  const profiles::Unit time = profiles::time_unit(plan.predicted.step_time_s);
  const profiles::Unit bytes = profiles::byte_unit(plan.predicted.peak_memory_bytes);
  char line[256];
  std::snprintf(line, sizeof line, "\n%-22s %14s %14s\n", "", "predicted", "measured");
  std::cout << line;
  std::snprintf(line, sizeof line, "%-22s %14s %14s  (%+.0f %%)\n", "step time",
                profiles::unit_text(plan.predicted.step_time_s, time, 3).c_str(),
                profiles::unit_text(median_step_time_s, time, 3).c_str(),
                100 * (plan.predicted.step_time_s / median_step_time_s - 1));
  std::cout << line;
  std::snprintf(line, sizeof line, "%-22s %14s %14s\n", "peak memory",
                profiles::unit_text(plan.predicted.peak_memory_bytes, bytes, 2).c_str(),
                profiles::unit_text(peak_memory_bytes, bytes, 2).c_str());
  std::cout << line;
  std::snprintf(line, sizeof line, "validation accuracy %.1f %%, loss %.4f after %lld steps\n",
                100 * s.value("validation_accuracy", 0.0), s.value("validation_loss", 0.0),
                static_cast<long long>(s.at("steps").get<std::int64_t>()));
  std::cout << line
            << "(the prediction uses the local-cpu datasheet rates: `loom profile` measures this "
               "machine and `loom validate PLAN.json --profile P` compares again; measured memory "
               "is rank 0's peak as loom train reports it)\n";
  return 0;
}

}  // namespace

Runner add_demo_command(CLI::App& app) {
  add_subcommand(app, "demo");
  return []() { return run_demo(); };
}

}  // namespace loom::tools
