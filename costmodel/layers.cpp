#include "costmodel/layers.hpp"

#include <algorithm>

namespace loom::costmodel {

using profiles::Family;
using profiles::ModelSpec;

int element_bytes(Precision precision) {
  // fp8 training keeps its activations and weights in bf16 (only the products' inputs are cast).
  return precision == Precision::kBf16 || precision == Precision::kFp16 ||
                 precision == Precision::kFp8
             ? 2
             : 4;
}

namespace {

// LayerParameters::tensors of each entry, module by module as Hugging Face's models hold them.
void set_parameter_tensors(const ModelSpec& m, ParameterCounts& c) {
  const bool encoder = m.family == Family::kEncoder;
  const std::int64_t types = m.type_vocab > 0 ? 1 : 0;
  const std::int64_t untied_head = m.tied_embeddings ? 0 : 1;
  // Encoder heads (count_parameters): pooler and classifier (or RoBERTa's dense and out_proj),
  // or the masked-LM head's transform (dense, LayerNorm) and decoder bias (and weight untied).
  const std::int64_t encoder_head = m.num_labels ? 4 : 5 + untied_head;
  if (m.gated_mlp) {
    // Llama: the word table; q, k, v, o, gate, up, down and two RMSNorm weights (and Qwen2's
    // three q, k and v biases); the final norm.
    c.embedding.tensors = 1 + types;
    c.transformer_layer.tensors = 9 + (m.qkv_bias ? 3 : 0);
    c.head.tensors = encoder ? encoder_head : 1 + (m.num_labels ? 1 : untied_head);
    return;
  }
  if (encoder) {
    // BERT: word, position and token-type tables and a LayerNorm; query, key, value and output
    // (weight and bias each), the MLP's two (weight and bias each), two LayerNorms.
    c.embedding.tensors = 2 + types + 2;
    c.transformer_layer.tensors = 16;
    c.head.tensors = encoder_head;
    return;
  }
  // GPT-2: wte and wpe; ln_1, c_attn, c_proj, ln_2, c_fc, c_proj (weight and bias each); ln_f and
  // the score or untied LM head.
  c.embedding.tensors = 2 + types;
  c.transformer_layer.tensors = 12;
  c.head.tensors = 2 + (m.num_labels ? 1 : untied_head);
}

}  // namespace

ParameterCounts count_parameters(const ModelSpec& m) {
  const std::int64_t h = m.hidden;
  const std::int64_t f = m.ffn_hidden;
  const std::int64_t v = m.vocab;
  const bool encoder = m.family == Family::kEncoder;
  ParameterCounts c;
  // Embedding: the word table is split over tp by vocabulary (Megatron's VocabParallelEmbedding);
  // positions, token types and the encoder's LayerNorm are replicated.
  c.embedding.sharded = v * h;
  if (m.gated_mlp) {
    // The Llama family: rotary positions (no position table), no biases but Qwen2's on q, k and
    // v (column-parallel, split with their products), RMSNorm (one weight vector). QKV is h wide
    // for queries and h kv / a for each of keys and values.
    const std::int64_t kv = h * m.key_value_heads() / m.heads;
    c.embedding.replicated = m.type_vocab * h;
    c.transformer_layer.sharded =
        h * (h + 2 * kv) + (m.qkv_bias ? h + 2 * kv : 0) + h * h + 3 * h * f;
    c.transformer_layer.replicated = 2 * h;
  } else {
    c.embedding.replicated = m.max_positions * h + m.type_vocab * h + (encoder ? 2 * h : 0);
    // Transformer layer: QKV (column-parallel, weight and bias), attention output
    // (row-parallel: weight split, bias replicated), two LayerNorms, MLP up (column) and down
    // (row). Grouped-query attention narrows K and V to h kv / a columns each.
    const std::int64_t qkv = h + 2 * (h * m.key_value_heads() / m.heads);
    c.transformer_layer.sharded = qkv * h + qkv + h * h + h * f + f + f * h;
    c.transformer_layer.replicated = h + 4 * h + h;  // output bias, 2 LayerNorms, down bias
  }
  // Every table above is looked up; the word table is also read by a tied LM head.
  const bool head_reads_word = !m.num_labels && m.tied_embeddings;
  c.lookup_tables.sharded = head_reads_word ? 0 : v * h;
  c.lookup_tables.replicated = c.embedding.replicated - (!m.gated_mlp && encoder ? 2 * h : 0);
  const std::int64_t pooler = h * h + h;
  const std::int64_t final_norm = m.gated_mlp ? h : 2 * h;
  if (encoder) {
    if (m.num_labels) {
      // BERT: pooler + classifier; RoBERTa: dense + out_proj; the same count.
      c.head.replicated = pooler + h * *m.num_labels + *m.num_labels;
    } else {
      // Masked-LM head: transform (dense + LayerNorm), decoder bias, decoder weight when untied.
      c.head.replicated = h * h + h + 2 * h;
      c.head.sharded = v + (m.tied_embeddings ? 0 : v * h);
    }
  } else {
    c.head.replicated = final_norm;
    if (m.num_labels) {
      c.head.replicated += h * *m.num_labels;  // GPT2ForSequenceClassification's score, no bias
    } else if (!m.tied_embeddings) {
      c.head.sharded = v * h;
    }
  }
  set_parameter_tensors(m, c);
  c.total = c.embedding.total() + m.layers * c.transformer_layer.total() + c.head.total();
  c.base_model = c.embedding.total() + m.layers * c.transformer_layer.total() +
                 (encoder ? pooler : final_norm);
  return c;
}

std::vector<LayerProduct> layer_products(double h, double f, double kv, bool gated) {
  std::vector<LayerProduct> out = {{h, h, true}, {h, kv, true}, {h, kv, true}, {h, h, false}};
  if (gated) {
    out.push_back({h, f, true});
    out.push_back({h, f, true});
  } else {
    out.push_back({h, f, true});
  }
  out.push_back({f, h, false});
  return out;
}

std::vector<LayerProduct> layer_products(const ModelSpec& m) {
  const double h = static_cast<double>(m.hidden);
  return layer_products(h, static_cast<double>(m.ffn_hidden),
                        h * static_cast<double>(m.key_value_heads()) / static_cast<double>(m.heads),
                        m.gated_mlp);
}

namespace {

// The rows of each lookup table on one tp rank: word (0 when a tied LM head reads it),
// positions, token types.
struct LookupTableRows {
  std::int64_t word = 0;
  std::int64_t positions = 0;
  std::int64_t types = 0;
};

LookupTableRows lookup_table_rows_of(const ModelSpec& m, int tp) {
  LookupTableRows r;
  if (count_parameters(m).lookup_tables.sharded > 0) r.word = (m.vocab + tp - 1) / tp;
  if (!m.gated_mlp) r.positions = m.max_positions;
  r.types = m.type_vocab;
  return r;
}

}  // namespace

std::int64_t lookup_rows_read(const ModelSpec& m, int tp, std::int64_t tokens,
                              std::int64_t seq_len) {
  const LookupTableRows r = lookup_table_rows_of(m, tp);
  return m.hidden *
         (std::min(r.word, tokens) + std::min(r.positions, seq_len) + std::min(r.types, tokens));
}

std::int64_t lookup_table_rows(const ModelSpec& m, int tp) {
  const LookupTableRows r = lookup_table_rows_of(m, tp);
  return r.word + r.positions + r.types;
}

double transformer_layer_forward_flops(const ModelSpec& m, std::int64_t batch,
                                       std::int64_t seq_len) {
  const double b = static_cast<double>(batch);
  const double s = static_cast<double>(seq_len);
  const double h = static_cast<double>(m.hidden);
  const double f = static_cast<double>(m.ffn_hidden);
  if (m.gated_mlp || m.key_value_heads() != m.heads) {
    // QKV h (h + 2h kv/a), attention output h^2, MLP 2hf (3hf gated) per token.
    const double kv = h * static_cast<double>(m.key_value_heads()) / static_cast<double>(m.heads);
    const double mlp = (m.gated_mlp ? 3 : 2) * h * f;
    return 2 * b * s * (h * (h + 2 * kv) + h * h + mlp) + 4 * b * s * s * h;
  }
  // QKV 3h^2, attention output h^2, MLP 2hf per token; QK^T and attention over values s*h each.
  return 2 * b * s * (4 * h * h + 2 * h * f) + 4 * b * s * s * h;
}

double attention_forward_flops(const ModelSpec& m, std::int64_t batch, std::int64_t seq_len,
                               Attention attention) {
  const double s = static_cast<double>(seq_len);
  const double full = 4 * static_cast<double>(batch) * s * s * static_cast<double>(m.hidden);
  const bool causal = m.family == Family::kDecoder;
  return attention == Attention::kFlash && causal ? full / 2 : full;
}

double attention_backward_flops(const ModelSpec& m, std::int64_t batch, std::int64_t seq_len,
                                Attention attention) {
  const double forward = attention_forward_flops(m, batch, seq_len, attention);
  return attention == Attention::kFlash ? 2.5 * forward : 2 * forward;
}

double head_forward_flops(const ModelSpec& m, std::int64_t batch, std::int64_t seq_len) {
  const double b = static_cast<double>(batch);
  const double s = static_cast<double>(seq_len);
  const double h = static_cast<double>(m.hidden);
  const double v = static_cast<double>(m.vocab);
  if (m.num_labels) {
    const double labels = static_cast<double>(*m.num_labels);
    // One token per sample: the encoder's [CLS] through pooler and classifier, the decoder's last.
    if (m.family == Family::kEncoder) return 2 * b * (h * h + h * labels);
    return 2 * b * h * labels;
  }
  double logits = 2 * b * s * h * v;
  if (m.family == Family::kEncoder) logits += 2 * b * s * h * h;  // MLM transform
  return logits;
}

double model_flops_per_step(const ModelSpec& m, std::int64_t batch, std::int64_t seq_len) {
  return 3 * (static_cast<double>(m.layers) * transformer_layer_forward_flops(m, batch, seq_len) +
              head_forward_flops(m, batch, seq_len));
}

double hardware_flops_per_step(const ModelSpec& m, std::int64_t batch, std::int64_t seq_len,
                               Recompute recompute, Attention attention, SelectivePolicy selective,
                               double full_share) {
  double flops = model_flops_per_step(m, batch, seq_len);
  const double l = static_cast<double>(m.layers);
  const double s = static_cast<double>(seq_len);
  const double core = 4 * static_cast<double>(batch) * s * s * static_cast<double>(m.hidden);
  if (recompute == Recompute::kFull) {
    flops += full_share * l * transformer_layer_forward_flops(m, batch, seq_len);
  } else if (recompute == Recompute::kSelective && selective == SelectivePolicy::kOperators) {
    // The products the per-operator policy does not keep (the 2nd, 4th, ...), and the unfused
    // attention core.
    const std::vector<LayerProduct> products = layer_products(m);
    for (std::size_t i = 1; i < products.size(); i += 2) {
      flops += l * 2 * static_cast<double>(batch) * s * products[i].in * products[i].out;
    }
    if (attention == Attention::kMath) flops += l * core;
  } else if (recompute == Recompute::kSelective && attention == Attention::kMath) {
    flops += l * core;
  }
  if (attention == Attention::kFlash) flops += l * core / 2;  // 2.5x backward instead of 2x
  return flops;
}

bool model_dropout(const ModelSpec& m) { return !m.gated_mlp; }

std::int64_t layer_linear_weight_parameters(const ModelSpec& m) {
  const std::int64_t h = m.hidden;
  const std::int64_t f = m.ffn_hidden;
  const std::int64_t kv = h * m.key_value_heads() / m.heads;
  return h * (h + 2 * kv) + h * h + (m.gated_mlp ? 3 : 2) * h * f;
}

namespace {

// An activation shape's sizes as doubles, per tensor-parallel degree t.
struct Sizes {
  double s, b, h, a, f, e, t, sbh;
  double kv;        // keys and values are kv / a as wide as the queries (grouped-query attention)
  double outside;   // tensors outside the tp regions: replicated unless sequence parallel
  double residual;  // the residual stream's element bytes: fp32 under autocast
};

Sizes sizes_of(const ActivationShape& x, int tp, bool sequence_parallel) {
  Sizes z{};
  z.s = static_cast<double>(x.seq_len);
  z.b = static_cast<double>(x.micro_batch);
  z.h = static_cast<double>(x.hidden);
  z.a = static_cast<double>(x.heads);
  z.f = static_cast<double>(x.ffn_hidden);
  z.e = x.element_bytes;
  z.t = tp;
  z.sbh = z.s * z.b * z.h;
  z.kv = x.kv_heads > 0 ? static_cast<double>(x.kv_heads) / z.a : 1.0;
  z.outside = sequence_parallel ? 1 / z.t : 1;
  z.residual = x.autocast ? 4 : z.e;
  return z;
}

}  // namespace

double transformer_layer_activation_bytes(const ActivationShape& x, int tp, bool sequence_parallel,
                                          Recompute recompute, bool attention_scores) {
  const Sizes z = sizes_of(x, tp, sequence_parallel);
  const double s = z.s, b = z.b, h = z.h, a = z.a, f = z.f, e = z.e, t = z.t, sbh = z.sbh;
  const double kv = z.kv;
  const double outside = z.outside;
  const double residual = z.residual;
  if (recompute == Recompute::kFull) return residual * sbh * outside;  // only the layer's input
  if (recompute == Recompute::kSelective && x.selective == SelectivePolicy::kOperators) {
    // The layer's input, the outputs of the 1st, 3rd, ... products (column-parallel ones are
    // split over tp; a row-parallel output is a full partial sum), and the fused attention
    // kernel's output and log-sum-exp (fp32, a s b).
    double kept = e * sbh * outside;
    const std::vector<LayerProduct> products = layer_products(h, f, h * kv, x.gated_mlp);
    for (std::size_t i = 0; i < products.size(); i += 2) {
      kept += e * s * b * products[i].out / (products[i].column_parallel ? t : 1);
    }
    if (!attention_scores) kept += e * sbh / t + 4 * a * s * b / t;
    return kept;
  }
  // Attention block (Korthikanti et al. section 4.1): QKV input (e sbh), Q and K (2e sbh), V
  // (e sbh), output-projection input (e sbh), output dropout mask (sbh); and the a s^2 b terms:
  // softmax output (e; 4 under autocast, which runs softmax in fp32), its dropout mask (1),
  // dropout output (e).
  const double mask = x.dropout ? 1 : 0;
  const double linear_input = x.fp8_linear_inputs ? 1 : e;  // QKV's, FC1's and FC2's
  const double projection_copy = x.fp8_linear_inputs ? 1 : 0;
  double attention = linear_input * sbh * outside +
                     (e + e * kv + e * kv + e + projection_copy) * sbh / t + mask * sbh * outside;
  double scores = ((x.autocast ? 4 : e) + 1 + e) * a * s * s * b / t;
  // MLP: input (e sbh), the two ffn-wide tensors around GeLU (2e sbf), the five around an eager
  // gelu_new's chain (5e sbf) or the three around a gated unit's SiLU and product (3e sbf), the
  // last of them FC2's input; dropout mask (sbh).
  const double ffn_tensors = x.gated_mlp ? 3 : x.activation_chain ? 5 : 2;
  double mlp = linear_input * sbh * outside +
               ((ffn_tensors - 1) * e + linear_input) * s * b * f / t + mask * sbh * outside;
  // Two LayerNorm inputs.
  double norms = 2 * residual * sbh * outside;
  double total = attention + mlp + norms;
  if (recompute == Recompute::kNone && attention_scores) total += scores;
  return total;
}

double layer_backward_temporary_bytes(const ActivationShape& x, int tp, bool sequence_parallel,
                                      Recompute recompute, bool attention_scores) {
  const Sizes z = sizes_of(x, tp, sequence_parallel);
  const double qkv_gradients = z.e * (1 + 2 * z.kv) * z.sbh / z.t;
  double bytes = attention_scores
                     ? qkv_gradients + (x.autocast ? 4 : z.e) * z.a * z.s * z.s * z.b / z.t
                     : qkv_gradients + (z.e + 4) * z.sbh / z.t;
  if (recompute == Recompute::kFull) bytes += 2 * z.residual * z.sbh * z.outside;
  return bytes;
}

}  // namespace loom::costmodel
