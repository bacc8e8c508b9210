#include "costmodel/lowering.hpp"

#include <algorithm>

#include "costmodel/layers.hpp"

namespace loom::costmodel {

ChunkContent chunk_content(const StageRange& range, int sequence_length) {
  ChunkContent c;
  c.embedding = range.first_layer == 0;
  c.head = range.last_layer == sequence_length - 1;
  const int first = std::max(range.first_layer, 1);
  const int last = std::min(range.last_layer, sequence_length - 2);
  c.num_layers = std::max(0, last - first + 1);
  return c;
}

double tied_head_copy_parameters(const profiles::ModelSpec& model, int tp, int pipeline_rank) {
  if (model.num_labels || !model.tied_embeddings || pipeline_rank == 0) return 0;
  return static_cast<double>(model.vocab) * static_cast<double>(model.hidden) / tp;
}

std::vector<ChunkCost> lower_chunks(const profiles::ModelSpec& model, const Strategy& s,
                                    const StepTerms& terms, const std::vector<StageRange>& stages) {
  const int sequence_length = layer_sequence_length(model);
  const SequenceCosts& cost = terms.costs;
  const ParameterCounts counts = count_parameters(model);
  const double staging_bytes_per_parameter = zero_staging_bytes_per_parameter(s);
  std::vector<ChunkCost> out;
  out.reserve(stages.size());
  for (std::size_t c = 0; c < stages.size(); ++c) {
    ChunkCost k;
    k.pipeline_rank = static_cast<int>(c % static_cast<std::size_t>(s.pp));
    k.content = chunk_content(stages[c], sequence_length);
    const double layers = k.content.num_layers;
    double f = layers * terms.layer.forward_compute_s;
    double bw = layers * terms.layer.backward_compute_s;
    double tf = layers * cost.layer.forward_s;
    double tb = layers * cost.layer.backward_s;
    double p = layers * cost.layer.num_parameters;
    double a = layers * cost.layer.activation_bytes;
    double tensors = layers * static_cast<double>(counts.transformer_layer.tensors);
    // An entry layer (embedding or head) on this chunk adds its terms once.
    auto add_entry = [&](const auto& entry_terms, const auto& entry_cost) {
      f += entry_terms.forward_compute_s;
      bw += entry_terms.backward_compute_s;
      tf += entry_cost.forward_s;
      tb += entry_cost.backward_s;
      p += entry_cost.num_parameters;
      a += entry_cost.activation_bytes;
    };
    if (k.content.embedding) {
      add_entry(terms.embedding, cost.embedding);
      k.lookup_num_parameters = static_cast<double>(counts.lookup_tables.per_rank(s.tp));
      tensors += static_cast<double>(counts.embedding.tensors);
    }
    if (k.content.head) {
      add_entry(terms.head, cost.head);
      const double copy = tied_head_copy_parameters(model, s.tp, k.pipeline_rank);
      p += copy;
      tensors += static_cast<double>(counts.head.tensors) + (copy > 0 ? 1 : 0);
    }
    const double staging_s = p * staging_bytes_per_parameter / terms.memory_bytes_per_s;
    k.compute_s = {f, bw + staging_s};
    k.with_tp_s = {tf, tb + staging_s};
    k.num_parameters = p;
    k.num_tensors = tensors;
    k.activation_bytes = a;
    out.push_back(k);
  }
  return out;
}

std::vector<StageLoad> stage_loads(const std::vector<ChunkCost>& chunks, int pp) {
  std::vector<StageLoad> out(static_cast<std::size_t>(pp));
  for (const ChunkCost& k : chunks) {
    StageLoad& l = out[static_cast<std::size_t>(k.pipeline_rank)];
    l.num_parameters += k.num_parameters;
    l.lookup_num_parameters += k.lookup_num_parameters;
    l.activation_bytes += k.activation_bytes;
    l.num_layers += k.content.num_layers;
    l.num_tensors += k.num_tensors;
    l.largest_chunk_num_parameters = std::max(l.largest_chunk_num_parameters, k.num_parameters);
  }
  return out;
}

}  // namespace loom::costmodel
