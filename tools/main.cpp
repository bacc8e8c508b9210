// loom: plan, simulate and run parallel training of transformer models. See spec/cli.md.
#include <malloc.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdlib>
#include <iostream>
#include <map>
#include <string>

#include "profiles/errors.hpp"
#include "tools/commands.hpp"
#include "tools/stderr_filter.hpp"

// Training (loom train, loom demo) allocates the same activations, gradients and optimizer
// temporaries every step. By default glibc hands freed blocks above its mmap threshold (and a large
// free heap top) back to the kernel, so every step page-faults them in again: for bert-base (batch
// 8, seq 128) on one CPU thread about 280,000 faults and 0.5 s of kernel time in a 7.4 s step.
// Keeping freed memory in the heap removes them (the step 5-13 % faster in our runs) with the same
// peak resident set (bench/RESULTS.md). Skipped when the user tunes glibc's allocator with its
// MALLOC_* variables.
static void keep_freed_memory() {
  for (const char* name : {"MALLOC_MMAP_MAX_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_",
                           "MALLOC_TOP_PAD_"}) {
    if (std::getenv(name) != nullptr) return;
  }
  mallopt(M_MMAP_MAX, 0);         // every block from the heap, none mapped on its own
  mallopt(M_TRIM_THRESHOLD, -1);  // never shrink the heap
}

// LibTorch's CPU threads are OpenMP threads, which by default spin while they wait for each
// other. On a machine whose cores are shared (other processes, other ranks, a virtual machine's
// busy host) a spinning thread holds the core the thread it waits for needs, and steps get many
// times slower (measured: 0.59 s against 0.13 s per step of tiny-bert on 2 shared cores). For the
// commands that compute on the CPU, Loom therefore asks OpenMP to sleep while waiting, unless the
// user chose a policy or a single thread. OpenMP reads the variable when it is loaded, before
// main(): the process runs itself again with it set.
void prefer_passive_openmp_waits(int argc, char** argv) {
  if (argc < 2) return;
  const std::string sub = argv[1];
  if (sub != "train" && sub != "profile") return;
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr) {
    return;
  }
  const char* threads = std::getenv("OMP_NUM_THREADS");
  if (threads != nullptr && std::string(threads) == "1") return;
  ::setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
  ::execv("/proc/self/exe", argv);  // returns only on failure: go on as we are
}

int main(int argc, char** argv) {
  prefer_passive_openmp_waits(argc, argv);
  keep_freed_memory();  // process-wide, so it is set here, at the edge
  // A write past a file-size limit (ulimit -f) fails with EFBIG and is reported like a full disk,
  // instead of killing the process.
  std::signal(SIGXFSZ, SIG_IGN);
  // A rank whose peer died writes to a closed socket: that must be an error Gloo reports (and the
  // collective's failure names the lost rank), not a silent death by SIGPIPE.
  std::signal(SIGPIPE, SIG_IGN);
  // Newer Gloo writes an INFO line to std::cerr per connected group (tools/stderr_filter.hpp).
  const loom::tools::GlooInfoFilter gloo_info_filter(std::cerr);
  CLI::App app{"loom: plans, simulates and runs parallel training of transformer models", "loom"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "loom 0.1.0");
  std::map<std::string, loom::tools::Runner> runners;
  runners["plan"] = loom::tools::add_plan_command(app);
  runners["demo"] = loom::tools::add_demo_command(app);
  runners["train"] = loom::tools::add_train_command(app);
  runners["simulate"] = loom::tools::add_simulate_command(app);
  runners["report"] = loom::tools::add_report_command(app);
  runners["launch"] = loom::tools::add_launch_command(app);
  runners["slurm"] = loom::tools::add_slurm_command(app);
  runners["profile"] = loom::tools::add_profile_command(app);
  runners["validate"] = loom::tools::add_validate_command(app);
  runners["logits"] = loom::tools::add_logits_command(app);

  std::string sub = argc > 1 ? argv[1] : "";
  if (runners.count(sub) == 0) sub = "";
  auto prefix = [&]() { return sub.empty() ? std::string("loom") : "loom " + sub; };
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << (sub.empty() ? app.help() : app.get_subcommand(sub)->help());
    return 0;
  } catch (const CLI::CallForVersion&) {
    std::cout << "loom 0.1.0\n";
    return 0;
  } catch (const CLI::ParseError& e) {
    if (sub.empty() && argc > 1 && argv[1][0] != '-') {
      // CLI11 says only "A subcommand is required": name the word it did not know.
      std::string known;
      for (const auto& [name, runner] : runners) known += (known.empty() ? "" : ", ") + name;
      std::cerr << "loom: error: \"" << argv[1] << "\" is not a subcommand: expected one of "
                << known << " (see loom --help)\n";
      return 2;
    }
    std::cerr << prefix() << ": error: " << loom::tools::one_line(e.what()) << " (see " << prefix()
              << " --help)\n";
    return 2;
  }
  for (CLI::App* s : app.get_subcommands()) sub = s->get_name();
  try {
    return runners.at(sub)();
  } catch (const loom::InputError& e) {
    std::cerr << prefix() << ": error: " << loom::tools::one_line(e.what()) << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << prefix() << ": error: " << loom::tools::one_line(e.what()) << "\n";
    return 1;
  }
}
