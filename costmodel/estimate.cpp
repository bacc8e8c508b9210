#include "costmodel/estimate.hpp"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <numeric>
#include <stdexcept>

#include "costmodel/layers.hpp"
#include "costmodel/lowering.hpp"
#include "costmodel/measured_profile.hpp"
#include "costmodel/memory.hpp"
#include "costmodel/optimizer.hpp"
#include "costmodel/pipeline.hpp"
#include "costmodel/process_memory.hpp"
#include "costmodel/runtime.hpp"
#include "costmodel/terms.hpp"
#include "costmodel/zero.hpp"
#include "profiles/topology.hpp"

namespace loom::costmodel {

using profiles::Family;

namespace {

std::vector<int> identity_mapping(const profiles::Cluster& cluster) {
  std::vector<int> out(static_cast<std::size_t>(cluster.device_count()));
  std::iota(out.begin(), out.end(), 0);
  return out;
}

}  // namespace

CostModel::CostModel(profiles::ModelSpec model, const profiles::Cluster& cluster,
                     CostOptions options)
    : CostModel(std::move(model), cluster, options, identity_mapping(cluster)) {}

CostModel::CostModel(profiles::ModelSpec model, profiles::Cluster cluster, CostOptions options,
                     std::vector<int> device_of_rank)
    : model_(std::move(model)),
      cluster_(std::move(cluster)),
      options_(options),
      links_(std::make_shared<const profiles::Topology>(cluster_), std::move(device_of_rank)) {}

CostModel::CostModel(profiles::ModelSpec model, profiles::Cluster cluster, CostOptions options,
                     std::shared_ptr<const profiles::Topology> topology,
                     std::vector<int> device_of_rank)
    : model_(std::move(model)),
      cluster_(std::move(cluster)),
      options_(options),
      links_(std::move(topology), std::move(device_of_rank)) {}

CostModel CostModel::with_mapping(std::vector<int> device_of_rank) const {
  CostModel out(model_, cluster_, options_, links_.shared_topology(), std::move(device_of_rank));
  out.profile_ = profile_;
  return out;
}

CostModel CostModel::with_profile(std::shared_ptr<const MeasuredProfile> measured) const {
  CostModel out(model_, cluster_, options_, links_.shared_topology(), links_.device_of_rank());
  out.profile_ = std::move(measured);
  return out;
}

CostModel CostModel::with_model(profiles::ModelSpec model) const {
  CostModel out(std::move(model), cluster_, options_, links_.shared_topology(),
                links_.device_of_rank());
  out.profile_ = profile_;
  return out;
}

int devices_in_use(const profiles::Cluster& cluster, int world) {
  return world * threads_per_rank(cluster, world);
}

int CostModel::threads_per_rank(int world) const {
  return costmodel::threads_per_rank(cluster_, world);
}

std::vector<std::string> CostModel::profile_notes(const Job& job, const Strategy& s) const {
  std::vector<std::string> out;
  if (!profile_) return out;
  const Terms t = compute_terms(model_, options_, links_, cluster_, profile_.get(), job, s);
  const std::string shape =
      " (b=" + std::to_string(s.micro_batch) + " s=" + std::to_string(job.seq_len) +
      " tp=" + std::to_string(s.tp) + " recompute=" + to_string(s.recompute) +
      (cluster_.device.kind == profiles::DeviceKind::kCpu ? " threads=" + std::to_string(t.threads)
                                                          : std::string()) +
      ")";
  auto line = [&](const char* what, Provenance how) {
    std::string text = std::string(what) + ": " + to_string(how);
    if (how == Provenance::kScaled) text += " (roofline x measured/roofline of the nearest point)";
    if (how == Provenance::kRoofline) text += " (the profile has no such layer)";
    out.push_back(text + shape);
  };
  line("embedding", t.how_embedding);
  line(model_.family == Family::kEncoder ? "encoder layer" : "decoder layer", t.how_layer);
  line("head", t.how_head);
  return out;
}

StepTerms CostModel::step_terms(const Job& job, const Strategy& strategy) const {
  return step_terms_of(
      compute_terms(model_, options_, links_, cluster_, profile_.get(), job, strategy));
}

SequenceCosts CostModel::sequence_costs(const Job& job, const Strategy& strategy) const {
  return step_terms(job, strategy).costs;
}

MemoryBreakdown CostModel::stage_memory(const Job& job, const Strategy& s, int pipeline_rank,
                                        const StageLoad& load) const {
  return stage_memory(step_terms(job, s), job, s, pipeline_rank, load);
}

MemoryBreakdown CostModel::stage_memory(const StepTerms& terms, const Job& job, const Strategy& s,
                                        int pipeline_rank, const StageLoad& load) const {
  MemoryBreakdown mem;
  mem.activation_bytes = load.activation_bytes *
                         activation_micro_batches_in_flight(s.schedule, s.pp, pipeline_rank,
                                                            s.num_micro_batches, s.virtual_stages);
  const double hidden = static_cast<double>(model_.hidden);
  RankMemoryInput in;
  in.num_parameters = load.num_parameters;
  in.num_layers = load.num_layers;
  const ParameterCounts counts = count_parameters(model_);
  in.layer_num_parameters = static_cast<double>(counts.transformer_layer.per_rank(s.tp));
  in.linear_weight_parameters =
      load.num_layers * static_cast<double>(layer_linear_weight_parameters(model_)) / s.tp;
  in.largest_tensor_num_parameters =
      static_cast<double>(std::max(model_.vocab, model_.ffn_hidden)) * hidden / s.tp;
  if (pipeline_rank == 0 && load.activation_bytes > 0) {
    in.embedding_table_num_parameters = static_cast<double>(model_.vocab) * hidden / s.tp;
  }
  in.largest_block_num_parameters =
      std::max({load.num_layers > 0 ? in.layer_num_parameters : 0.0,
                pipeline_rank == 0 ? static_cast<double>(counts.embedding.per_rank(s.tp)) : 0.0,
                pipeline_rank == s.pp - 1 ? static_cast<double>(counts.head.per_rank(s.tp)) : 0.0});
  in.activation_bytes = mem.activation_bytes;
  in.chunk_activation_bytes = load.activation_bytes / s.virtual_stages;
  in.backward_temporary_bytes = terms.backward_temporary_bytes;
  if (s.recompute == Recompute::kFull) {
    in.recomputing_layers = load.num_layers * recompute_share(s, model_.layers);
  }
  in.bucket_bytes = options_.dp_bucket_bytes;
  in.gpu = cluster_.device.kind == profiles::DeviceKind::kGpu;
  const RuntimeRules rules = runtime_rules(job.runtime);
  // The last pipeline rank holds the head; a language-model head's loss spans the vocabulary.
  if (pipeline_rank == s.pp - 1 && !model_.num_labels && job.loss == Loss::kEager) {
    const std::int64_t local_seq = rank_tokens(job, s);
    in.loss_backward_bytes = rules.loss_backward_bytes_per_logit *
                             static_cast<double>(s.micro_batch) * static_cast<double>(local_seq) *
                             static_cast<double>(model_.vocab) / s.tp;
  }
  // The runtime's states are sharded over the dp x cp ranks that share weights (gradient_view).
  const RuntimeMemory runtime = rules.memory(job, gradient_view(s), in);
  mem.parameter_bytes = runtime.states.parameter_bytes;
  mem.gradient_bytes = runtime.states.gradient_bytes;
  mem.optimizer_bytes = runtime.states.optimizer_bytes;
  mem.buffer_bytes = runtime.buffer_bytes;
  const ProcessMemory process = process_memory(cluster_.device, gradient_view(s), mem.buffer_bytes);
  mem.cuda_context_bytes = process.cuda_context_bytes;
  mem.workspace_bytes = process.workspace_bytes;
  mem.nccl_buffer_bytes = process.nccl_buffer_bytes;
  mem.fragmentation_bytes = process.fragmentation_bytes;
  return mem;
}

Prediction CostModel::estimate(const Job& job, const Strategy& s,
                               const std::vector<StageRange>& stages) const {
  check_estimate(job, s, stages);
  return predict(step_terms(job, s), job, s, stages);
}

Prediction CostModel::estimate(const StepTerms& terms, const Job& job, const Strategy& s,
                               const std::vector<StageRange>& stages) const {
  check_estimate(job, s, stages);
  return predict(terms, job, s, stages);
}

void CostModel::check_estimate(const Job& job, const Strategy& s,
                               const std::vector<StageRange>& stages) const {
  if (auto why = check_strategy(model_, cluster_.device_count(), job, s)) {
    throw std::invalid_argument(*why);
  }
  if (auto why = check_partition(model_, s, stages)) throw std::invalid_argument(*why);
}

Prediction CostModel::predict(const StepTerms& terms, const Job& job, const Strategy& s,
                              const std::vector<StageRange>& stages) const {
  const profiles::ModelSpec& m = model_;
  const int world = s.world_size();
  const ZeroPolicy zero = zero_policy(s.zero);
  const Strategy g = gradient_view(s);  // the groups gradients are reduced and sharded over
  const double p2p = terms.p2p_s;

  const std::vector<ChunkCost> lowered = lower_chunks(m, s, terms, stages);
  const std::vector<StageLoad> load = stage_loads(lowered, s.pp);
  std::vector<StageTime> compute(s.pp), with_tp(s.pp), with_pp(s.pp);
  for (const ChunkCost& k : lowered) {
    const auto r = static_cast<std::size_t>(k.pipeline_rank);
    compute[r].forward_s += k.compute_s.forward_s;
    compute[r].backward_s += k.compute_s.backward_s;
    with_tp[r].forward_s += k.with_tp_s.forward_s;
    with_tp[r].backward_s += k.with_tp_s.backward_s;
    with_pp[r].forward_s += k.with_tp_s.forward_s + (s.pp > 1 ? p2p : 0);
    with_pp[r].backward_s += k.with_tp_s.backward_s + (s.pp > 1 ? p2p : 0);
  }
  const double pipe_compute =
      pipeline_time_s(compute, s.num_micro_batches, s.schedule, s.virtual_stages);
  const double pipe_tp =
      pipeline_time_s(with_tp, s.num_micro_batches, s.schedule, s.virtual_stages);
  const double pipe_all =
      pipeline_time_s(with_pp, s.num_micro_batches, s.schedule, s.virtual_stages);

  Prediction out;
  out.bubble_fraction = bubble_fraction(compute, s.num_micro_batches, s.schedule, s.virtual_stages);
  out.exposed_communication_s.tp = pipe_tp - pipe_compute;
  out.exposed_communication_s.pp = pipe_all - pipe_tp;

  // Data parallelism and ZeRO, per pipeline rank; the slowest rank sets the step's tail.
  profiles::PathMetrics dp_link{};
  if (g.dp > 1) dp_link = links_.group(world, g.dp, g.tp);
  auto dp_time = [&](Collective c, double bytes) {
    return collective_factor(c) * collective_time_s(c, bytes, g.dp, dp_link);
  };
  const RuntimeRules runtime = runtime_rules(job.runtime);
  const double layer_parameters =
      static_cast<double>(count_parameters(m).transformer_layer.per_rank(s.tp));
  double tail = 0;
  out.memory_by_stage.resize(static_cast<std::size_t>(s.pp));
  for (int r = 0; r < s.pp; ++r) {
    const StageLoad& l = load[static_cast<std::size_t>(r)];
    MemoryBreakdown& mem = out.memory_by_stage[static_cast<std::size_t>(r)];
    mem = stage_memory(terms, job, s, r, l);

    double dp_exposed = 0;
    double zero_exposed = 0;
    // What communication can hide behind: a micro-batch's backward (and forward) pass on GPUs;
    // nothing on CPU ranks, where Gloo's reductions and copies use the compute's cores. The
    // runtime says which collectives a step issues and which pass hides each (runtime.hpp).
    const bool cpu = cluster_.device.kind == profiles::DeviceKind::kCpu;
    if (g.dp > 1) {
      DataParallelInput in;
      in.time_s = dp_time;
      in.num_parameters = l.num_parameters;
      in.backward_ungathered_num_parameters =
          backward_ungathered_num_parameters(job, l.lookup_num_parameters);
      in.forward_ungathered_num_parameters =
          forward_ungathered_num_parameters(job, m, g, l.lookup_num_parameters);
      in.lookup_mask_bytes = lookup_mask_bytes(job, m, g, l.lookup_num_parameters);
      in.layer_num_parameters = layer_parameters;
      in.forward_window_s = cpu ? 0 : with_tp[r].forward_s;
      in.backward_window_s = cpu ? 0 : with_tp[r].backward_s;
      in.num_micro_batches = s.num_micro_batches;
      in.element_bytes = state_element_bytes(job);
      in.bucket_bytes = options_.dp_bucket_bytes;
      in.overlap_slowdown = overlap_slowdown(cluster_);
      in.gloo = cpu;
      const DataParallelExposure exposed = runtime.exposure(job, g, in);
      dp_exposed = exposed.gradient_s;
      zero_exposed = exposed.parameter_s;
    }
    // AdamW over this rank's optimizer shard (costmodel/optimizer.hpp).
    double shard = l.num_parameters / (zero.shards_optimizer_states ? g.dp : 1);
    double optimizer_s = optimizer_step_s(
        {terms.optimizer_s_per_parameter, terms.optimizer_s_per_tensor}, shard, l.num_tensors);
    out.optimizer_s = std::max(out.optimizer_s, optimizer_s);
    out.exposed_communication_s.dp = std::max(out.exposed_communication_s.dp, dp_exposed);
    out.exposed_communication_s.zero = std::max(out.exposed_communication_s.zero, zero_exposed);
    // The gradients zeroed at the step's start (before the rank's first pass: with one stage
    // exactly, in a pipeline a rank's own delay).
    const double zero_grad_s =
        zeroed_gradient_parameters(g, cpu, l.num_parameters) * terms.zero_grad_s_per_parameter;
    tail = std::max(tail, dp_exposed + zero_exposed + optimizer_s + zero_grad_s);
    out.peak_memory_bytes = std::max(out.peak_memory_bytes, mem.total());
  }

  out.step_time_s = pipe_all + tail + terms.step_sync_s;
  set_throughput(m, cluster_, job, s, &out);
  return out;
}

void set_throughput(const profiles::ModelSpec& m, const profiles::Cluster& cluster, const Job& job,
                    const Strategy& s, Prediction* p) {
  p->samples_per_s = static_cast<double>(job.global_batch) / p->step_time_s;
  p->tokens_per_s = p->samples_per_s * static_cast<double>(job.seq_len);
  const double per_gpu = p->step_time_s * devices_in_use(cluster, s.world_size()) * 1e12;
  p->model_tflops_per_gpu = model_flops_per_step(m, job.global_batch, job.seq_len) / per_gpu;
  p->hardware_tflops_per_gpu =
      hardware_flops_per_step(m, job.global_batch, job.seq_len, s.recompute, s.attention,
                              runtime_rules(job.runtime).selective, recompute_share(s, m.layers)) /
      per_gpu;
  p->mfu = p->model_tflops_per_gpu / cluster.device.peak_tflops.of(job.precision);
}

}  // namespace loom::costmodel