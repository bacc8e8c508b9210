// `loom plan` and `loom demo`.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>

#include "costmodel/estimate.hpp"
#include "costmodel/runtime.hpp"
#include "costmodel/simulator.hpp"
#include "planner/calibration_choice.hpp"
#include "planner/coverage.hpp"
#include "planner/emit.hpp"
#include "planner/partition.hpp"
#include "planner/plan.hpp"
#include "planner/search.hpp"
#include "profiles/errors.hpp"
#include "profiles/loader.hpp"
#include "profiles/profile.hpp"
#include "profiles/units.hpp"
#include "tools/commands.hpp"
#include "tools/plan_args.hpp"

namespace loom::tools {
namespace {

using profiles::fixed_text;
using profiles::Unit;
using profiles::unit_text;

// Plans whose step has more tasks than this are not played again just to print their idle share
// (the search's own limit; `loom simulate` plays any plan).
constexpr std::int64_t kMaxPrintedTasks = 60000;

// The strategy in words; the schedule only when there is a pipeline to schedule.
std::string strategy_text(const costmodel::Strategy& s) {
  std::string out = "dp=" + std::to_string(s.dp) + " tp=" + std::to_string(s.tp) +
                    " pp=" + std::to_string(s.pp) + " zero=" + std::to_string(s.zero) +
                    " micro-batch=" + std::to_string(s.micro_batch) +
                    " micro-batches=" + std::to_string(s.num_micro_batches);
  if (s.pp > 1) out += std::string(" schedule=") + costmodel::to_string(s.schedule);
  if (s.virtual_stages > 1) out += " virtual-stages=" + std::to_string(s.virtual_stages);
  out += std::string(" recompute=") + costmodel::to_string(s.recompute);
  if (s.recompute_layers > 0) out += " recompute-layers=" + std::to_string(s.recompute_layers);
  if (s.sequence_parallel) out += " sequence-parallel";
  out += std::string(" attention=") + costmodel::to_string(s.attention);
  if (s.cp > 1) out += " cp=" + std::to_string(s.cp);
  return out;
}

// What the runtime a plan predicts is, in words.
std::string runtime_text(costmodel::Runtime runtime) {
  const costmodel::RuntimeRules rules = costmodel::runtime_rules(runtime);
  if (runtime == costmodel::Runtime::kLoom)
    return std::string(rules.name) + " (" + rules.engine + ")";
  return std::string(rules.name) + " (" + rules.engine + "'s memory and overlap rules)";
}

// The entries of the layer sequence one chunk holds, in words: "emb + 1-6", "7-12 + head".
std::string chunk_text(const costmodel::StageRange& range, std::int64_t layers) {
  std::string out;
  auto add = [&](const std::string& part) { out += (out.empty() ? "" : " + ") + part; };
  if (range.first_layer == 0) add("emb");
  const std::int64_t first = std::max<std::int64_t>(range.first_layer, 1);
  const std::int64_t last = std::min<std::int64_t>(range.last_layer, layers);
  if (first == last) add(std::to_string(first));
  if (first < last) add(std::to_string(first) + "-" + std::to_string(last));
  if (range.last_layer == layers + 1) add("head");
  return out;
}

// The chunks of pipeline rank `rank` (chunk c runs on rank c % pp), comma-separated.
std::string stage_layers_text(const planner::Plan& plan, std::size_t rank) {
  std::string out;
  const auto pp = static_cast<std::size_t>(plan.strategy.pp);
  for (std::size_t c = rank; c < plan.stages.size(); c += pp) {
    out += (out.empty() ? "" : ", ") + chunk_text(plan.stages[c], plan.model.layers);
  }
  return out;
}

// The idle share of each pipeline rank's device time (SimulationResult::idle_shares); empty when
// the step is too large to play here.
std::vector<double> idle_shares(const planner::Plan& plan,
                                const costmodel::SimulationResult* simulation) {
  if (simulation != nullptr) return simulation->idle_shares();
  costmodel::SimulationOptions options;
  options.record_trace = false;
  options.max_tasks = kMaxPrintedTasks;
  return costmodel::simulate(planner::cost_model_of(plan), plan.job, plan.strategy, plan.stages,
                             options)
      .idle_shares();
}

// "50.0 % of the step (...)", and with a pipeline each stage's share: the mean hides a stage that
// waits most of the step (the naive split's first GPU).
std::string idle_text(const std::vector<double>& shares) {
  if (shares.empty()) return "- (the step is too large to play here; loom simulate plays it)";
  double sum = 0;
  for (const double x : shares) sum += x;
  std::string out = profiles::percent_text(sum / static_cast<double>(shares.size())) +
                    " of the step (waiting on other stages or on communication)";
  if (shares.size() > 1) {
    out += "; by stage:";
    for (std::size_t r = 0; r < shares.size(); ++r) {
      out += (r == 0 ? " " : ", ") + std::to_string(r) + " " + profiles::percent_text(shares[r]);
    }
  }
  return out;
}

// "label" padded to the column the figures start in.
std::string label(const std::string& text) {
  constexpr std::size_t kWidth = 25;
  return text + std::string(text.size() < kWidth ? kWidth - text.size() : 1, ' ');
}

void print_header(std::ostream& out, const planner::Plan& plan, const PlanTextOptions& options) {
  out << "model    " << plan.model.name << " (" << plan.model.layers << " layers, hidden "
      << plan.model.hidden << ")\n"
      << "head     " << profiles::head_text(plan.model) << "\n"
      << "cluster  " << plan.cluster.name << ": " << plan.cluster.nodes << " x "
      << plan.cluster.devices_per_node << " " << plan.cluster.device.name << "\n"
      << "job      global batch " << plan.job.global_batch << ", seq " << plan.job.seq_len
      << ", precision " << profiles::to_string(plan.job.precision)
      << (options.precision_note.empty() ? "" : " (" + options.precision_note + ")")
      << (plan.job.optimizer_kernels != costmodel::OptimizerKernels::kFused
              ? std::string(", AdamW ") + costmodel::to_string(plan.job.optimizer_kernels)
              : "")
      << "\n"
      << "runtime  " << runtime_text(plan.job.runtime)
      << (plan.job.compile ? ", torch.compile" : "")
      << (plan.job.tp_comm_overlap && plan.strategy.tp > 1 && plan.strategy.sequence_parallel
              ? ", tp communication overlapped"
              : "")
      << (plan.job.reduce_precision ? std::string(", gradients reduced in ") +
                                          profiles::to_string(*plan.job.reduce_precision)
                                    : "")
      << (plan.job.optimizer_precision ? std::string(", optimizer states in ") +
                                             profiles::to_string(*plan.job.optimizer_precision)
                                       : "")
      << "\n"
      << "calibration " << planner::calibration_text(plan.calibration) << "\n"
      << "strategy " << strategy_text(plan.strategy) << "\n\n";
}

void print_prediction(std::ostream& out, const planner::Plan& plan, const Unit& time,
                      const Unit& bytes, const PlanTextOptions& options) {
  const costmodel::Prediction& p = plan.predicted;
  const std::string per =
      plan.cluster.device.kind == profiles::DeviceKind::kGpu ? "per GPU" : "per device";
  out << label("step time") << unit_text(p.step_time_s, time, 3) << "\n"
      << label("samples/s") << fixed_text(p.samples_per_s, 1) << "\n"
      << label("tokens/s") << fixed_text(p.tokens_per_s, 0) << "\n"
      << label("model TFLOP/s " + per) << fixed_text(p.model_tflops_per_gpu, 2) << "  (MFU "
      << profiles::percent_text(p.mfu) << ")\n"
      << label("hw TFLOP/s " + per) << fixed_text(p.hardware_tflops_per_gpu, 2) << "\n"
      << label("peak memory") << unit_text(p.peak_memory_bytes, bytes, 2) << " of "
      << unit_text(static_cast<double>(plan.cluster.device.memory_bytes), bytes, 2) << "\n";
  out << label("devices idle") << idle_text(idle_shares(plan, options.simulation)) << "\n";
  if (plan.strategy.pp > 1) {
    out << label("pipeline bubble") << profiles::percent_text(p.bubble_fraction)
        << " added to m x the slowest stage's time (Megatron's (p-1)/m for equal stages; not "
           "the idle share)\n";
  }
  out << label("exposed communication") << "dp " << unit_text(p.exposed_communication_s.dp, time, 3)
      << ", tp " << unit_text(p.exposed_communication_s.tp, time, 3) << ", pp "
      << unit_text(p.exposed_communication_s.pp, time, 3) << ", zero "
      << unit_text(p.exposed_communication_s.zero, time, 3) << "\n"
      << label("optimizer step") << unit_text(p.optimizer_s, time, 3) << "\n";
  const double host_s = costmodel::runtime_host_s_per_step(plan.model, plan.job, plan.strategy);
  if (host_s > 0) {
    out << label("engine host work") << unit_text(host_s, time, 3)
        << " of the passes (the runtime's hooks on every parameter tensor)\n";
  }
  out << label("prediction") << p.source << "\n\n";
}

// The head in the legend of the memory table.
std::string head_noun(const profiles::ModelSpec& model) {
  if (model.num_labels) return "classifier";
  return model.family == profiles::Family::kEncoder ? "masked-LM head" : "LM head";
}

void print_stage_memory(std::ostream& out, const planner::Plan& plan, const Unit& bytes) {
  const costmodel::Prediction& p = plan.predicted;
  // The layers last: an interleaved rank's chunks make a long list.
  // On GPUs a "process" column (CUDA context, NCCL buffers, fragmentation) makes the columns add
  // up to the total; CPU processes have no such line. The cuBLAS workspaces, which PyTorch takes
  // from its caching allocator, are among the buffers.
  bool process = false;
  for (const costmodel::MemoryBreakdown& m : p.memory_by_stage) process |= m.process_bytes() > 0;
  out << "stage  params      grads       optimizer   activations buffers     "
      << (process ? "process     " : "") << "total       layers\n";
  for (std::size_t r = 0; r < p.memory_by_stage.size(); ++r) {
    const costmodel::MemoryBreakdown& m = p.memory_by_stage[r];
    char process_cell[64] = "";
    if (process) {
      std::snprintf(process_cell, sizeof process_cell, "%-11s ",
                    unit_text(m.process_bytes(), bytes, 2).c_str());
    }
    char line[512];
    std::snprintf(line, sizeof line, "%-6zu %-11s %-11s %-11s %-11s %-11s %s%-11s %s\n", r,
                  unit_text(m.parameter_bytes, bytes, 2).c_str(),
                  unit_text(m.gradient_bytes, bytes, 2).c_str(),
                  unit_text(m.optimizer_bytes, bytes, 2).c_str(),
                  unit_text(m.activation_bytes, bytes, 2).c_str(),
                  unit_text(m.buffer_bytes + m.workspace_bytes, bytes, 2).c_str(), process_cell,
                  unit_text(m.total(), bytes, 2).c_str(), stage_layers_text(plan, r).c_str());
    out << line;
  }
  const std::int64_t layers = plan.model.layers;
  out << "(emb = embedding, 0 in --stages; "
      << (layers == 1 ? std::string("1") : "1-" + std::to_string(layers))
      << " = transformer layers; head = " << head_noun(plan.model) << ", " << layers + 1
      << " in --stages)\n";
}

}  // namespace

void print_extrapolated(std::ostream& out, const planner::Plan& plan) {
  for (const costmodel::Extrapolation& e : plan.extrapolated) {
    out << "extrapolated: " << e.text() << "\n";
  }
}

void print_plan(std::ostream& out, const planner::Plan& plan, const PlanTextOptions& options) {
  const Unit time = profiles::time_unit(plan.predicted.step_time_s);
  const Unit bytes = profiles::byte_unit(plan.predicted.peak_memory_bytes);
  print_header(out, plan, options);
  print_prediction(out, plan, time, bytes, options);
  print_stage_memory(out, plan, bytes);
  for (const std::string& w : plan.why) out << "why: " << w << "\n";
}

// The job's precision: --precision when given (refused when the device has no rate for it), else
// the best the device runs, with the note that says so.
costmodel::Job make_job(const PlanArgs& a, const profiles::Cluster& cluster, std::string* note) {
  costmodel::Job job;
  if (a.global_batch > costmodel::kMaxGlobalBatch) {
    throw InputError("--global-batch", "",
                     "at most " + std::to_string(costmodel::kMaxGlobalBatch) +
                         " samples per step, found " + std::to_string(a.global_batch));
  }
  job.global_batch = a.global_batch;
  job.seq_len = a.seq_len;
  if (a.runtime) job.runtime = *costmodel::parse_runtime(*a.runtime);
  if (a.cp && *a.cp > 1 && !costmodel::runtime_rules(job.runtime).context_parallel) {
    throw InputError("--cp", "",
                     "context parallelism is Megatron-Core's: --cp " + std::to_string(*a.cp) +
                         " needs --runtime megatron or nemo (runtime " +
                         costmodel::to_string(job.runtime) + " plans cp 1)");
  }
  if (a.loss) job.loss = *costmodel::parse_loss(*a.loss);
  if (a.compile) job.compile = *a.compile == "on";
  // On by default where the runtime's engine can overlap (TransformerEngine's userbuffers), as
  // an experienced user and NeMo's performance configurations run it; acts on plans with tp > 1
  // and sequence parallelism.
  job.tp_comm_overlap = a.tp_comm_overlap
                            ? *a.tp_comm_overlap == "on"
                            : costmodel::runtime_rules(job.runtime).overlaps_tp_communication;
  if (a.reduce_dtype) job.reduce_precision = profiles::parse_precision(*a.reduce_dtype);
  if (a.optimizer_dtype) job.optimizer_precision = profiles::parse_precision(*a.optimizer_dtype);
  if (a.optimizer_kernels) {
    job.optimizer_kernels = *costmodel::parse_optimizer_kernels(*a.optimizer_kernels);
  }
  if (!a.precision) {
    job.precision = profiles::best_precision(cluster.device);
    *note = cluster.device.kind == profiles::DeviceKind::kCpu
                ? "what Loom computes in on CPUs; --precision to choose"
                : "the best the " + cluster.device.name + " runs; --precision to choose";
    return job;
  }
  auto precision = profiles::parse_precision(*a.precision);
  if (!precision) {
    throw InputError("--precision", "",
                     "expected bf16, fp16, tf32, fp32 or fp8, found \"" + *a.precision + "\"");
  }
  if (auto why = profiles::precision_refusal(cluster.device, *precision)) {
    throw InputError("--precision", "", *why);
  }
  job.precision = *precision;
  return job;
}

// The cluster the plan uses: --gpus devices of it, or --nodes nodes; both only when they agree.
profiles::Cluster plan_cluster(const PlanArgs& a) {
  profiles::Cluster cluster = profiles::load_cluster(a.cluster);
  if (!a.gpus) {
    return a.nodes ? profiles::with_nodes(cluster, *a.nodes, "--nodes") : cluster;
  }
  profiles::Cluster used = profiles::with_devices(cluster, *a.gpus, "--gpus");
  if (a.nodes && *a.nodes != used.nodes) {
    throw InputError("--gpus", "",
                     "--gpus " + std::to_string(*a.gpus) + " is " + std::to_string(used.nodes) +
                         (used.nodes == 1 ? " node" : " nodes") + " of " +
                         std::to_string(used.devices_per_node) + " devices, but --nodes is " +
                         std::to_string(*a.nodes) + ": give one of them");
  }
  return used;
}

// Checks the pinned dimensions against each other and the cluster before searching, so that a
// contradiction is reported in terms of the flags the user gave.
planner::SearchOptions search_options(const PlanArgs& a, const profiles::ModelSpec& model,
                                      std::int64_t devices) {
  planner::SearchOptions o;
  o.tp = a.tp;
  o.pp = a.pp;
  o.dp = a.dp;
  o.cp = a.cp;
  o.zero = a.zero;
  o.micro_batch = a.micro_batch;
  if (a.schedule) o.schedule = costmodel::parse_schedule(*a.schedule);
  if (a.recompute) o.recompute = costmodel::parse_recompute(*a.recompute);
  if (a.recompute_layers) {
    if (o.recompute && *o.recompute != costmodel::Recompute::kFull) {
      throw InputError("--recompute-layers", "",
                       "a count of layers that recompute in full: it needs --recompute full "
                       "(found --recompute " +
                           *a.recompute + ")");
    }
    if (*a.recompute_layers > model.layers) {
      throw InputError("--recompute-layers", "",
                       "at most the " + std::to_string(model.layers) + " transformer layers of " +
                           model.name + " (found " + std::to_string(*a.recompute_layers) + ")");
    }
    o.recompute = costmodel::Recompute::kFull;
    o.recompute_layers = *a.recompute_layers;
  }
  if (a.sp) o.sequence_parallel = *a.sp == "on";
  if (a.attention) o.attention = costmodel::parse_attention(*a.attention);
  o.virtual_stages = a.virtual_stages;
  if (a.stages) o.stages = planner::parse_stages(*a.stages, "--stages");
  o.memory_margin = a.memory_margin;
  o.top = a.top;
  // --gpus N plans for exactly N devices, also on a CPU node (where the search would otherwise
  // also try fewer ranks with more threads each).
  o.fewer_cpu_ranks = !a.gpus;
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
  if (o.sequence_parallel == true && a.tp && *a.tp == 1) {
    throw InputError("--sp", "",
                     "sequence parallelism shards the sequence over the tensor-parallel group: "
                     "--sp on needs tp > 1, but --tp is 1");
  }
  if (o.sequence_parallel == true && a.tp && a.seq_len % *a.tp != 0) {
    throw InputError(
        "--sp", "",
        "sequence parallelism needs tp=" + n(*a.tp) + " to divide --seq-len " + n(a.seq_len));
  }
  if (a.pp && *a.pp > model.layers) {
    throw InputError("--pp", "",
                     "pp=" + n(*a.pp) + " exceeds the " + n(model.layers) + " transformer layers");
  }
  std::int64_t fixed_ranks =
      std::int64_t{a.tp.value_or(1)} * a.pp.value_or(1) * a.dp.value_or(1) * a.cp.value_or(1);
  if (fixed_ranks > devices || (!a.dp && devices % fixed_ranks != 0)) {
    throw InputError(a.dp ? "--dp" : "--tp/--pp", "",
                     "the pinned tp*pp" + std::string(a.cp ? "*cp" : "") +
                         std::string(a.dp ? "*dp" : "") + " = " + n(fixed_ranks) +
                         " ranks do not " + (a.dp ? "fit" : "divide") + " the " + n(devices) +
                         " devices of the cluster");
  }
  if (a.tp && a.pp && a.micro_batch) {
    std::int64_t dp =
        a.dp.value_or(static_cast<int>(devices / (std::int64_t{*a.tp} * *a.pp * a.cp.value_or(1))));
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

// The plans side by side, in the units of the first one's summary.
void print_table(std::ostream& out, const std::vector<planner::Plan>& plans, double margin) {
  const Unit time = profiles::time_unit(plans.at(0).predicted.step_time_s);
  const Unit bytes = profiles::byte_unit(plans.at(0).predicted.peak_memory_bytes);
  // The cp column only where a plan splits its sequences.
  const bool cp = std::any_of(plans.begin(), plans.end(),
                              [](const planner::Plan& p) { return p.strategy.cp > 1; });
  out << "  #  dp  tp  pp" << (cp ? "  cp" : "")
      << " zero    mb  chunks schedule        recompute  sp   step time    "
         "samples/s    MFU   peak mem    bound by\n";
  for (std::size_t i = 0; i < plans.size(); ++i) {
    const planner::Plan& p = plans[i];
    const costmodel::Strategy& s = p.strategy;
    std::string schedule = s.pp > 1 ? costmodel::to_string(s.schedule) : "-";
    if (s.virtual_stages > 1) schedule += " v=" + std::to_string(s.virtual_stages);
    char cp_cell[16] = "";
    if (cp) std::snprintf(cp_cell, sizeof cp_cell, " %3d", s.cp);
    char line[256];
    std::snprintf(
        line, sizeof line,
        "%3zu %3d %3d %3d%s %4d %5lld %7lld %-15s %-10s %-4s %-12s %9.1f %5.1f %% %10s    "
        "%s\n",
        i + 1, s.dp, s.tp, s.pp, cp_cell, s.zero, static_cast<long long>(s.micro_batch),
        static_cast<long long>(s.num_micro_batches), schedule.c_str(),
        costmodel::recompute_cell(s).c_str(),
        s.tp == 1             ? "-"
        : s.sequence_parallel ? "on"
                              : "off",
        unit_text(p.predicted.step_time_s, time, 3).c_str(), p.predicted.samples_per_s,
        100 * p.predicted.mfu, unit_text(p.predicted.peak_memory_bytes, bytes, 2).c_str(),
        planner::binding_constraint(p, margin).c_str());
    out << line;
  }
}

}  // namespace

PlanSearch search_plans(const PlanArgs& a) {
  auto start = std::chrono::steady_clock::now();
  const profiles::ModelSpec model =
      profiles::with_head(profiles::load_model(a.model), a.num_labels);
  const profiles::Cluster cluster = plan_cluster(a);
  if (!(a.memory_margin > 0 && a.memory_margin <= 1)) {
    throw InputError("--memory-margin", "", "expected a fraction in (0, 1]");
  }
  PlanArgs pinned = a;
  if (a.micro_batch_per_device) {
    if (a.micro_batch) {
      throw InputError("--micro-batch-per-device", "",
                       "another name for --micro-batch: give one of them");
    }
    pinned.micro_batch = a.micro_batch_per_device;
  }
  PlanSearch out;
  PlanTextOptions& text = out.text;
  costmodel::Job job = make_job(pinned, cluster, &text.precision_note);
  if (a.emit) {
    if (a.json) throw InputError("--emit", "", "--emit and --json both print: give one of them");
    if (a.runtime && *a.runtime != *a.emit) {
      throw InputError(
          "--emit", "",
          "the runtime --runtime names (" + *a.runtime + ") or none; found " + *a.emit);
    }
    job.runtime = *costmodel::parse_runtime(*a.emit);  // plan for the runtime it emits
    if (!a.tp_comm_overlap) {
      job.tp_comm_overlap = costmodel::runtime_rules(job.runtime).overlaps_tp_communication;
    }
  }
  planner::SearchOptions options = search_options(pinned, model, cluster.device_count());
  std::shared_ptr<const profiles::Profile> profile;
  if (!a.profile.empty()) {
    profile = std::make_shared<const profiles::Profile>(
        planner::read_profiles(a.profile, model, job.precision));
  }
  std::vector<std::string> notes;
  const planner::CalibratedCluster calibrated =
      planner::with_calibration(cluster, job.runtime, a.calibration);
  const costmodel::CostModel cost =
      planner::calibrated_cost_model(model, calibrated.cluster, profile, &notes);
  planner::SearchResult& result = out.result;
  result = planner::search(cost, job, options);
  if (!result.plans.empty()) {
    for (const std::string& note : notes) result.plans[0].why.push_back("profile: " + note);
  }
  // The points the profile did not measure, recorded in each plan (docs/plan.md).
  for (planner::Plan& p : result.plans) {
    p.extrapolated = planner::extrapolated_points(p);
    p.calibration = calibrated.calibration;
  }
  out.elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (result.plans.empty()) {
    throw InputError(a.model + " on " + a.cluster, "", result.infeasible_reason);
  }
  return out;
}

namespace {

int run_plan(const PlanArgs& a) {
  const PlanSearch search = search_plans(a);
  const planner::SearchResult& result = search.result;
  const PlanTextOptions& text = search.text;
  const double elapsed = search.elapsed_s;
  print_extrapolated(std::cerr, result.plans[0]);  // said on stderr for the plan it writes
  if (!a.output.empty()) {
    profiles::write_file_atomically(a.output, plan_to_json(result.plans[0]).dump(2) + "\n");
  }
  if (a.emit) {
    std::cout << planner::emit_plan(result.plans[0], *costmodel::parse_runtime(*a.emit));
    return 0;
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
  print_plan(std::cout, result.plans[0], text);
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

void add_plan_options(CLI::App* cmd, PlanArgs* args) {
  cmd->add_option("--model", args->model,
                  "built-in name, loom-model JSON, HF config.json or a checkpoint folder holding "
                  "one")
      ->required();
  cmd->add_option("--num-labels", args->num_labels,
                  "classification head with N labels; 0 = the language-model head (default: the "
                  "config's own labels, else 2 for encoders; decoders keep the LM head)")
      ->check(kNonNegativeNumber);
  cmd->add_option("--cluster", args->cluster, "built-in name or loom-cluster JSON")->required();
  cmd->add_option("--global-batch", args->global_batch, "samples per optimizer step")
      ->required()
      ->check(kPositiveNumber);
  cmd->add_option("--seq-len", args->seq_len, "tokens per sample")
      ->required()
      ->check(kPositiveNumber);
  cmd->add_option("--nodes", args->nodes, "override the cluster's node count")
      ->check(kPositiveNumber);
  cmd->add_option("--gpus", args->gpus,
                  "use N devices of the cluster: one node of N when N <= devices_per_node, else "
                  "N / devices_per_node nodes")
      ->check(kPositiveNumber);
  cmd->add_option(
         "--precision", args->precision,
         "bf16 | fp16 | tf32 | fp32 | fp8 (default: the best the device runs; fp32 on CPUs); "
         "tf32: matrix products at the device's tf32 rate, storage and optimizer in fp32; fp8: "
         "the linear layers' products in fp8 as TransformerEngine runs them, all else bf16 "
         "(runtimes megatron and fsdp)")
      ->check(CLI::IsMember({"bf16", "fp16", "tf32", "fp32", "fp8"}));
  cmd->add_option("--calibration", args->calibration,
                  "runtime calibration: a shipped name, a loom-calibration JSON, or none (the "
                  "hardware values alone); default: the shipped one of the runtime and device");
  cmd->add_option("--profile", args->profile,
                  "measured loom-profile JSON (repeatable): layer times and links replace the "
                  "roofline where measured")
      ->allow_extra_args(false);
  cmd->add_option("--tp", args->tp, "tensor-parallel size")->check(kPositiveNumber);
  cmd->add_option("--pp", args->pp, "pipeline-parallel size")->check(kPositiveNumber);
  cmd->add_option("--cp", args->cp,
                  "context-parallel size: each sequence split over cp ranks (runtimes megatron "
                  "and nemo; searched there unless given)")
      ->check(kPositiveNumber);
  cmd->add_option("--dp", args->dp, "data-parallel size")->check(kPositiveNumber);
  cmd->add_option("--zero", args->zero, "ZeRO stage")->check(CLI::Range(0, 3));
  cmd->add_option("--micro-batch", args->micro_batch, "samples per micro-batch")
      ->check(kPositiveNumber);
  cmd->add_option("--micro-batch-per-device", args->micro_batch_per_device,
                  "another name for --micro-batch (Hugging Face's per_device_train_batch_size)")
      ->check(kPositiveNumber);
  cmd->add_option("--schedule", args->schedule, "gpipe | 1f1b | interleaved")
      ->check(CLI::IsMember(costmodel::schedule_names()));
  cmd->add_option("--virtual-stages", args->virtual_stages, "model chunks per pipeline rank")
      ->check(kPositiveNumber);
  cmd->add_option("--recompute", args->recompute, "none | selective | full")
      ->check(CLI::IsMember({"none", "selective", "full"}));
  cmd->add_option("--recompute-layers", args->recompute_layers,
                  "with full recomputation, only the first N transformer layers of each "
                  "pipeline chunk recompute (Megatron's --recompute-method block); implies "
                  "--recompute full")
      ->check(kPositiveNumber);
  cmd->add_option("--sp", args->sp,
                  "Megatron sequence parallelism with tensor parallelism: on | off (default: "
                  "both searched whenever tp > 1; on needs tp > 1)")
      ->check(CLI::IsMember({"on", "off"}));
  cmd->add_option("--attention", args->attention,
                  "flash | math (default: flash on GPUs, what the executor runs with LibTorch >= "
                  "2; math on CPUs)")
      ->check(CLI::IsMember({"flash", "math"}));
  cmd->add_option("--runtime", args->runtime,
                  "loom | megatron | deepspeed | fsdp | nemo: whose memory and overlap rules the "
                  "prediction follows (default loom, Loom's executor)")
      ->check(CLI::IsMember(costmodel::runtime_names()));
  cmd->add_option("--loss", args->loss,
                  "eager | fused: a language model's cross-entropy (default eager, PyTorch's on "
                  "fp32 logits; fused writes its gradient in place)")
      ->check(CLI::IsMember({"eager", "fused"}));
  cmd->add_option("--compile", args->compile,
                  "on | off: the model runs under torch.compile, its elementwise kernels fused "
                  "(default off; runtimes fsdp and deepspeed)")
      ->check(CLI::IsMember({"on", "off"}));
  cmd->add_option("--tp-comm-overlap", args->tp_comm_overlap,
                  "on | off: TransformerEngine's overlap of the tp all-gathers and reduce-scatters "
                  "with the linear layers' products, on plans with tp > 1 and --sp (default on "
                  "for runtimes megatron and nemo; others refuse on)")
      ->check(CLI::IsMember({"on", "off"}));
  cmd->add_option("--reduce-dtype", args->reduce_dtype,
                  "fp32 | bf16 | fp16: what the gradient reduction sends (FSDP's "
                  "MixedPrecision.reduce_dtype, NeMo's optim.grad_sync_dtype; runtimes fsdp and "
                  "nemo, default fp32)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  cmd->add_option("--optimizer-dtype", args->optimizer_dtype,
                  "fp32 | bf16: the optimizer states' dtype (NeMo's optim.dtype: bf16 keeps the "
                  "moments in bf16 and no fp32 master weights; runtime nemo with --zero 2, "
                  "default fp32)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  cmd->add_option("--optimizer-kernels", args->optimizer_kernels,
                  "fused | foreach | per_tensor: how AdamW issues its step (default fused; "
                  "foreach is torch.optim.AdamW's default, per_tensor its foreach=False loop; "
                  "runtimes fsdp, and loom without ZeRO)")
      ->check(CLI::IsMember({"fused", "foreach", "per_tensor"}));
  cmd->add_option("--stages", args->stages,
                  "pin the layer-to-stage partition: inclusive ranges of the layer sequence, one "
                  "per pipeline stage (0 = embedding, last = head), e.g. 0-0,1-13");
  cmd->add_option("--memory-margin", args->memory_margin,
                  "fraction of device memory a plan may use (default 0.9)");
}

Runner add_plan_command(CLI::App& app) {
  auto args = std::make_shared<PlanArgs>();
  CLI::App* cmd = add_subcommand(app, "plan");
  add_plan_options(cmd, args.get());
  cmd->add_option("--top", args->top, "plans to show (default 5)")->check(kPositiveNumber);
  cmd->add_option("-o", args->output, "write the best plan (loom-plan/1) here");
  cmd->add_flag("--json", args->json, "print one JSON document instead of text");
  cmd->add_option("--emit", args->emit,
                  "print what runs the best plan in megatron (Megatron-LM arguments), deepspeed "
                  "(a DeepSpeed config and launch line) or fsdp (torchrun and FSDP settings), "
                  "planned for that runtime")
      ->check(CLI::IsMember({"megatron", "deepspeed", "fsdp"}));
  return [args]() { return run_plan(*args); };
}

}  // namespace loom::tools
