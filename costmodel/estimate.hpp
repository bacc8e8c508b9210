// The analytical estimate of one training step: time, throughput, FLOP rates and memory per rank
// for a model, a cluster, a job and a strategy with its stage partition. Pure and fast (a few
// microseconds per call once a CostModel exists), so the planner can evaluate every strategy.
#pragma once

#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "costmodel/comm.hpp"
#include "costmodel/measured_profile.hpp"
#include "costmodel/strategy.hpp"
#include "costmodel/terms.hpp"
#include "profiles/cluster.hpp"
#include "profiles/model_spec.hpp"

namespace loom::costmodel {

// The parameters whose fp32 gradients loom train zeroes on a rank at the start of every step: its
// flat gradient buffer with many ranks (its dp shard's with ZeRO-2/3), the gradients in place on
// one CPU rank; none on one GPU rank, whose gradients are set to none instead.
double zeroed_gradient_parameters(const Strategy& strategy, bool cpu, double rank_parameters);

// Memory traffic per parameter that every backward pass of Loom's executor adds with ZeRO-2/3
// and dp > 1 (0 otherwise): each fp32 gradient copied into the staging buffer (a read and a
// write) and the rank's 1/dp of it added into its gradient shard (two reads and a write).
double zero_staging_bytes_per_parameter(const Strategy& strategy);

// The devices a `world`-rank job computes on: its ranks times each rank's threads (on CPU
// clusters a device is one core, and a rank of fewer ranks than cores runs on several). Model
// and hardware TFLOP/s per device, and MFU, divide by it, so that one rank on two cores is not
// credited with two cores' work per core.
int devices_in_use(const profiles::Cluster& cluster, int world);

// The rates of a step of `p->step_time_s`: samples and tokens per second, model and hardware
// TFLOP/s per device in use, MFU. One home for the estimate and the simulator.
void set_throughput(const profiles::ModelSpec& model, const profiles::Cluster& cluster,
                    const Job& job, const Strategy& strategy, Prediction* p);

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
  // The same with layer figures taken from a measured profile (measured_profile.hpp); nullptr
  // goes back to the roofline. The profile's links go into the cluster instead
  // (cluster_with_profile_links()).
  CostModel with_profile(std::shared_ptr<const MeasuredProfile> measured) const;
  // The same cluster, options, mapping and measured profile for another model (a variant of this
  // one: the profile's layer figures are kept).
  CostModel with_model(profiles::ModelSpec model) const;
  const MeasuredProfile* measured_profile() const { return profile_.get(); }
  // Where each entry kind's figures come from for this job and strategy, one line per kind
  // ("encoder layer: measured (b=4 s=128 tp=1 threads=2)"); empty without a measured profile.
  std::vector<std::string> profile_notes(const Job& job, const Strategy& strategy) const;
  // costmodel::threads_per_rank() of this model's cluster.
  int threads_per_rank(int world) const;
  // Measured / modelled time of a collective from the profile's link measurements (1 without).
  double collective_factor(Collective collective) const {
    return costmodel::collective_factor(profile_.get(), collective);
  }
  const std::vector<int>& device_of_rank() const { return links_.device_of_rank(); }

  // The per-micro-batch terms of `job` under `strategy`: everything the estimate, the stage
  // memory, the partitioner and the simulator charge. Computed once per strategy and handed to
  // them (the overloads below that take a StepTerms); the others compute it again.
  StepTerms step_terms(const Job& job, const Strategy& strategy) const;
  // step_terms().costs: what the layer-to-stage partition balances.
  SequenceCosts sequence_costs(const Job& job, const Strategy& strategy) const;
  // The links groups of ranks get (what estimate() charges collectives with).
  const GroupLinks& group_links() const { return links_; }
  // Memory of pipeline rank `pipeline_rank` holding `load` (what estimate() reports per stage).
  MemoryBreakdown stage_memory(const Job& job, const Strategy& strategy, int pipeline_rank,
                               const StageLoad& load) const;
  // The same from the strategy's terms, for callers that evaluate many loads of one strategy.
  MemoryBreakdown stage_memory(const StepTerms& terms, const Job& job, const Strategy& strategy,
                               int pipeline_rank, const StageLoad& load) const;

  // Requires check_strategy() and check_partition() to pass (throws std::invalid_argument with
  // their message otherwise), and a device rate for the job's precision (InputError).
  Prediction estimate(const Job& job, const Strategy& strategy,
                      const std::vector<StageRange>& stages) const;
  // The same from the strategy's terms (step_terms(job, strategy)).
  Prediction estimate(const StepTerms& terms, const Job& job, const Strategy& strategy,
                      const std::vector<StageRange>& stages) const;

 private:
  CostModel(profiles::ModelSpec model, profiles::Cluster cluster, CostOptions options,
            std::shared_ptr<const profiles::Topology> topology, std::vector<int> device_of_rank);
  // estimate()'s checks (check_strategy, check_partition) and, once they pass, its arithmetic.
  void check_estimate(const Job& job, const Strategy& strategy,
                      const std::vector<StageRange>& stages) const;
  Prediction predict(const StepTerms& terms, const Job& job, const Strategy& strategy,
                     const std::vector<StageRange>& stages) const;

  profiles::ModelSpec model_;
  profiles::Cluster cluster_;
  CostOptions options_;
  GroupLinks links_;
  std::shared_ptr<const MeasuredProfile> profile_;
};

}  // namespace loom::costmodel
