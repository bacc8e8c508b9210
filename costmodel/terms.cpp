#include "costmodel/terms.hpp"

#include <algorithm>
#include <cmath>

#include "costmodel/context_parallel.hpp"
#include "costmodel/layers.hpp"
#include "costmodel/measured_profile.hpp"
#include "costmodel/memory.hpp"
#include "costmodel/optimizer.hpp"
#include "costmodel/runtime.hpp"
#include "costmodel/tp_overlap.hpp"
#include "costmodel/zero.hpp"

namespace loom::costmodel {

using profiles::Family;

namespace {

struct MeasuredEntry {
  Provenance how = Provenance::kRoofline;
  bool tp_communication = false;  // the time includes the entry's tensor-parallel all-reduces
};

// Replaces the roofline time and the formula's activation bytes of one entry kind by what the
// measured profile answers (measured_profile.hpp): measured or interpolated figures as they are; a
// scaled answer multiplies the roofline and formula at the query by measured / modelled at the
// nearest measured shape.
template <typename Roofline, typename Formula>
MeasuredEntry measured_entry(const MeasuredProfile& measured, const LayerQuery& query,
                             const Roofline& roofline, const Formula& formula, LayerTime* time,
                             double* activation_bytes) {
  const LayerAnswer a = measured.layer(query);
  switch (a.how) {
    case Provenance::kRoofline:
      break;
    case Provenance::kMeasured:
    case Provenance::kInterpolated:
      time->forward_s = a.forward_s;
      time->backward_s = a.backward_s;  // recomputation included: the point used it
      time->recompute_s = 0;
      *activation_bytes = a.activation_bytes;
      break;
    case Provenance::kScaled: {
      const LayerTime at = roofline(a.at);
      const double fwd = at.forward_s > 0 ? a.forward_s / at.forward_s : 1;
      const double bwd =
          at.backward_s + at.recompute_s > 0 ? a.backward_s / (at.backward_s + at.recompute_s) : 1;
      time->forward_s *= fwd;
      time->backward_s *= bwd;
      time->recompute_s *= a.at.recompute == query.recompute ? bwd : fwd;
      const double modelled = formula(a.at);
      if (modelled > 0) *activation_bytes *= a.activation_bytes / modelled;
      break;
    }
  }
  return {a.how, a.tp_communication};
}

// What every part of compute_terms() reads: the model, the cluster, the job and the strategy.
struct TermsInput {
  const profiles::ModelSpec& m;
  const CostOptions& options;
  const GroupLinks& links;
  const profiles::Cluster& cluster;
  const MeasuredProfile* measured;
  const Job& job;
  const Strategy& s;
  int world = 1;
  int e = 2;     // element bytes of the job's precision
  double b = 1;  // micro-batch
  // One rank's tokens of a sample: the sequence, or its 1/cp share with context parallelism.
  std::int64_t seq_len = 1;
  double seq = 1;         // seq_len as a double
  double h = 1;           // hidden size
  double v = 1;           // vocabulary
  bool autocast = false;  // 16-bit compute on fp32 weights (RuntimeRules::autocast)
  // Measured / modelled time of a collective (1 without a profile's link measurements).
  double factor(Collective c) const { return collective_factor(measured, c); }
};

// The rank's device rates (scaled by its CPU threads), and the per-parameter optimizer and
// gradient-zeroing times. Returns the rates of one device (one core on CPUs).
DeviceRates set_rates(const TermsInput& in, Terms& t) {
  const DeviceRates core_rates =
      device_rates(in.cluster.device, in.job.precision, in.options.efficiency,
                   runtime_rules(in.job.runtime).attention_kernel);
  t.threads = threads_per_rank(in.cluster, in.world);
  const DeviceRates rates = scaled_rates(core_rates, t.threads);
  t.rate_memory_bytes_per_s = rates.memory_bytes_per_s;
  t.zero_grad_s_per_parameter = 4 / rates.memory_bytes_per_s;  // one fp32 write
  // A profile measures Loom's executor's step: one rank with torch::optim::AdamW, many over flat
  // buffers.
  t.optimizer = optimizer_step_rates(
      in.job.optimizer_kernels, rates,
      in.measured != nullptr ? in.measured->optimizer_s_per_parameter(t.threads, in.world > 1)
                             : std::nullopt);
  return core_rates;
}

// Megatron's scatter-gather between stages: each tensor-parallel rank sends 1/tp of the
// activation and the receiving group all-gathers it over the tp link (with sequence parallelism
// the activation is already split).
void set_pipeline_transfer(const TermsInput& in, double act_bytes, Terms& t) {
  const Strategy& s = in.s;
  if (s.pp <= 1) return;
  t.p2p_bytes = act_bytes / s.tp;
  if (s.tp > 1 && !s.sequence_parallel) t.p2p_all_gather_bytes = act_bytes;
  const profiles::PathMetrics pp_link = in.links.group(in.world, s.pp, s.tp * gradient_view(s).dp);
  t.p2p_s = in.factor(Collective::kP2p) *
            collective_time_s(Collective::kP2p, act_bytes / s.tp, 2, pp_link);
  if (s.tp > 1 && !s.sequence_parallel) {
    t.p2p_s += in.factor(Collective::kAllGather) *
               collective_time_s(Collective::kAllGather, act_bytes, s.tp,
                                 in.links.group(in.world, s.tp, 1));
  }
}

// Loom's executor sums a few scalars per step, each a latency-bound all-reduce: the gradient norm
// over dp (when each rank holds a shard), tp and pp, and then one all-reduce over the world of
// the loss and the stop vote (kStepStatsBytes).
double step_sync_s(const TermsInput& in) {
  const Strategy s = gradient_view(in.s);  // the gradient norm spans dp x cp ranks
  const int world = in.world;
  const GroupLinks& links = in.links;
  auto scalar_s = [&](double bytes, int ranks, const profiles::PathMetrics& link) {
    return in.factor(Collective::kAllReduce) *
           collective_time_s(Collective::kAllReduce, bytes, ranks, link);
  };
  double out = 0;
  if (s.dp > 1 && zero_policy(s.zero).reduces_norm_over_dp) {
    out += scalar_s(8, s.dp, links.group(world, s.dp, s.tp));
  }
  if (s.tp > 1) out += scalar_s(8, s.tp, links.group(world, s.tp, 1));
  if (s.pp > 1) out += scalar_s(8, s.pp, links.group(world, s.pp, s.tp * s.dp));
  if (world > 1) out += scalar_s(kStepStatsBytes, world, links.group(world, world, 1));
  return out;
}

// The s x s score matrix is kept only by the unfused (math) attention, and only while the cost
// options count it.
bool keeps_scores(const TermsInput& in) {
  return in.s.attention == Attention::kMath && in.options.attention_scores;
}

// The compute shape of one micro-batch of `micro_batch` samples on `tp` ranks.
LayerShape layer_shape(const TermsInput& in, std::int64_t micro_batch, std::int64_t seq_len, int tp,
                       Recompute recompute) {
  LayerShape x{micro_batch, seq_len, tp, in.e, recompute};
  x.attention = in.s.attention;
  x.sequence_parallel = in.s.sequence_parallel;
  const RuntimeRules rules = runtime_rules(in.job.runtime);
  x.fusions = kernel_fusions(in.job);
  x.host_floor = rules.host_floor;
  x.autocast = in.autocast;
  x.selective = rules.selective;
  x.stage_layers = std::max<std::int64_t>(1, (in.m.layers + in.s.pp - 1) / in.s.pp);
  x.cp = in.s.cp;
  if (rules.caches_fp8_weights) {
    x.fp8_weight_cast_share = 1.0 / static_cast<double>(in.s.num_micro_batches);
  }
  return x;
}

// Activation bytes per micro-batch each entry kind keeps for backward.
struct EntryActivations {
  double layer = 0;
  double embed = 0;
  double head = 0;
};

ActivationShape activation_shape(const TermsInput& in, std::int64_t micro_batch,
                                 std::int64_t seq_len) {
  ActivationShape a{seq_len,         micro_batch, in.m.hidden,   in.m.heads,
                    in.m.ffn_hidden, in.e,        in.m.kv_heads, in.m.gated_mlp};
  a.autocast = in.autocast;
  a.selective = runtime_rules(in.job.runtime).selective;
  a.activation_chain =
      in.m.activation == profiles::Activation::kGeluNew && !kernel_fusions(in.job).activation;
  a.dropout = model_dropout(in.m);
  // Every engine Loom plans fp8 for runs TransformerEngine's linear layers.
  a.fp8_linear_inputs = in.job.precision == Precision::kFp8;
  return a;
}

// What the embeddings keep: an encoder's LayerNorm input (fp32 under autocast) and dropout mask;
// a decoder's dropout mask (none in the Llama family).
double embedding_activation_bytes(const TermsInput& in, std::int64_t micro_batch,
                                  std::int64_t seq_len, int tp) {
  const double x = static_cast<double>(micro_batch) * static_cast<double>(seq_len) * in.h;
  const double norm_input = in.autocast ? 4 : in.e;
  const double mask = model_dropout(in.m) ? 1 : 0;
  return (in.m.family == Family::kEncoder ? (norm_input + mask) * x : mask * x) /
         (in.s.sequence_parallel ? tp : 1);
}

// The formulas' activations, and one layer's backward temporaries (recomputed activations).
EntryActivations activation_terms(const TermsInput& in, Terms& t) {
  const profiles::ModelSpec& m = in.m;
  const Strategy& s = in.s;
  const double sp_split = s.sequence_parallel ? s.tp : 1;
  const int e = in.e;
  EntryActivations a;
  const ActivationShape ashape = activation_shape(in, s.micro_batch, in.seq_len);
  a.layer = transformer_layer_activation_bytes(ashape, s.tp, s.sequence_parallel, s.recompute,
                                               keeps_scores(in));
  const double sbh = in.b * in.seq * in.h;
  a.embed = embedding_activation_bytes(in, s.micro_batch, in.seq_len, s.tp);
  a.head = 3 * e * in.b * in.h;
  if (!m.num_labels) {
    a.head = (m.family == Family::kEncoder ? 3 : 1) * e * sbh / sp_split +
             head_kept_bytes_per_logit(in.job) * in.b * in.seq * in.v / s.tp;
  }
  if (in.cluster.device.kind == profiles::DeviceKind::kGpu) {
    t.backward_temporary = layer_backward_temporary_bytes(ashape, s.tp, s.sequence_parallel,
                                                          s.recompute, keeps_scores(in));
  }
  if (s.recompute != Recompute::kNone) {
    t.backward_temporary += transformer_layer_activation_bytes(ashape, s.tp, s.sequence_parallel,
                                                               Recompute::kNone, keeps_scores(in)) -
                            a.layer;
  }
  return a;
}

struct EntryMeasurements {
  MeasuredEntry layer;
  MeasuredEntry embed;
  MeasuredEntry head;
};

// The profile points of the three entry kinds: the rank's micro-batch, tokens (1/cp of the
// sequence with context parallelism), tp shard, recomputation and threads; embeddings and heads
// have no attention core, so their queries say math.
struct EntryQueries {
  LayerQuery embedding, layer, head;
};

EntryQueries entry_queries(const TermsInput& in, int threads) {
  const Strategy& s = in.s;
  EntryQueries out;
  out.layer = {in.m.family == Family::kEncoder ? profiles::LayerKind::kEncoderLayer
                                               : profiles::LayerKind::kDecoderLayer,
               s.micro_batch,
               in.seq_len,
               s.tp,
               to_string(s.recompute),
               threads,
               to_string(s.attention)};
  out.embedding = out.layer;
  out.embedding.kind = profiles::LayerKind::kEmbedding;
  out.embedding.attention = "math";
  out.head = out.embedding;
  out.head.kind = profiles::LayerKind::kHead;
  return out;
}

std::string layer_name(const profiles::ModelSpec& m) {
  return m.family == Family::kEncoder ? "encoder layer" : "decoder layer";
}

// Replaces the roofline times and formula activations of every entry kind by what the
// profile answers (measured_entry()), and scales a layer's backward temporaries alike.
EntryMeasurements measured_entries(const TermsInput& in, const DeviceRates& core_rates, Terms& t,
                                   EntryActivations& act) {
  const profiles::ModelSpec& m = in.m;
  const Strategy& s = in.s;
  const double h = in.h;
  const double v = in.v;
  const int ek = in.e;
  const double formula_layer_act = act.layer;
  const auto embed_formula = [&](const LayerQuery& q) {
    return embedding_activation_bytes(in, q.micro_batch, q.seq_len, q.tp);
  };
  const auto head_formula = [&](const LayerQuery& q) {
    const double qb = static_cast<double>(q.micro_batch);
    const double qs = static_cast<double>(q.seq_len);
    if (m.num_labels) return 3.0 * ek * qb * h;
    return (m.family == Family::kEncoder ? 3 : 1) * ek * qb * qs * h /
               (s.sequence_parallel ? q.tp : 1) +
           (ek + 4) * qb * qs * v / q.tp;
  };
  // A layer profiled on a GPU in 16 bits (under autocast) kept autocast's 16-bit copies of its
  // weights beside its activations: they are part of what its points are compared with, and
  // the runtime's memory rules count them apart (RuntimeRules::memory).
  const double copies =
      in.autocast && in.measured->profile().device_kind == profiles::DeviceKind::kGpu
          ? ek * static_cast<double>(count_parameters(m).transformer_layer.per_rank(s.tp))
          : 0;
  const auto layer_formula = [&](const LayerQuery& q) {
    const ActivationShape a = activation_shape(in, q.micro_batch, q.seq_len);
    const bool scores = q.attention == "math" && in.options.attention_scores;
    return copies + transformer_layer_activation_bytes(a, q.tp, s.sequence_parallel,
                                                       *parse_recompute(q.recompute), scores);
  };
  auto roofline =
      [&](const LayerQuery& q,
          LayerTime (*time)(const profiles::ModelSpec&, const LayerShape&, const DeviceRates&)) {
        // The query's attention core (embeddings and heads have none; their queries say math).
        LayerShape shape =
            layer_shape(in, q.micro_batch, q.seq_len, q.tp, *parse_recompute(q.recompute));
        shape.attention = *parse_attention(q.attention);
        return time(m, shape, scaled_rates(core_rates, q.threads));
      };
  const EntryQueries q = entry_queries(in, t.threads);
  EntryMeasurements out;
  act.layer += copies;
  out.layer = measured_entry(
      *in.measured, q.layer,
      [&](const LayerQuery& x) { return roofline(x, transformer_layer_time); }, layer_formula,
      &t.layer, &act.layer);
  out.embed = measured_entry(
      *in.measured, q.embedding, [&](const LayerQuery& x) { return roofline(x, embedding_time); },
      embed_formula, &t.embed, &act.embed);
  out.head = measured_entry(
      *in.measured, q.head, [&](const LayerQuery& x) { return roofline(x, head_time); },
      head_formula, &t.head, &act.head);
  act.layer = std::max(0.0, act.layer - copies);
  if (formula_layer_act > 0) t.backward_temporary *= act.layer / formula_layer_act;
  return out;
}

// Tensor parallelism, per micro-batch (Megatron-LM's f and g; Shoeybi et al. 2019, section 3):
// two all-reduces of the layer's hidden states forward (after attention and after the MLP) and
// two backward, plus two more when full recomputation replays the forward pass; the
// vocab-parallel embedding all-reduces its output; a vocab-parallel LM head reduces three
// scalars per token for its cross-entropy (max, sum of exponentials, target logit) and
// all-reduces its input's gradient. Sequence parallelism (Korthikanti et al. 2022, section 4.2.2)
// splits each of the layer's all-reduces into an all-gather before the column-parallel GEMM and
// a reduce-scatter after the row-parallel one, forward and (mirrored) backward; the embedding
// reduce-scatters its output (all-gathers its gradient) and the head all-gathers its input
// (reduce-scatters its gradient). Megatron-LM also gathers a column-parallel GEMM's input again
// for its weight gradient, overlapped with the input gradient's GEMM: not charged. Measured
// times that already include an entry's tensor-parallel communication (the tp ranks of the
// profile measured together) get none added.
void set_tensor_parallel_collectives(const TermsInput& in, const EntryMeasurements& cal,
                                     double act_bytes, Terms& t) {
  const Strategy& s = in.s;
  if (s.tp <= 1) return;
  const bool sp = s.sequence_parallel;
  // `count` all-reduces of the hidden states, or their all-gather and reduce-scatter halves.
  auto exchange = [&](TensorParallelCollectives& out, double count) {
    if (sp) {
      out.push_back({Collective::kAllGather, count, act_bytes});
      out.push_back({Collective::kReduceScatter, count, act_bytes});
    } else {
      out.push_back({Collective::kAllReduce, count, act_bytes});
    }
  };
  if (!cal.layer.tp_communication) {
    exchange(t.layer_terms.forward_tp, 2);
    exchange(t.layer_terms.backward_tp, s.recompute == Recompute::kFull ? 4 : 2);
  }
  if (!cal.embed.tp_communication) {
    if (sp) {
      t.embed_terms.forward_tp.push_back({Collective::kReduceScatter, 1, act_bytes});
      t.embed_terms.backward_tp.push_back({Collective::kAllGather, 1, act_bytes});
    } else {
      t.embed_terms.forward_tp.push_back({Collective::kAllReduce, 1, act_bytes});
    }
  }
  if (!in.m.num_labels && !cal.head.tp_communication) {
    if (sp) t.head_terms.forward_tp.push_back({Collective::kAllGather, 1, act_bytes});
    t.head_terms.forward_tp.push_back({Collective::kAllReduce, 3, in.b * in.seq * 4});
    t.head_terms.backward_tp.push_back(
        {sp ? Collective::kReduceScatter : Collective::kAllReduce, 1, act_bytes});
  }
}

// The time of `collectives` over the tensor-parallel group (0 when tp = 1).
double tensor_parallel_time_s(const TermsInput& in, const TensorParallelCollectives& collectives) {
  if (collectives.empty()) return 0;
  const profiles::PathMetrics tp_link = in.links.group(in.world, in.s.tp, 1);
  double out = 0;
  for (const TensorParallelCollective& c : collectives) {
    out += c.count *
           (in.factor(c.collective) * collective_time_s(c.collective, c.bytes, in.s.tp, tp_link));
  }
  return out;
}

// Fills the entries' terms and costs: compute from the roofline (or the measured profile), tensor-
// parallel collectives from set_tensor_parallel_collectives().
void set_entry_costs(const TermsInput& in, const EntryMeasurements& cal,
                     const EntryActivations& act, double act_bytes, Terms& t) {
  const profiles::ModelSpec& m = in.m;
  const Strategy& s = in.s;
  const ParameterCounts params = count_parameters(m);
  // The runtime's per-tensor host work (none but DeepSpeed's ZeRO-2/3) lengthens the passes.
  auto add_host = [&](LayerTime& time, const LayerParameters& p, bool layer) {
    const LayerTime host = runtime_host_time(in.job, s, p, layer);
    time.forward_s += host.forward_s;
    time.backward_s += host.backward_s;
    time.recompute_s += host.recompute_s;
  };
  add_host(t.layer, params.transformer_layer, true);
  add_host(t.embed, params.embedding, false);
  add_host(t.head, params.head, false);
  set_tensor_parallel_collectives(in, cal, act_bytes, t);
  if (in.job.tp_comm_overlap && s.sequence_parallel && s.tp > 1 && !cal.layer.tp_communication) {
    overlap_layer_exchanges(
        t.layer, tensor_parallel_time_s(in, {{Collective::kAllGather, 1, act_bytes}}),
        tensor_parallel_time_s(in, {{Collective::kReduceScatter, 1, act_bytes}}), s.tp,
        overlap_slowdown(in.cluster), s.recompute == Recompute::kFull, t.layer_terms);
  }
  t.layer_terms.forward_compute_s = t.layer.forward_s;
  t.layer_terms.backward_compute_s = t.layer.backward_s + t.layer.recompute_s;
  t.embed_terms.forward_compute_s = t.embed.forward_s;
  t.embed_terms.backward_compute_s = t.embed.backward_s;
  t.head_terms.forward_compute_s = t.head.forward_s;
  t.head_terms.backward_compute_s = t.head.backward_s;
  auto cost = [&](const EntryTerms& e, double num_parameters, double activation_bytes) {
    return EntryCost{e.forward_compute_s + tensor_parallel_time_s(in, e.forward_tp),
                     e.backward_compute_s + tensor_parallel_time_s(in, e.backward_tp),
                     num_parameters, activation_bytes};
  };
  t.costs.layer =
      cost(t.layer_terms, static_cast<double>(params.transformer_layer.per_rank(s.tp)), act.layer);
  t.costs.embedding =
      cost(t.embed_terms, static_cast<double>(params.embedding.per_rank(s.tp)), act.embed);
  t.costs.head = cost(t.head_terms, static_cast<double>(params.head.per_rank(s.tp)), act.head);
}

// Context parallelism's ring of key/value sends over the cp group (context_parallel.hpp), added
// to the layer's passes, and to its replay under full recomputation.
void add_context_parallel_exchange(const TermsInput& in, LayerTime& layer) {
  const Strategy& s = in.s;
  if (s.cp <= 1) return;
  const double bytes =
      context_parallel_block_bytes(in.m, s.micro_batch, in.job.seq_len, s.cp, s.tp, in.e);
  const double send_s =
      in.factor(Collective::kP2p) *
      collective_time_s(Collective::kP2p, bytes, 2, in.links.group(in.world, s.cp, s.tp));
  const ContextParallelExposure added =
      context_parallel_exposure(send_s, layer.attention_forward_s, layer.attention_backward_s, s.cp,
                                overlap_slowdown(in.cluster));
  layer.forward_s += added.forward_s;
  layer.backward_s += added.backward_s;
  if (s.recompute == Recompute::kFull) layer.recompute_s += added.forward_s;
}

// Each collective of `full` at `share` of its count and each of `plain` at the rest: a collective's
// time is linear in its count.
TensorParallelCollectives mix_collectives(const TensorParallelCollectives& plain,
                                          const TensorParallelCollectives& full, double share) {
  TensorParallelCollectives out;
  for (const auto& c : full) out.push_back({c.collective, c.count * share, c.bytes});
  for (const auto& c : plain) out.push_back({c.collective, c.count * (1 - share), c.bytes});
  return out;
}

// A chunk whose first recompute_layers recompute: each per-layer term becomes the share-weighted
// mean of the recomputing layer's (`full`, kept in place) and the plain layer's. Every term is
// linear in the layer count, so the chunk's totals are exact. The backward pass reaches the
// recomputing layers last, after the chunk's plain layers of the micro-batch freed what they
// kept: the working set of a layer run again needs only what that did not free (the plain
// layers' temporaries come first). A point the profile answers less directly makes both so.
void blend_partial_recompute(const Terms& plain, const Strategy& s, std::int64_t layers,
                             Terms& full) {
  const double share = recompute_share(s, layers);
  const double plain_layers = static_cast<double>(largest_chunk_layers(s, layers)) * (1 - share);
  auto mix = [share](double a, double b) { return (1 - share) * a + share * b; };
  EntryCost& c = full.costs.layer;
  c.forward_s = mix(plain.costs.layer.forward_s, c.forward_s);
  c.backward_s = mix(plain.costs.layer.backward_s, c.backward_s);
  c.activation_bytes = mix(plain.costs.layer.activation_bytes, c.activation_bytes);
  full.layer.forward_s = mix(plain.layer.forward_s, full.layer.forward_s);
  full.layer.backward_s = mix(plain.layer.backward_s, full.layer.backward_s);
  full.layer.recompute_s = mix(plain.layer.recompute_s, full.layer.recompute_s);
  EntryTerms& e = full.layer_terms;
  e.forward_compute_s = mix(plain.layer_terms.forward_compute_s, e.forward_compute_s);
  e.backward_compute_s = mix(plain.layer_terms.backward_compute_s, e.backward_compute_s);
  e.forward_tp = mix_collectives(plain.layer_terms.forward_tp, e.forward_tp, share);
  e.backward_tp = mix_collectives(plain.layer_terms.backward_tp, e.backward_tp, share);
  full.how_layer = std::max(full.how_layer, plain.how_layer);
  full.backward_temporary =
      std::max(plain.backward_temporary,
               full.backward_temporary - plain_layers * plain.costs.layer.activation_bytes);
}

}  // namespace

Terms compute_terms(const profiles::ModelSpec& m, const CostOptions& options,
                    const GroupLinks& links, const profiles::Cluster& cluster,
                    const MeasuredProfile* measured, const Job& job, const Strategy& s) {
  if (recomputes_part(s, m.layers)) {
    Strategy every = s;
    every.recompute_layers = 0;
    Strategy none = every;
    none.recompute = Recompute::kNone;
    Terms t = compute_terms(m, options, links, cluster, measured, job, every);
    const Terms plain = compute_terms(m, options, links, cluster, measured, job, none);
    blend_partial_recompute(plain, s, m.layers, t);
    // The plain layer's point after the recomputing one's.
    const auto is_layer = [&](const ProfileQuery& q) { return q.what == layer_name(m); };
    ProfileQuery plain_layer =
        *std::find_if(plain.profile_queries.begin(), plain.profile_queries.end(), is_layer);
    plain_layer.what += " (not recomputed)";
    t.profile_queries.insert(
        std::find_if(t.profile_queries.begin(), t.profile_queries.end(), is_layer) + 1,
        std::move(plain_layer));
    return t;
  }
  // A rank's tokens of each sample: 1/cp of the sequence (check_strategy: cp divides it).
  const std::int64_t local_seq = rank_tokens(job, s);
  const TermsInput in{m,
                      options,
                      links,
                      cluster,
                      measured,
                      job,
                      s,
                      s.world_size(),
                      element_bytes(job.precision),
                      static_cast<double>(s.micro_batch),
                      local_seq,
                      static_cast<double>(local_seq),
                      static_cast<double>(m.hidden),
                      static_cast<double>(m.vocab),
                      trains_under_autocast(job)};
  Terms t;
  const DeviceRates core_rates = set_rates(in, t);
  const DeviceRates rates = scaled_rates(core_rates, t.threads);
  const LayerShape shape = layer_shape(in, s.micro_batch, in.seq_len, s.tp, s.recompute);
  t.layer = transformer_layer_time(m, shape, rates);
  t.embed = embedding_time(m, shape, rates);
  t.head = head_time(m, shape, rates);
  // One micro-batch's hidden states: the tensor-parallel reductions' (a product's output), and
  // what pipeline stages pass on (the residual stream, fp32 under autocast).
  const double act_bytes = in.b * in.seq * in.h * in.e;
  set_pipeline_transfer(in, act_bytes * state_element_bytes(job) / in.e, t);
  t.step_sync_s = step_sync_s(in);
  EntryActivations act = activation_terms(in, t);
  EntryMeasurements cal;
  const EntryQueries queries = entry_queries(in, t.threads);
  t.profile_queries = {
      {"embedding", queries.embedding}, {layer_name(m), queries.layer}, {"head", queries.head}};
  if (measured != nullptr) cal = measured_entries(in, core_rates, t, act);
  t.how_layer = cal.layer.how;
  t.how_embedding = cal.embed.how;
  t.how_head = cal.head.how;
  add_context_parallel_exchange(in, t.layer);
  set_entry_costs(in, cal, act, act_bytes, t);
  return t;
}

int threads_per_rank(const profiles::Cluster& cluster, int world) {
  if (cluster.device.kind != profiles::DeviceKind::kCpu) return 1;
  const auto per_node = std::min<std::int64_t>(std::max(world, 1), cluster.devices_per_node);
  return static_cast<int>(std::max<std::int64_t>(1, cluster.devices_per_node / per_node));
}

StepTerms step_terms_of(const Terms& t) {
  StepTerms out;
  out.costs = t.costs;
  out.embedding = t.embed_terms;
  out.layer = t.layer_terms;
  out.head = t.head_terms;
  out.p2p_bytes = t.p2p_bytes;
  out.p2p_all_gather_bytes = t.p2p_all_gather_bytes;
  out.p2p_s = t.p2p_s;
  out.backward_temporary_bytes = t.backward_temporary;
  out.memory_bytes_per_s = t.rate_memory_bytes_per_s;
  out.optimizer_s_per_parameter = t.optimizer.s_per_parameter;
  out.optimizer_s_per_tensor = t.optimizer.s_per_tensor;
  out.step_sync_s = t.step_sync_s;
  out.zero_grad_s_per_parameter = t.zero_grad_s_per_parameter;
  out.profile_queries = t.profile_queries;
  return out;
}

}  // namespace loom::costmodel
