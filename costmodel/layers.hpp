// The model as a sequence of layers: parameter counts, FLOPs and activation bytes per layer.
//
// Conventions (docs/formats.md): model FLOPs count matrix products only (2 FLOPs per
// multiply-add), forward plus backward = 3x forward, so a GPT-style model gives Korthikanti et
// al.'s 72 B s l h^2 (1 + s/(6h) + V/(12 l h)). Activation bytes follow Korthikanti et al. 2022
// ("Reducing Activation Recomputation in Large Transformer Models"), section 4 and Table 2,
// generalised to ffn != 4h and to the element width of the precision.
#pragma once

#include <cstdint>
#include <vector>

#include "costmodel/strategy.hpp"

namespace loom::costmodel {

// Parameters split over tensor-parallel ranks and parameters every tensor-parallel rank holds.
struct LayerParameters {
  std::int64_t sharded = 0;
  std::int64_t replicated = 0;
  // Parameter tensors, as Hugging Face's modules hold them (a weight and its bias are two; BERT's
  // query, key and value are three modules, GPT-2's c_attn one): what an engine that works per
  // tensor (RuntimeRules::host_per_tensor) iterates over.
  std::int64_t tensors = 0;
  std::int64_t total() const { return sharded + replicated; }
  // Parameters one tensor-parallel rank holds; a share that does not divide is rounded up, as
  // Megatron-LM pads the vocabulary to a multiple of tp.
  std::int64_t per_rank(int tp) const { return (sharded + tp - 1) / tp + replicated; }
};

struct ParameterCounts {
  LayerParameters embedding;          // word (vocab-parallel), position, token type, LayerNorm
  LayerParameters transformer_layer;  // one transformer layer
  LayerParameters head;               // pooler + classifier, LM head, or final LayerNorm + LM head
  // Of the embedding: the tables only looked up (word, unless a tied LM head multiplies by it;
  // position; token type). A lookup's backward scatters the gradient into rows without reading
  // the table, so Loom's ZeRO-3 leaves them out of the backward pass's gathers.
  LayerParameters lookup_tables;
  std::int64_t total = 0;  // embedding + layers * transformer_layer + head
  // What Hugging Face's base model (BertModel, RobertaModel, GPT2Model) holds: embeddings,
  // layers, and the pooler (encoders) or the final LayerNorm (decoders).
  std::int64_t base_model = 0;
};

ParameterCounts count_parameters(const profiles::ModelSpec& model);

// Of one tp rank's lookup tables (ParameterCounts::lookup_tables), the parameters in the rows a
// micro-batch of `tokens` tokens, in sequences of `seq_len`, can read at most: the word table's
// min(its rows on this rank, tokens), the positions' min(max_positions, seq_len), the token
// types' min(type_vocab, tokens); each row `hidden` parameters.
std::int64_t lookup_rows_read(const profiles::ModelSpec& model, int tp, std::int64_t tokens,
                              std::int64_t seq_len);
// The rows of one tp rank's lookup tables.
std::int64_t lookup_table_rows(const profiles::ModelSpec& model, int tp);

// Forward matrix-product FLOPs of one micro-batch of `batch` samples (whole layer, before tp).
double transformer_layer_forward_flops(const profiles::ModelSpec& model, std::int64_t batch,
                                       std::int64_t seq_len);
double head_forward_flops(const profiles::ModelSpec& model, std::int64_t batch,
                          std::int64_t seq_len);

// FLOPs of one layer's attention core (Q K^T and the product with V) for `batch` samples,
// before tp. Forward: 4 b s^2 h; the fused kernel of a causal decoder skips the masked half.
// Backward: twice the forward for `math`; 2.5x for `flash`, which recomputes the scores (the
// count of Dao 2023, "FlashAttention-2", section 4.1).
double attention_forward_flops(const profiles::ModelSpec& model, std::int64_t batch,
                               std::int64_t seq_len, Attention attention);
double attention_backward_flops(const profiles::ModelSpec& model, std::int64_t batch,
                                std::int64_t seq_len, Attention attention);

// Model FLOPs of one training step over `batch` samples (forward + backward, no recomputation).
double model_flops_per_step(const profiles::ModelSpec& model, std::int64_t batch,
                            std::int64_t seq_len);
// Hardware FLOPs: model FLOPs plus what recomputation repeats (full: every transformer layer's
// forward again, Narayanan et al.'s 96 B s l h^2 (...) for GPT; selective: the attention core).
// With `flash` the fused kernel's backward recomputes the scores (half the attention core's
// 4 b s^2 h more per layer) and selective recomputation repeats nothing.
// kOperators (torchtitan's) repeats the products it does not keep, and the unfused attention
// core. `full_share` is the share of layers that full recomputation repeats (recompute_share()).
double hardware_flops_per_step(const profiles::ModelSpec& model, std::int64_t batch,
                               std::int64_t seq_len, Recompute recompute,
                               Attention attention = Attention::kMath,
                               SelectivePolicy selective = SelectivePolicy::kAttentionCore,
                               double full_share = 1);

// One matrix product of a transformer layer (per token: `in` x `out` weights), in the order an
// unfused layer runs them: query, key, value, attention output, then the MLP's up (gated: W1 and
// W3) and down. Column-parallel products split their output over tp; row-parallel ones (the
// attention output and MLP down) produce a full partial sum on every rank.
struct LayerProduct {
  double in = 0;
  double out = 0;
  bool column_parallel = true;
};
std::vector<LayerProduct> layer_products(const profiles::ModelSpec& model);
std::vector<LayerProduct> layer_products(double hidden, double ffn_hidden, double kv_width,
                                         bool gated_mlp);

// Shape of one micro-batch's activations through a transformer layer.
struct ActivationShape {
  std::int64_t seq_len = 0;      // s
  std::int64_t micro_batch = 0;  // b
  std::int64_t hidden = 0;       // h
  std::int64_t heads = 0;        // a
  std::int64_t ffn_hidden = 0;   // f
  int element_bytes = 2;         // 2 for fp16/bf16 activations, 4 for fp32
  std::int64_t kv_heads = 0;     // key/value heads (grouped-query attention); 0 = a
  bool gated_mlp = false;        // SwiGLU: three ffn-wide tensors kept instead of two
  // Hugging Face's gelu_new run eagerly (ModelSpec::activation, KernelFusions::activation): its
  // autograd keeps x, 0.5 x, the tanh and 1 + the tanh, three ffn-wide tensors more than GeLU's.
  bool activation_chain = false;
  // Autocast (element_bytes 2 with fp32 weights): LayerNorm inputs are the fp32 residual stream
  // (4 bytes each instead of 2), and softmax runs in fp32 (its output 4 bytes; dropout's output
  // is cast back to 16 bits for the product with V).
  bool autocast = false;
  SelectivePolicy selective = SelectivePolicy::kAttentionCore;  // what Recompute::kSelective keeps
  // Whether the model trains with dropout: its masks (one byte per element) are kept. Blocks with
  // a gated MLP have none (model_dropout()).
  bool dropout = true;
  // TransformerEngine's fp8 linear layers (Precision::kFp8) keep their inputs for the weight
  // gradient as fp8, one byte per element: QKV's and FC1's (the norms' outputs), FC2's (the
  // activation's output, which nothing else keeps) and the output projection's, beside the
  // attention kernel's own 16-bit copy of it.
  bool fp8_linear_inputs = false;
};

// Bytes one transformer layer keeps for its backward pass, per tensor-parallel rank.
// With element_bytes = 2 and f = 4h this is Korthikanti et al.'s Table 2:
//   none:      sbh (10 + 24/t + 5as/(ht))     (t = 1: sbh (34 + 5as/h))
//   + sp:      sbh/t (34 + 5as/h)
//   selective: sbh (10 + 24/t), with sp sbh/t * 34
//   full:      2sbh, with sp 2sbh/t
// `attention_scores` false drops the s^2 terms (fused/flash attention keeps no score matrix).
// Under autocast (ActivationShape::autocast) the two LayerNorm inputs and a fully recomputed
// layer's input are fp32 and the softmax output is fp32: sbh (38 + 7as/h) at t = 1.
// Selective recomputation under SelectivePolicy::kOperators keeps the layer's input, the outputs
// of the 1st, 3rd, ... products (layer_products()) and, without scores, the fused attention
// kernel's output and log-sum-exp.
// Grouped-query attention narrows the kept K and V; a gated MLP keeps a third ffn-wide tensor,
// an eager gelu_new three more (5e sbf/t where GeLU keeps 2e sbf/t). Without dropout the two
// masks (sbh) go; with fp8 linear inputs QKV's and FC1's inputs take 1 byte instead of e, FC2's
// input 1 byte instead of e (sbf/t), and the output projection keeps 1 byte (sbh/t) more.
double transformer_layer_activation_bytes(const ActivationShape& shape, int tp,
                                          bool sequence_parallel, Recompute recompute,
                                          bool attention_scores = true);

// What one layer's backward pass allocates on a GPU beyond the bytes it keeps (above), at the
// peak, per tensor-parallel rank: the attention core's backward runs while what it read is
// still held. Fused (attention_scores false): the gradients of Q, K and V (e each, K and V
// kv/a as wide), the incoming gradient made contiguous (e) and the kernel's fp32 accumulator of
// dQ (4), each sbh/t: 12 sbh at e = 2. Unfused: the gradients of Q, K and V and one gradient of
// the scores (a s^2 b/t, fp32 under autocast, whose softmax runs in fp32). A layer run again
// (Recompute::kFull) also holds its recomputed output and the gradient arriving at it until its
// backward pass ends: two tensors of the residual stream. Measured on H100 and H200 (BERT-base
// and BERT-large cut to 2-24 layers, sequence 512, micro-batches 16-64: the caching allocator's
// peak exceeds the kept bytes by 13-16 sbh without recomputation and 22-23 sbh with it). On CPUs
// a profile's layers measure 8-16 sbh too, but bench/validation.sh's CPU plans are predicted
// within 0.7 % (median) without them and no whole-step CPU run has checked them: 0 is used.
double layer_backward_temporary_bytes(const ActivationShape& shape, int tp, bool sequence_parallel,
                                      Recompute recompute, bool attention_scores);

int element_bytes(Precision precision);

// Whether the model's layers apply dropout in training: blocks with a gated MLP are the Llama
// family's, whose Hugging Face decoder layers have no dropout modules (attention_dropout 0 by
// default), as the time model's Llama blocks have none (compute.cpp); BERT, RoBERTa and GPT-2
// blocks do.
bool model_dropout(const profiles::ModelSpec& model);

// The elements of one transformer layer's linear weights (Q, K, V, the output projection and the
// MLP's two or three), before tensor parallelism: what fp8 training casts to fp8.
std::int64_t layer_linear_weight_parameters(const profiles::ModelSpec& model);

}  // namespace loom::costmodel
