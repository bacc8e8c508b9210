// The analytical estimate of one training step: time, throughput, FLOP rates and memory per rank
// for a model, a cluster, a job and a strategy with its stage partition. Pure and fast (a few
// microseconds per call once a CostModel exists), so the planner can evaluate every strategy.
#pragma once

#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "costmodel/calibration.hpp"
#include "costmodel/comm.hpp"
#include "costmodel/compute.hpp"
#include "costmodel/strategy.hpp"
#include "profiles/cluster.hpp"
#include "profiles/model_spec.hpp"

namespace loom::costmodel {

struct CostOptions {
  EfficiencyDefaults efficiency;
  double dp_bucket_bytes = 25.0 * 1024 * 1024;  // gradient bucket (PyTorch DDP's default 25 MiB)
  bool attention_scores = true;                 // false: fused attention keeps no s^2 score matrix
  bool operator==(const CostOptions& o) const = default;
};

nlohmann::json cost_options_to_json(const CostOptions& options);

// Bytes one rank holds at the step's peak, by kind (the "memory_bytes_by_stage" objects of
// loom-plan/1 keep the unit-free JSON names: "parameters", "gradients", ...).
struct MemoryBreakdown {
  double parameter_bytes = 0;
  double gradient_bytes = 0;
  double optimizer_bytes = 0;
  double activation_bytes = 0;
  // Working memory at the step's peak beyond kept activations: gradient buckets, ZeRO-3 gathers,
  // one layer's backward temporaries, or the optimizer step's temporaries when those are larger.
  double buffer_bytes = 0;
  // What the process holds beyond its tensors on a GPU (process_memory.hpp; 0 on CPUs): JSON
  // "cuda_context", "workspaces", "nccl_buffers", "fragmentation".
  double cuda_context_bytes = 0;
  double workspace_bytes = 0;
  double nccl_buffer_bytes = 0;
  double fragmentation_bytes = 0;
  // What the caching allocator hands out (what its peak-allocated figure measures): the tensors
  // and the cuBLAS workspaces it allocates.
  double tensor_bytes() const {
    return parameter_bytes + gradient_bytes + optimizer_bytes + activation_bytes + buffer_bytes +
           workspace_bytes;
  }
  double process_bytes() const {
    return cuda_context_bytes + nccl_buffer_bytes + fragmentation_bytes;
  }
  // What the device shows in use.
  double total() const { return tensor_bytes() + process_bytes(); }
};

struct ExposedCommunication {
  double dp = 0;    // gradient reduction not hidden behind the backward pass
  double tp = 0;    // tensor-parallel collectives (on the critical path)
  double pp = 0;    // send/recv between stages
  double zero = 0;  // ZeRO parameter gathers
};

struct Prediction {
  double step_time_s = 0;
  double samples_per_s = 0;
  double tokens_per_s = 0;
  double model_tflops_per_gpu = 0;
  double hardware_tflops_per_gpu = 0;
  double mfu = 0;
  double peak_memory_bytes = 0;
  std::vector<MemoryBreakdown> memory_by_stage;  // one per pipeline rank
  double bubble_fraction = 0;
  ExposedCommunication exposed_communication_s;
  double optimizer_s = 0;
  std::string source = "analytical";
};

// The `predicted` object of loom-plan/1 (integers for byte counts).
nlohmann::json prediction_to_json(const Prediction& prediction);

// What one pipeline rank holds, summed over its chunks: the inputs of its memory.
struct StageLoad {
  double num_parameters = 0;    // parameters on this rank (after tp), all chunks
  double activation_bytes = 0;  // what one micro-batch keeps for backward, all chunks
  double num_layers = 0;        // transformer layers on this rank
  double num_tensors = 0;       // parameter tensors on this rank (LayerParameters::tensors)
  double largest_chunk_num_parameters = 0;
  double lookup_num_parameters = 0;  // of num_parameters, embedding tables only looked up
};

// Per-micro-batch cost of each kind of entry of the layer sequence on one rank, tensor-parallel
// collectives included (what the layer-to-stage partition balances).
struct EntryCost {
  double forward_s = 0;
  double backward_s = 0;        // with recomputation
  double num_parameters = 0;    // on one rank, after tp
  double activation_bytes = 0;  // kept for backward, one micro-batch
};
struct SequenceCosts {
  EntryCost embedding;
  EntryCost layer;  // one transformer layer
  EntryCost head;   // a tied LM head away from the embedding adds its word table (not included)
};

// `count` collectives of one kind over the tensor-parallel group per micro-batch, each over a
// buffer of `bytes` (the whole buffer, as collective_time_s() takes it: an all-gather's output, a
// reduce-scatter's input).
struct TensorParallelCollective {
  Collective collective = Collective::kAllReduce;
  double count = 0;
  double bytes = 0;
  bool operator==(const TensorParallelCollective&) const = default;
};
// What one pass of an entry runs over the tensor-parallel group (empty when tp = 1). Without
// sequence parallelism: all-reduces (Megatron's f and g). With it, each all-reduce of a layer
// becomes an all-gather before the column-parallel GEMM and a reduce-scatter after the row-parallel
// one, and the backward pass mirrors them.
using TensorParallelCollectives = std::vector<TensorParallelCollective>;

// The parts EntryCost sums, kept apart for the simulator, which plays compute and communication
// as separate tasks: forward_s = forward_compute_s + the time of every collective of forward_tp
// over the tensor-parallel group (count x collective_time_s of its bytes), and likewise backward.
struct EntryTerms {
  double forward_compute_s = 0;
  double backward_compute_s = 0;  // recomputation included
  TensorParallelCollectives forward_tp;
  TensorParallelCollectives backward_tp;
};

// Everything per micro-batch that estimate() charges, split into compute and communication volume.
struct StepTerms {
  SequenceCosts costs;  // what sequence_costs() returns
  EntryTerms embedding;
  EntryTerms layer;
  EntryTerms head;
  // One pipeline transfer between stages per micro-batch (an activation forward, its gradient
  // backward): every tensor-parallel rank sends p2p_bytes, then the receiving group all-gathers
  // p2p_all_gather_bytes over tp (0 when there is no gather).
  double p2p_bytes = 0;
  double p2p_all_gather_bytes = 0;
  double p2p_s = 0;  // one such transfer alone (what the estimate adds to each pass)
  // One layer's backward temporaries beyond its kept activations (a recomputed layer's
  // activations; on GPUs the attention core's gradients): layer_backward_temporary_bytes().
  double backward_temporary_bytes = 0;
  double memory_bytes_per_s = 0;         // the device's effective memory bandwidth
  double optimizer_s_per_parameter = 0;  // AdamW step per parameter (measured or bandwidth-bound)
  double optimizer_s_per_tensor = 0;     // its host issue per tensor (costmodel/optimizer.hpp)
  // After the optimizer, every step: loom train's scalar all-reduces (the gradient norm over dp
  // with ZeRO, tp and pp; the step's statistics over the world), latency-bound, on groups of more
  // than one.
  double step_sync_s = 0;
  // Zeroing one fp32 gradient element at the step's start (zeroed_gradient_parameters()).
  double zero_grad_s_per_parameter = 0;
};

// The parameters whose fp32 gradients loom train zeroes on a rank at the start of every step: its
// flat gradient buffer with many ranks (its dp shard's with ZeRO-2/3), the gradients in place on
// one CPU rank; none on one GPU rank, whose gradients are set to none instead.
double zeroed_gradient_parameters(const Strategy& strategy, bool cpu, double rank_parameters);

// Memory traffic per parameter that every backward pass of Loom's executor adds with ZeRO-2/3
// and dp > 1 (0 otherwise): each fp32 gradient copied into the staging buffer (a read and a
// write) and the rank's 1/dp of it added into its gradient shard (two reads and a write).
double zero_staging_bytes_per_parameter(const Strategy& strategy);

// loom train's one all-reduce over the world per step: the loss and a stop vote of
// kStepStopSignalSlots slots (the ranks that received signal s count in slot s - 1), as doubles.
constexpr int kStepStopSignalSlots = 64;
constexpr double kStepStatsBytes = 8.0 * (1 + kStepStopSignalSlots);

// CPU threads each rank of a `world`-rank job runs with: on CPU clusters a device is one core and
// the ranks of a node share its cores equally (ranks placed node-major); 1 on GPU clusters. The
// executor sets LibTorch's threads from it for CPU plans.
int threads_per_rank(const profiles::Cluster& cluster, int world);

// The devices a `world`-rank job computes on: its ranks times each rank's threads (on CPU
// clusters a device is one core, and a rank of fewer ranks than cores runs on several). Model
// and hardware TFLOP/s per device, and MFU, divide by it, so that one rank on two cores is not
// credited with two cores' work per core.
int devices_in_use(const profiles::Cluster& cluster, int world);

class CostModel {
 public:
  // Builds the topology of `cluster` and maps rank r to device r (node-major), Megatron's order.
  CostModel(profiles::ModelSpec model, const profiles::Cluster& cluster, CostOptions options = {});
  // As above with an explicit rank-to-device mapping (device indices of the cluster).
  CostModel(profiles::ModelSpec model, profiles::Cluster cluster, CostOptions options,
            std::vector<int> device_of_rank);

  const profiles::ModelSpec& model() const { return model_; }
  const profiles::Cluster& cluster() const { return cluster_; }
  const CostOptions& options() const { return options_; }
  const profiles::Topology& topology() const { return links_.topology(); }

  // The same model and options over the same topology with another rank-to-device mapping.
  CostModel with_mapping(std::vector<int> device_of_rank) const;
  // The same with layer figures taken from a measured profile (calibration.hpp); nullptr goes
  // back to the roofline. Links are calibrated on the cluster instead (calibrated_cluster()).
  CostModel with_calibration(std::shared_ptr<const Calibration> calibration) const;
  // The same cluster, options, mapping and calibration for another model (a variant of this one:
  // the calibration's layer figures are kept).
  CostModel with_model(profiles::ModelSpec model) const;
  const Calibration* calibration() const { return calibration_.get(); }
  // Where each entry kind's figures come from for this job and strategy, one line per kind
  // ("encoder layer: measured (b=4 s=128 tp=1 threads=2)"); empty without a calibration.
  std::vector<std::string> calibration_notes(const Job& job, const Strategy& strategy) const;
  // costmodel::threads_per_rank() of this model's cluster.
  int threads_per_rank(int world) const;
  // Measured / modelled time of a collective from the calibration's link measurements (1 without).
  double collective_factor(Collective collective) const {
    return calibration_ ? calibration_->collective_factor(collective) : 1.0;
  }
  const std::vector<int>& device_of_rank() const { return links_.device_of_rank(); }

  SequenceCosts sequence_costs(const Job& job, const Strategy& strategy) const;
  // The terms behind sequence_costs() and estimate(), for the simulator.
  StepTerms step_terms(const Job& job, const Strategy& strategy) const;
  // The links groups of ranks get (what estimate() charges collectives with).
  const GroupLinks& group_links() const { return links_; }
  // Memory of pipeline rank `pipeline_rank` holding `load` (what estimate() reports per stage).
  MemoryBreakdown stage_memory(const Job& job, const Strategy& strategy, int pipeline_rank,
                               const StageLoad& load) const;
  // The same with one layer's backward temporaries given (backward_temporary_bytes(job, strategy)),
  // for callers that evaluate many loads of one strategy.
  MemoryBreakdown stage_memory_from(double backward_temporary, const Job& job,
                                    const Strategy& strategy, int pipeline_rank,
                                    const StageLoad& load) const;
  double backward_temporary_bytes(const Job& job, const Strategy& strategy) const;

  // Requires check_strategy() and check_partition() to pass (throws std::invalid_argument with
  // their message otherwise), and a device rate for the job's precision (InputError).
  Prediction estimate(const Job& job, const Strategy& strategy,
                      const std::vector<StageRange>& stages) const;

 private:
  CostModel(profiles::ModelSpec model, profiles::Cluster cluster, CostOptions options,
            std::shared_ptr<const profiles::Topology> topology, std::vector<int> device_of_rank);

  profiles::ModelSpec model_;
  profiles::Cluster cluster_;
  CostOptions options_;
  GroupLinks links_;
  std::shared_ptr<const Calibration> calibration_;
};

}  // namespace loom::costmodel
