// The per-micro-batch terms of one (job, strategy): compute and tensor-parallel time per entry
// kind of the layer sequence, pipeline transfers, activation bytes, the optimizer's rates. The
// estimate, the stage memory, the partitioner and the simulator (through StepTerms) all read
// these, so that what one charges the others charge alike.
#pragma once

#include "costmodel/compute.hpp"
#include "costmodel/estimate.hpp"
#include "costmodel/optimizer.hpp"

namespace loom::costmodel {

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
  Calibrated how_layer = Calibrated::kRoofline;
  Calibrated how_embedding = Calibrated::kRoofline;
  Calibrated how_head = Calibrated::kRoofline;
};

// The terms of `job` under `s` on `cluster`, with the calibration's measured layers where it has
// them (nullptr: the roofline and the formulas alone).
Terms compute_terms(const profiles::ModelSpec& m, const CostOptions& options,
                    const GroupLinks& links, const profiles::Cluster& cluster,
                    const Calibration* calibration, const Job& job, const Strategy& s);

// The simulator's view of `t`.
StepTerms step_terms_of(const Terms& t);

}  // namespace loom::costmodel
