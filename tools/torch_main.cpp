// loom-torch: the half of `loom` that computes with LibTorch (train, profile, logits, demo,
// export). `loom` runs it with execv and the same argv (tools/cli.hpp); run directly it behaves as
// `loom` does.
#include <malloc.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <iostream>
#include <map>
#include <string>

#include "tools/cli.hpp"
#include "tools/commands.hpp"
#include "tools/stderr_filter.hpp"

namespace {

// Training (loom train, loom demo) allocates the same activations, gradients and optimizer
// temporaries every step. By default glibc hands freed blocks above its mmap threshold (and a large
// free heap top) back to the kernel, so every step page-faults them in again: for bert-base (batch
// 8, seq 128) on one CPU thread about 280,000 faults and 0.5 s of kernel time in a 7.4 s step.
// Keeping freed memory in the heap removes them (the step 5-13 % faster in our runs) with the same
// peak resident set (bench/RESULTS.md). Skipped when the user tunes glibc's allocator with its
// MALLOC_* variables.
void keep_freed_memory() {
  for (const char* name : {"MALLOC_MMAP_MAX_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_",
                           "MALLOC_TOP_PAD_"}) {
    if (std::getenv(name) != nullptr) return;
  }
  mallopt(M_MMAP_MAX, 0);         // every block from the heap, none mapped on its own
  mallopt(M_TRIM_THRESHOLD, -1);  // never shrink the heap
}

}  // namespace

int main(int argc, char** argv) {
  // `loom` sets the OpenMP wait policy before it runs this binary; run directly, the process runs
  // itself again with it set, since OpenMP has read the environment before main().
  if (loom::tools::prefer_passive_openmp_waits(argc, argv)) {
    ::execv("/proc/self/exe", argv);  // returns only on failure: go on as we are
  }
  keep_freed_memory();            // process-wide, so it is set here, at the edge
  std::signal(SIGXFSZ, SIG_IGN);  // as in tools/main.cpp, for a direct start
  std::signal(SIGPIPE, SIG_IGN);
  // Newer Gloo writes an INFO line to std::cerr per connected group (tools/stderr_filter.hpp).
  const loom::tools::GlooInfoFilter gloo_info_filter(std::cerr);
  using loom::tools::CommandAdder;
  const std::map<std::string, CommandAdder> commands = {
      {"train", loom::tools::add_train_command},   {"profile", loom::tools::add_profile_command},
      {"logits", loom::tools::add_logits_command}, {"demo", loom::tools::add_demo_command},
      {"export", loom::tools::add_export_command},
  };
  return loom::tools::run_command_line(argc, argv, commands, "loom");
}
