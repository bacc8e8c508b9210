// The arguments `loom plan` and `loom tune` share (model, cluster, job, pinned dimensions,
// --profile) and the search they both run over them.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "planner/search.hpp"
#include "tools/commands.hpp"

namespace loom::tools {

struct PlanArgs {
  std::string model;
  std::string cluster;
  std::int64_t global_batch = 0;
  std::int64_t seq_len = 0;
  std::optional<std::int64_t> nodes, gpus;
  std::optional<std::string> calibration;  // --calibration: name, file or "none"
  std::optional<std::string> precision;
  std::optional<std::int64_t> num_labels;
  std::vector<std::string> profile;
  std::optional<int> tp, pp, dp, cp, zero, virtual_stages, recompute_layers;
  std::optional<std::int64_t> micro_batch, micro_batch_per_device;
  std::optional<std::string> schedule, recompute, stages, sp, attention, runtime, loss, compile,
      reduce_dtype, optimizer_dtype, optimizer_kernels, tp_comm_overlap;
  double memory_margin = 0.9;
  int top = 5;
  std::string output;
  bool json = false;
  std::optional<std::string> emit;  // megatron | deepspeed | fsdp
};

// Adds the options that say what to plan (every option of `loom plan` but --top, -o, --json and
// --emit, whose meaning is the command's own) to `cmd`, storing into `args`.
void add_plan_options(CLI::App* cmd, PlanArgs* args);

// The search over `a`: its result (the best a.top plans, fastest first; the first one's `why`
// with the profile's notes), the note print_plan says after the precision, and the time it took.
struct PlanSearch {
  planner::SearchResult result;
  PlanTextOptions text;
  double elapsed_s = 0;
};

// Plans `a`. Throws InputError for contradicting arguments and when no strategy fits.
PlanSearch search_plans(const PlanArgs& a);

}  // namespace loom::tools
