// The analytical estimate of one training step: time, throughput, FLOP rates and memory per rank
// for a model, a cluster, a job and a strategy with its stage partition. Pure and fast (a few
// microseconds per call once a CostModel exists), so the planner can evaluate every strategy.
#pragma once

#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

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

struct MemoryBreakdown {
  double parameters = 0;
  double gradients = 0;
  double optimizer = 0;
  double activations = 0;
  double buffers = 0;
  double total() const { return parameters + gradients + optimizer + activations + buffers; }
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
  double parameters = 0;   // parameters on this rank (after tp), all chunks
  double activations = 0;  // activation bytes one micro-batch keeps for backward, all chunks
  double layers = 0;       // transformer layers on this rank
  double largest_chunk_parameters = 0;
};

// Per-micro-batch cost of each kind of entry of the layer sequence on one rank, tensor-parallel
// collectives included (what the layer-to-stage partition balances).
struct EntryCost {
  double forward_s = 0;
  double backward_s = 0;   // with recomputation
  double parameters = 0;   // on one rank, after tp
  double activations = 0;  // kept for backward, one micro-batch
};
struct SequenceCosts {
  EntryCost embedding;
  EntryCost layer;  // one transformer layer
  EntryCost head;   // a tied LM head away from the embedding adds its word table (not included)
};

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
  const std::vector<int>& device_of_rank() const { return links_.device_of_rank(); }

  SequenceCosts sequence_costs(const Job& job, const Strategy& strategy) const;
  // Memory of pipeline rank `pipeline_rank` holding `load` (what estimate() reports per stage).
  MemoryBreakdown stage_memory(const Job& job, const Strategy& strategy, int pipeline_rank,
                               const StageLoad& load) const;

  // Requires check_strategy() and check_partition() to pass (throws std::invalid_argument with
  // their message otherwise), and a device rate for the job's precision (InputError).
  Prediction estimate(const Job& job, const Strategy& strategy,
                      const std::vector<StageRange>& stages) const;

 private:
  CostModel(profiles::ModelSpec model, profiles::Cluster cluster, CostOptions options,
            std::shared_ptr<const profiles::Topology> topology, std::vector<int> device_of_rank);
  MemoryBreakdown stage_memory_from(double recompute_buffer, const Job& job,
                                    const Strategy& strategy, int pipeline_rank,
                                    const StageLoad& load) const;

  profiles::ModelSpec model_;
  profiles::Cluster cluster_;
  CostOptions options_;
  GroupLinks links_;
};

}  // namespace loom::costmodel
