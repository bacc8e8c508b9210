// Lowering a plan to per-chunk and per-rank costs: which entries of the layer sequence each model
// chunk of a partition holds, what it costs per micro-batch, and what each pipeline rank holds in
// total. The one home of the rules that map the layer sequence onto chunks, shared by the
// estimate, the simulator and the planner's partitioner:
// - A chunk (a StageRange) holds the embedding when it starts at entry 0, the head when it ends at
//   the last entry, and the transformer layers in between.
// - Chunk c runs on pipeline rank c % pp.
// - A tied LM head (an LM without labels whose head shares the word table) on another rank than
//   the embedding's (rank 0) keeps its own copy of the word table.
// - ZeRO-2/3's staging of every backward pass's gradients through one buffer is backward time on
//   the compute stream (zero_staging_bytes_per_parameter at the device's memory rate).
#pragma once

#include <vector>

#include "costmodel/estimate.hpp"
#include "costmodel/pipeline.hpp"
#include "costmodel/strategy.hpp"

namespace loom::costmodel {

// What one chunk of the layer sequence holds.
struct ChunkContent {
  int num_layers = 0;  // transformer layers
  bool embedding = false;
  bool head = false;
  bool operator==(const ChunkContent&) const = default;
};

// The content of `range` in a layer sequence of `sequence_length` entries
// (layer_sequence_length()).
ChunkContent chunk_content(const StageRange& range, int sequence_length);

// Parameters (on one rank, after tp) that the head's chunk on pipeline rank `pipeline_rank` holds
// beyond SequenceCosts::head: the word table's copy of a tied LM head away from the embedding.
double tied_head_copy_parameters(const profiles::ModelSpec& model, int tp, int pipeline_rank);

// One chunk of a plan, per micro-batch.
struct ChunkCost {
  int pipeline_rank = 0;
  ChunkContent content;
  StageTime compute_s;  // compute only (EntryTerms' *_compute_s), ZeRO staging in the backward
  StageTime with_tp_s;  // compute and tensor-parallel collectives (EntryCost's), staging included
  double num_parameters = 0;  // on one rank, after tp, the tied head's copy included
  double num_tensors = 0;     // the parameter tensors those are in (LayerParameters::tensors)
  // Of num_parameters: the embedding's tables only looked up (ParameterCounts::lookup_tables).
  double lookup_num_parameters = 0;
  double activation_bytes = 0;
};

// Every chunk of `stages` (pp * v of them, check_partition() passed) under `terms`
// (CostModel::step_terms() of the job and `strategy`), in chunk order.
std::vector<ChunkCost> lower_chunks(const profiles::ModelSpec& model, const Strategy& strategy,
                                    const StepTerms& terms, const std::vector<StageRange>& stages);

// What each pipeline rank holds: the sums of its chunks (`pp` ranks).
std::vector<StageLoad> stage_loads(const std::vector<ChunkCost>& chunks, int pp);

}  // namespace loom::costmodel
