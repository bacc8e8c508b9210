// The per-micro-batch terms of one (job, strategy) and the values the estimate is made of.
//
// compute_terms() gives the compute and tensor-parallel time per entry kind of the layer
// sequence, pipeline transfers, activation bytes and the optimizer's rates; CostModel::
// step_terms() hands them out once per strategy, and the estimate, the stage memory, the
// partitioner and the simulator all read that one value, so that what one charges the others
// charge alike. The value types of a prediction (MemoryBreakdown, Prediction, StageLoad,
// SequenceCosts, StepTerms) live here too, below the CostModel that fills them.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "costmodel/comm.hpp"
#include "costmodel/compute.hpp"
#include "costmodel/measured_profile.hpp"
#include "costmodel/optimizer.hpp"
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
// One point the terms ask a measured profile for: an entry kind at the rank's shape, named as
// coverage lines name it ("embedding", "encoder layer", "decoder layer (not recomputed)", "head").
struct ProfileQuery {
  std::string what;
  LayerQuery query;
};

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
  // The points these terms take from a measured profile when one is given, whether or not one is
  // (what `loom profile --for` measures): embedding, layer, the plain layer when only some layers
  // recompute, head.
  std::vector<ProfileQuery> profile_queries;
};

// loom train's one all-reduce over the world per step: the loss and a stop vote of
// kStepStopSignalSlots slots (the ranks that received signal s count in slot s - 1), as doubles.
constexpr int kStepStopSignalSlots = 64;
constexpr double kStepStatsBytes = 8.0 * (1 + kStepStopSignalSlots);

// CPU threads each rank of a `world`-rank job runs with: on CPU clusters a device is one core and
// the ranks of a node share its cores equally (ranks placed node-major); 1 on GPU clusters. The
// executor sets LibTorch's threads from it for CPU plans.
int threads_per_rank(const profiles::Cluster& cluster, int world);

// What compute_terms() derives for one (job, strategy); StepTerms is what callers read of it.
struct Terms {
  SequenceCosts costs;
  double p2p_s = 0;
  double backward_temporary = 0;
  double rate_memory_bytes_per_s = 0;
  // Compute only, without tensor-parallel collectives (for the bubble and the exposed split).
  LayerTime layer, embed, head;
  // The same split for the simulator (step_terms()).
  EntryTerms layer_terms, embed_terms, head_terms;
  double p2p_bytes = 0;
  double p2p_all_gather_bytes = 0;
  int threads = 1;                       // CPU threads per rank (1 on GPUs)
  OptimizerStepRates optimizer;          // AdamW step time per parameter and tensor of a shard
  double step_sync_s = 0;                // the step's scalar all-reduces (StepTerms)
  double zero_grad_s_per_parameter = 0;  // StepTerms
  Provenance how_layer = Provenance::kRoofline;
  Provenance how_embedding = Provenance::kRoofline;
  Provenance how_head = Provenance::kRoofline;
  std::vector<ProfileQuery> profile_queries;  // StepTerms
};

// The terms of `job` under `s` on `cluster`, with the profile's measured layers where it has
// them (nullptr: the roofline and the formulas alone).
Terms compute_terms(const profiles::ModelSpec& m, const CostOptions& options,
                    const GroupLinks& links, const profiles::Cluster& cluster,
                    const MeasuredProfile* measured, const Job& job, const Strategy& s);

// The simulator's view of `t`.
StepTerms step_terms_of(const Terms& t);

}  // namespace loom::costmodel
