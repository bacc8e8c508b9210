// `loom plan` and `loom demo`.
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>

#include "costmodel/estimate.hpp"
#include "planner/partition.hpp"
#include "planner/plan.hpp"
#include "planner/search.hpp"
#include "profiles/errors.hpp"
#include "profiles/loader.hpp"
#include "profiles/profile.hpp"
#include "profiles/units.hpp"
#include "tools/commands.hpp"

namespace loom::tools {
namespace {

struct PlanArgs {
  std::string model;
  std::string cluster;
  std::int64_t global_batch = 0;
  std::int64_t seq_len = 0;
  std::optional<std::int64_t> nodes;
  std::string precision = "bf16";
  std::vector<std::string> profile;
  std::optional<int> tp, pp, dp, zero, virtual_stages;
  std::optional<std::int64_t> micro_batch;
  std::optional<std::string> schedule, recompute, stages;
  double memory_margin = 0.9;
  int top = 5;
  std::string output;
  bool json = false;
};

using profiles::fixed_text;
using profiles::gib_text;
using profiles::seconds_text;

}  // namespace

void print_plan(std::ostream& out, const planner::Plan& plan) {
  const costmodel::Prediction& p = plan.predicted;
  out << "model    " << plan.model.name << " (" << plan.model.layers << " layers, hidden "
      << plan.model.hidden << ")\n"
      << "cluster  " << plan.cluster.name << ": " << plan.cluster.nodes << " x "
      << plan.cluster.devices_per_node << " " << plan.cluster.device.name << "\n"
      << "job      global batch " << plan.job.global_batch << ", seq " << plan.job.seq_len << ", "
      << profiles::to_string(plan.job.precision) << "\n"
      << "strategy " << costmodel::describe(plan.strategy) << "\n\n";
  out << "step time              " << seconds_text(p.step_time_s) << "\n"
      << "samples/s              " << fixed_text(p.samples_per_s, 1) << "\n"
      << "tokens/s               " << fixed_text(p.tokens_per_s, 0) << "\n"
      << "model TFLOP/s per GPU  " << fixed_text(p.model_tflops_per_gpu, 2) << "  (MFU "
      << profiles::percent_text(p.mfu) << ")\n"
      << "hw TFLOP/s per GPU     " << fixed_text(p.hardware_tflops_per_gpu, 2) << "\n"
      << "peak memory            " << gib_text(p.peak_memory_bytes) << " of "
      << gib_text(static_cast<double>(plan.cluster.device.memory_bytes)) << "\n"
      << "pipeline bubble        " << profiles::percent_text(p.bubble_fraction) << "\n"
      << "exposed communication  dp " << seconds_text(p.exposed_communication_s.dp) << ", tp "
      << seconds_text(p.exposed_communication_s.tp) << ", pp "
      << seconds_text(p.exposed_communication_s.pp) << ", zero "
      << seconds_text(p.exposed_communication_s.zero) << "\n"
      << "optimizer step         " << seconds_text(p.optimizer_s) << "\n"
      << "prediction             " << p.source << "\n\n";
  out << "stage  layers      params      grads       optimizer   activations buffers     total\n";
  for (std::size_t r = 0; r < p.memory_by_stage.size(); ++r) {
    const costmodel::MemoryBreakdown& m = p.memory_by_stage[r];
    // The layers of pipeline rank r (its first chunk's range when interleaved).
    const costmodel::StageRange& range = plan.stages[r];
    char line[256];
    std::snprintf(
        line, sizeof line, "%-6zu %-11s %-11s %-11s %-11s %-11s %-11s %s\n", r,
        (std::to_string(range.first_layer) + "-" + std::to_string(range.last_layer)).c_str(),
        gib_text(m.parameter_bytes).c_str(), gib_text(m.gradient_bytes).c_str(),
        gib_text(m.optimizer_bytes).c_str(), gib_text(m.activation_bytes).c_str(),
        gib_text(m.buffer_bytes).c_str(), gib_text(m.total()).c_str());
    out << line;
  }
  for (const std::string& w : plan.why) out << "why: " << w << "\n";
}

costmodel::Job make_job(const PlanArgs& a) {
  costmodel::Job job;
  if (a.global_batch > costmodel::kMaxGlobalBatch) {
    throw InputError("--global-batch", "",
                     "at most " + std::to_string(costmodel::kMaxGlobalBatch) +
                         " samples per step, found " + std::to_string(a.global_batch));
  }
  job.global_batch = a.global_batch;
  job.seq_len = a.seq_len;
  auto precision = profiles::parse_precision(a.precision);
  if (!precision || *precision == profiles::Precision::kTf32) {
    throw InputError("--precision", "",
                     "expected bf16, fp16 or fp32, found \"" + a.precision + "\"");
  }
  job.precision = *precision;
  return job;
}

// Checks the pinned dimensions against each other and the cluster before searching, so that a
// contradiction is reported in terms of the flags the user gave.
planner::SearchOptions search_options(const PlanArgs& a, const profiles::ModelSpec& model,
                                      std::int64_t devices) {
  planner::SearchOptions o;
  o.tp = a.tp;
  o.pp = a.pp;
  o.dp = a.dp;
  o.zero = a.zero;
  o.micro_batch = a.micro_batch;
  if (a.schedule) o.schedule = costmodel::parse_schedule(*a.schedule);
  if (a.recompute) o.recompute = costmodel::parse_recompute(*a.recompute);
  o.virtual_stages = a.virtual_stages;
  if (a.stages) o.stages = planner::parse_stages(*a.stages, "--stages");
  o.memory_margin = a.memory_margin;
  o.top = a.top;
  auto n = [](std::int64_t v) { return std::to_string(v); };
  if (a.tp && model.heads % *a.tp != 0) {
    throw InputError("--tp", "",
                     "tp=" + n(*a.tp) + " does not divide the " + n(model.heads) +
                         " attention heads of " + model.name);
  }
  if (a.tp && model.ffn_hidden % *a.tp != 0) {
    throw InputError("--tp", "",
                     "tp=" + n(*a.tp) + " does not divide ffn_hidden=" + n(model.ffn_hidden));
  }
  if (a.pp && *a.pp > model.layers) {
    throw InputError("--pp", "",
                     "pp=" + n(*a.pp) + " exceeds the " + n(model.layers) + " transformer layers");
  }
  std::int64_t fixed_ranks = std::int64_t{a.tp.value_or(1)} * a.pp.value_or(1) * a.dp.value_or(1);
  if (fixed_ranks > devices || (!a.dp && devices % fixed_ranks != 0)) {
    throw InputError(a.dp ? "--dp" : "--tp/--pp", "",
                     "the pinned tp*pp" + std::string(a.dp ? "*dp" : "") + " = " + n(fixed_ranks) +
                         " ranks do not " + (a.dp ? "fit" : "divide") + " the " + n(devices) +
                         " devices of the cluster");
  }
  if (a.tp && a.pp && a.micro_batch) {
    std::int64_t dp = a.dp.value_or(static_cast<int>(devices / (std::int64_t{*a.tp} * *a.pp)));
    std::int64_t per_step = dp * *a.micro_batch;
    if (a.global_batch % per_step != 0) {
      throw InputError("--global-batch", "",
                       "expected a multiple of dp*micro_batch = " + n(dp) + "*" +
                           n(*a.micro_batch) + " = " + n(per_step) + ", found " +
                           n(a.global_batch));
    }
  }
  // Both pinned: refused before the search when the schedule cannot run that many virtual stages.
  if (o.schedule && a.virtual_stages) {
    if (auto why = costmodel::check_virtual_stages(*o.schedule, *a.virtual_stages)) {
      throw InputError("--virtual-stages", "", *why);
    }
  }
  return o;
}

namespace {

void print_table(std::ostream& out, const std::vector<planner::Plan>& plans, double margin) {
  out << "  #  dp  tp  pp zero    mb  chunks schedule        recompute  step time    samples/s"
         "    MFU   peak mem    bound by\n";
  for (std::size_t i = 0; i < plans.size(); ++i) {
    const planner::Plan& p = plans[i];
    const costmodel::Strategy& s = p.strategy;
    std::string schedule = costmodel::to_string(s.schedule);
    if (s.virtual_stages > 1) schedule += " v=" + std::to_string(s.virtual_stages);
    char line[256];
    std::snprintf(line, sizeof line,
                  "%3zu %3d %3d %3d %4d %5lld %7lld %-15s %-10s %-12s %9.1f %5.1f %% %10s    %s\n",
                  i + 1, s.dp, s.tp, s.pp, s.zero, static_cast<long long>(s.micro_batch),
                  static_cast<long long>(s.num_micro_batches), schedule.c_str(),
                  costmodel::to_string(s.recompute), seconds_text(p.predicted.step_time_s).c_str(),
                  p.predicted.samples_per_s, 100 * p.predicted.mfu,
                  gib_text(p.predicted.peak_memory_bytes).c_str(),
                  planner::binding_constraint(p, margin).c_str());
    out << line;
  }
}

int run_plan(const PlanArgs& a) {
  auto start = std::chrono::steady_clock::now();
  profiles::ModelSpec model = profiles::load_model(a.model);
  profiles::Cluster cluster = profiles::load_cluster(a.cluster);
  if (a.nodes) cluster = profiles::with_nodes(cluster, *a.nodes, "--nodes");
  if (!(a.memory_margin > 0 && a.memory_margin <= 1)) {
    throw InputError("--memory-margin", "", "expected a fraction in (0, 1]");
  }
  costmodel::Job job = make_job(a);
  planner::SearchOptions options = search_options(a, model, cluster.device_count());
  std::shared_ptr<const profiles::Profile> profile;
  if (!a.profile.empty()) {
    profile = std::make_shared<const profiles::Profile>(
        planner::read_profiles(a.profile, model, job.precision));
  }
  std::vector<std::string> notes;
  const costmodel::CostModel cost = planner::calibrated_cost_model(model, cluster, profile, &notes);
  planner::SearchResult result = planner::search(cost, job, options);
  if (!result.plans.empty()) {
    for (const std::string& note : notes) result.plans[0].why.push_back("profile: " + note);
  }
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (result.plans.empty()) {
    throw InputError(a.model + " on " + a.cluster, "", result.infeasible_reason);
  }
  if (!a.output.empty()) {
    profiles::write_file_atomically(a.output, plan_to_json(result.plans[0]).dump(2) + "\n");
  }
  if (a.json) {
    nlohmann::json doc;
    doc["plans"] = nlohmann::json::array();
    for (const planner::Plan& p : result.plans) doc["plans"].push_back(plan_to_json(p));
    doc["searched"] = result.searched;
    doc["evaluated"] = result.evaluated;
    doc["feasible"] = result.feasible;
    doc["search_time_s"] = elapsed;
    std::cout << doc.dump(2) << "\n";
    return 0;
  }
  print_plan(std::cout, result.plans[0]);
  if (result.searched > 1) {
    std::cout << "\n";
    print_table(std::cout, result.plans, a.memory_margin);
    char line[200];
    std::snprintf(line, sizeof line,
                  "\nsearched %lld strategies (%lld evaluated, the rest pruned), %lld fit in "
                  "memory, in %.1f ms\n",
                  static_cast<long long>(result.searched), static_cast<long long>(result.evaluated),
                  static_cast<long long>(result.feasible), elapsed * 1e3);
    std::cout << line;
  }
  return 0;
}

}  // namespace

Runner add_plan_command(CLI::App& app) {
  auto args = std::make_shared<PlanArgs>();
  CLI::App* cmd = add_subcommand(app, "plan");
  cmd->add_option("--model", args->model, "built-in name, loom-model JSON or HF config.json")
      ->required();
  cmd->add_option("--cluster", args->cluster, "built-in name or loom-cluster JSON")->required();
  cmd->add_option("--global-batch", args->global_batch, "samples per optimizer step")
      ->required()
      ->check(kPositiveNumber);
  cmd->add_option("--seq-len", args->seq_len, "tokens per sample")
      ->required()
      ->check(kPositiveNumber);
  cmd->add_option("--nodes", args->nodes, "override the cluster's node count")
      ->check(kPositiveNumber);
  cmd->add_option("--precision", args->precision, "bf16 | fp16 | fp32")
      ->check(CLI::IsMember({"bf16", "fp16", "fp32"}));
  cmd->add_option("--profile", args->profile,
                  "measured loom-profile JSON (repeatable): layer times and links replace the "
                  "roofline where measured")
      ->allow_extra_args(false);
  cmd->add_option("--tp", args->tp, "tensor-parallel size")->check(kPositiveNumber);
  cmd->add_option("--pp", args->pp, "pipeline-parallel size")->check(kPositiveNumber);
  cmd->add_option("--dp", args->dp, "data-parallel size")->check(kPositiveNumber);
  cmd->add_option("--zero", args->zero, "ZeRO stage")->check(CLI::Range(0, 3));
  cmd->add_option("--micro-batch", args->micro_batch, "samples per micro-batch")
      ->check(kPositiveNumber);
  cmd->add_option("--schedule", args->schedule, "gpipe | 1f1b | interleaved")
      ->check(CLI::IsMember(costmodel::schedule_names()));
  cmd->add_option("--virtual-stages", args->virtual_stages, "model chunks per pipeline rank")
      ->check(kPositiveNumber);
  cmd->add_option("--recompute", args->recompute, "none | selective | full")
      ->check(CLI::IsMember({"none", "selective", "full"}));
  cmd->add_option("--stages", args->stages,
                  "pin the layer-to-stage partition: inclusive ranges of the layer sequence, one "
                  "per pipeline stage (0 = embedding, last = head), e.g. 0-0,1-13");
  cmd->add_option("--memory-margin", args->memory_margin,
                  "fraction of device memory a plan may use (default 0.9)");
  cmd->add_option("--top", args->top, "plans to show (default 5)")->check(kPositiveNumber);
  cmd->add_option("-o", args->output, "write the best plan (loom-plan/1) here");
  cmd->add_flag("--json", args->json, "print one JSON document instead of text");
  return [args]() { return run_plan(*args); };
}

}  // namespace loom::tools
