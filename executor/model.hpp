// A BERT/RoBERTa encoder for sequence classification, built from a ModelSpec, with Hugging Face
// parameter names and Megatron-style tensor parallelism.
//
// The layer sequence a plan partitions (costmodel/strategy.hpp) is
//   0 = embeddings, 1..L = transformer layers 0..L-1, L + 1 = head (BERT pooler + classifier, or
//   RoBERTa's classification head).
// An EncoderClassifier holds one contiguous range of it (a pipeline stage; the whole model by
// default) and, with tensor parallelism, one rank's shard of that range: attention heads and the
// MLP's inner features are split over the tp group (query/key/value and intermediate.dense are
// column-parallel: output features split; attention.output.dense and output.dense are
// row-parallel: input features split, bias added once after the reduction). Embeddings, LayerNorms
// and the head are replicated. Parameter names are always the Hugging Face names of the full
// model (`bert.encoder.layer.3.attention.self.query.weight`, `classifier.out_proj.bias`, ...); a
// shard holds the slice of the full tensor that belongs to its tp rank.
//
// With sequence parallelism (EncoderOptions::sequence_parallel) the replicated regions run on
// this rank's 1/tp of the sequence: the embedding's vocabulary-parallel partial sums and the
// row-parallel outputs are reduce-scattered along the sequence, the column-parallel inputs
// all-gathered; LayerNorm, the row-parallel biases, dropout and the residual adds see the shard;
// pipeline stages exchange shards [batch, seq / tp, hidden]; the head takes the first token from
// rank 0's shard. The parameters used on a shard (LayerNorm weights and biases, row-parallel
// biases, position and token-type embeddings) get a partial gradient on each rank, all-reduced
// over the tp group as it reaches them, so every rank holds the full gradient (as Megatron-LM's
// all-reduce of sequence-parallel gradients does before the optimizer). Dropout on a shard draws
// the mask of the whole sequence and keeps its slice, so each rank applies what one process
// would on those positions and the generators of the tp group stay in step.
//
// Math follows transformers' BertForSequenceClassification / RobertaForSequenceClassification:
// post-LayerNorm blocks, exact (erf) GELU, LayerNorm eps 1e-12 (BERT) / 1e-5 (RoBERTa), padding
// id 0 (BERT) / 1 (RoBERTa), RoBERTa position ids cumsum(mask) * mask + padding_idx computed from
// input_ids, one dropout probability for hidden states, attention probabilities and the head.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "costmodel/strategy.hpp"
#include "executor/examples.hpp"
#include "executor/executor.hpp"
#include "profiles/model_spec.hpp"

namespace loom::executor {

// ---------------------------------------------------------------------------------------------
// Tensor parallelism

// The communication a tensor-parallel group needs. A c10d (Gloo/NCCL) implementation plugs in
// here; SingleRankComm is the group of one.
class TensorParallelComm {
 public:
  virtual ~TensorParallelComm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Replaces `tensor` on every rank by the element-wise sum over the group. Collective: every
  // rank calls it in the same order with tensors of the same shape, dtype and device.
  virtual void allreduce_sum(torch::Tensor& tensor) = 0;
  // output (size() * n elements, contiguous) = every rank's input (n elements) concatenated in
  // rank order. Collective. The default all-reduces a zero buffer holding this rank's part
  // (twice the bytes of a ring all-gather); process groups override it.
  virtual void allgather(torch::Tensor& output, const torch::Tensor& input);
  // output (n elements, contiguous) = this rank's n-element chunk of the element-wise sum of
  // every rank's input (size() * n elements). Collective. The default all-reduces the whole input
  // and keeps the chunk (twice the bytes of a ring reduce-scatter); process groups override it.
  virtual void reduce_scatter_sum(torch::Tensor& output, const torch::Tensor& input);
};

// The group of one: rank 0, size 1, all-reduce is the identity.
class SingleRankComm final : public TensorParallelComm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void allreduce_sum(torch::Tensor& /*tensor*/) override {}
};

// Where this process sits in the parallel layout, as far as the model needs to know.
struct ParallelContext {
  std::shared_ptr<TensorParallelComm> tp = std::make_shared<SingleRankComm>();
  int tp_rank() const { return tp->rank(); }
  int tp_size() const { return tp->size(); }
};

// Megatron's f: identity in the forward pass, all-reduce of the gradient in the backward pass.
// Put in front of column-parallel layers. The identity when the group has one rank.
torch::Tensor copy_to_tensor_parallel(const torch::Tensor& x,
                                      const std::shared_ptr<TensorParallelComm>& comm);
// Megatron's g: all-reduce in the forward pass, identity in the backward pass. Put after
// row-parallel layers. The identity when the group has one rank.
torch::Tensor reduce_from_tensor_parallel(const torch::Tensor& x,
                                          const std::shared_ptr<TensorParallelComm>& comm);

// Megatron's sequence parallelism (Korthikanti et al. 2022, section 4.2.2): between the
// tensor-parallel regions every rank holds 1/tp of the sequence (dim 1 of [batch, seq, ...]),
// rank r the positions [r * seq / tp, (r + 1) * seq / tp).
// Before a column-parallel linear: all-gather along the sequence in the forward pass,
// reduce-scatter of the gradient in the backward pass (each rank's gradient of the gathered
// input is a partial sum over its heads / features). The identity when the group has one rank.
torch::Tensor gather_sequence_parallel(const torch::Tensor& x_shard,
                                       const std::shared_ptr<TensorParallelComm>& comm);
// After a row-parallel linear: reduce-scatter of the partial sums along the sequence in the
// forward pass, all-gather of the gradient in the backward pass. seq must be divisible by the
// group size. The identity when the group has one rank.
torch::Tensor reduce_scatter_sequence_parallel(const torch::Tensor& x,
                                               const std::shared_ptr<TensorParallelComm>& comm);

// Column-parallel linear: f(x) W_r^T + b_r, where W_r / b_r are this rank's rows (output
// features) of the full weight / bias. Output: this rank's slice of the output features.
torch::Tensor column_parallel_linear(const torch::Tensor& x, const torch::Tensor& weight_shard,
                                     const torch::Tensor& bias_shard,
                                     const std::shared_ptr<TensorParallelComm>& comm);
// Row-parallel linear: g(x_r W_r^T) + b, where x_r is this rank's slice of the input features
// (a column-parallel output), W_r this rank's columns of the full weight and b the whole bias,
// added once after the reduction. Output: the full output, identical on every rank.
torch::Tensor row_parallel_linear(const torch::Tensor& x_shard, const torch::Tensor& weight_shard,
                                  const torch::Tensor& bias,
                                  const std::shared_ptr<TensorParallelComm>& comm);

// ---------------------------------------------------------------------------------------------
// Parameters

// Which dimension of a full parameter tensor parallelism splits.
enum class TensorParallelSplit {
  kReplicated,  // every rank holds the whole tensor
  kRows,        // dim 0 (output features of a column-parallel linear, and its bias; the word
                // embedding's vocabulary, padded with zero rows to ceil(vocab / tp) per rank)
  kColumns,     // dim 1 (input features of a row-parallel linear)
};

struct ParameterInfo {
  std::string name;                 // Hugging Face name
  std::vector<std::int64_t> shape;  // of the full (unsplit) tensor
  TensorParallelSplit split = TensorParallelSplit::kReplicated;
  int layer = 0;  // index in the layer sequence (0 = embeddings, L + 1 = head)
};

// Whether the parameter `name` (Hugging Face name) is an embedding table the model only looks
// rows up in (word, position, token type): the lookup's backward scatters the gradient into rows
// without reading the table (costmodel's ParameterCounts::lookup_tables counts them).
bool lookup_table(const std::string& name);

// Refuses (InputError, source "model NAME", path "model_type", "mlp", "activation" or empty) a
// spec that is not a BERT/RoBERTa encoder with the exact GeLU, positive sizes, heads dividing
// hidden and a positive label count.
void check_encoder(const profiles::ModelSpec& spec);

// Every parameter of the sequence classifier for `spec`, in Hugging Face order. Throws
// InputError when the spec is not a BERT/RoBERTa encoder (check_encoder).
std::vector<ParameterInfo> parameter_table(const profiles::ModelSpec& spec);

// Rank `rank`'s part of `n` indices split over `size` ranks (a vocab-parallel word table's rows):
// ceil(n / size) per rank starting at rank * part, of which the first `length` are real (the rest
// pad the last ranks when size does not divide n).
struct SplitRange {
  std::int64_t start = 0;
  std::int64_t length = 0;
  std::int64_t part = 0;
};
SplitRange split_range(std::int64_t n, int rank, int size);

// Padding token id: 0 for BERT, 1 for RoBERTa.
std::int64_t pad_token_id(profiles::ModelType type);
// LayerNorm epsilon: 1e-12 for BERT, 1e-5 for RoBERTa.
double layer_norm_eps(profiles::ModelType type);
// Labels of the classification head: classifier_labels (executor/examples.hpp).

// ---------------------------------------------------------------------------------------------
// The model

// Rows of a lookup table that a layer's forward pass reads: `rows` (int64, any shape, repeats
// allowed) index the first dimension of `table`, one of the layer's parameters.
struct LookupRows {
  torch::Tensor table;
  torch::Tensor rows;
};

// What runs around each entry of the layer sequence a stage computes (ZeRO-3's per-block
// parameter gathers, executor/flat_parameters.hpp). `layer` is the index in the layer sequence.
class LayerHooks {
 public:
  virtual ~LayerHooks() = default;
  // Before the layer's forward: its parameters must then be readable, except the rows of the
  // tables in `lookups` that are not listed (the embeddings' forward reads only those).
  virtual void before_forward(int layer, const std::vector<LookupRows>& lookups) = 0;
  // After the layer's forward: returns what the stage continues with in place of `output` (the
  // same values; it may carry an action for the backward pass).
  virtual torch::Tensor after_forward(int layer, const torch::Tensor& output) = 0;
};

struct EncoderOptions {
  double dropout = 0.1;    // hidden, attention-probability and head dropout; 0 = none
  int first_layer = 0;     // inclusive range of the layer sequence this stage holds
  int last_layer = -1;     // -1 = L + 1 (through the head)
  std::uint64_t seed = 0;  // initialisation seed
  torch::Device device = torch::kCPU;
  torch::ScalarType dtype = torch::kFloat;  // parameter dtype (fp32 master weights for training)
  // Activation recomputation in training mode (Korthikanti et al. 2022): full keeps only each
  // transformer layer's input and runs the layer again in the backward pass; selective does that
  // for the attention core (scores, softmax, dropout, context). The recomputed forward draws the
  // same dropout masks (the generators' states are restored), so gradients equal the plain ones.
  costmodel::Recompute recompute = costmodel::Recompute::kNone;
  // With full recomputation, only this chunk's first `recompute_layers` transformer layers
  // recompute (costmodel::Strategy::recompute_layers); 0 = all of them.
  int recompute_layers = 0;
  // Megatron sequence parallelism over the tp group (needs tp > 1 and a sequence length divisible
  // by tp): LayerNorms, dropout and residuals run on 1/tp of the sequence; see the class comment.
  bool sequence_parallel = false;
  // The attention core: kMath is the unfused product, masked softmax, dropout and product (the
  // s x s probabilities kept for backward); kFlash is LibTorch's scaled_dot_product_attention
  // (fused kernels where the device has them, LibTorch 2 and later only).
  costmodel::Attention attention = costmodel::Attention::kMath;
};

// One batch of token ids. All int64 [batch, seq] on the model's device.
struct EncoderInputs {
  torch::Tensor input_ids;
  torch::Tensor attention_mask;  // 1 = real token, 0 = padding; undefined = no padding
  torch::Tensor token_type_ids;  // undefined = all 0
};

// What load_safetensors did besides loading: head parameters the file did not have (kept from the
// seeded initialisation, as transformers does when a base checkpoint meets a task head) and
// tensors of the file this model does not use.
struct LoadReport {
  std::vector<std::string> initialized;
  std::vector<std::string> unused;
};

class EncoderClassifier : public torch::nn::Module {
 public:
  // Builds the stage and initialises it from options.seed: weights normal(0, 0.02), biases 0,
  // LayerNorm weights 1, padding rows of padded embeddings 0 (as transformers' _init_weights).
  // Every tensor is drawn in full from a generator seeded by (seed, name) and then sliced, so the
  // weights do not depend on the tp degree or the stage split. Throws InputError for a spec that
  // is not a BERT/RoBERTa encoder, a layer range outside [0, L + 1], or heads / ffn_hidden not
  // divisible by the tp size, sequence parallelism with one tp rank, or an attention kernel this
  // build lacks (runs_attention).
  EncoderClassifier(const profiles::ModelSpec& spec, const EncoderOptions& options = {},
                    ParallelContext parallel = {});

  // Runs the stage. The first stage (holding layer 0) reads inputs.input_ids / token_type_ids
  // and ignores `hidden`; later stages take the previous stage's output as `hidden`
  // [batch, seq, hidden] (sequence parallel: this rank's [batch, seq / tp, hidden]). Every stage
  // with transformer layers reads inputs.attention_mask (and a RoBERTa first stage reads input_ids
  // for positions). Returns logits [batch, num_labels] when the stage holds the head, else hidden
  // states [batch, seq, hidden] (sequence parallel: this rank's shard). Sequence parallelism
  // refuses (InputError) a sequence length not divisible by tp. Dropout is active in training mode
  // (torch::nn::Module::train()) and draws from LibTorch's default generator.
  torch::Tensor forward(const EncoderInputs& inputs, const torch::Tensor& hidden = {});

  const profiles::ModelSpec& spec() const { return spec_; }
  int first_layer() const { return first_layer_; }
  int last_layer() const { return last_layer_; }
  bool has_embeddings() const { return first_layer_ == 0; }
  bool has_head() const { return last_layer_ == static_cast<int>(spec_.layers) + 1; }
  const ParallelContext& parallel() const { return parallel_; }
  // Hooks the forward pass calls around each layer of this stage (null: none).
  void set_layer_hooks(std::shared_ptr<LayerHooks> hooks) { hooks_ = std::move(hooks); }

  // This stage's parameters (tp shards), Hugging Face names, in Hugging Face order. The tensors
  // are the module's parameters (same storage, same autograd identity).
  const std::vector<std::pair<std::string, torch::Tensor>>& local_parameters() const {
    return local_;
  }
  // The full-shape entries of parameter_table() this stage holds, in the same order.
  const std::vector<ParameterInfo>& parameter_infos() const { return infos_; }

  // This stage's parameters as full tensors (tp shards gathered), detached, contiguous, on the
  // CPU, Hugging Face names and order. Collective when tp > 1: every rank of the group calls it.
  std::vector<std::pair<std::string, torch::Tensor>> full_state();

  // Loads this stage's parameters from a safetensors file holding full tensors (each tp rank
  // takes its slice). Accepts F32/F16/BF16/F64 tensors (converted to the parameter dtype), names
  // with or without the `bert.` / `roberta.` prefix, the old `LayerNorm.gamma` / `.beta`
  // spelling; ignores `*.position_ids` and pretraining heads (`cls.*`, `lm_head.*`). A missing
  // embedding/encoder tensor, a wrongly shaped or non-floating tensor throws InputError naming
  // the file, the tensor and the expected shape; missing head tensors keep their initial values
  // (reported in LoadReport::initialized).
  LoadReport load_safetensors(const std::string& path);

  // Writes full_state() to a safetensors file (F32 or the parameter dtype) atomically.
  // Collective when tp > 1; only tp rank 0 writes.
  void save_safetensors(const std::string& path);

 private:
  struct Linear {
    torch::Tensor weight;
    torch::Tensor bias;
  };
  struct EmbeddingWeights {
    torch::Tensor word;
    torch::Tensor position;
    torch::Tensor token_type;  // undefined when the spec has type_vocab 0
    Linear norm;
  };
  struct LayerWeights {
    Linear query, key, value, attention_output, attention_norm, intermediate, output, output_norm;
  };
  struct HeadWeights {
    Linear dense;  // BERT: bert.pooler.dense; RoBERTa: classifier.dense
    Linear out;    // BERT: classifier; RoBERTa: classifier.out_proj
  };

  // The ids the embeddings look up: the word table's (this rank's vocabulary rows under tp:
  // `outside` marks the ids another rank holds, looked up as row 0 and zeroed), the positions'
  // and the token types' (this rank's sequence shard under sequence parallelism).
  struct EmbeddingIds {
    torch::Tensor word, outside, positions, types;
    std::int64_t word_pad = -1;  // the padding row of the word table on this rank (-1: none)
  };
  EmbeddingIds embedding_ids(const EncoderInputs& inputs) const;
  std::vector<LookupRows> lookup_rows(const EmbeddingIds& ids) const;
  torch::Tensor embed(const EmbeddingIds& ids) const;
  torch::Tensor transformer_layer(const LayerWeights& w, const torch::Tensor& x,
                                  const torch::Tensor& keep) const;
  torch::Tensor attention_core(const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, const torch::Tensor& keep) const;
  torch::Tensor head(const torch::Tensor& x) const;
  torch::Tensor dropout(const torch::Tensor& x) const;
  // Dropout of the residual stream: on a sequence shard it keeps the slice of a whole-sequence
  // mask.
  torch::Tensor hidden_dropout(const torch::Tensor& x) const;
  // A parameter used on the residual stream: under sequence parallelism its gradient is summed
  // over the tp group in the backward pass.
  torch::Tensor shard_used(const torch::Tensor& parameter) const;
  torch::Tensor column_linear(const torch::Tensor& x, const Linear& w) const;
  torch::Tensor row_linear(const torch::Tensor& x, const Linear& w) const;
  torch::Tensor layer_norm(const torch::Tensor& x, const Linear& w) const;
  torch::Tensor& add_parameter(const ParameterInfo& info, torch::Tensor value);
  const torch::Tensor& find(const std::string& name) const;

  profiles::ModelSpec spec_;
  ParallelContext parallel_;
  double dropout_;
  costmodel::Recompute recompute_;
  int recompute_layers_;
  bool sequence_parallel_;
  costmodel::Attention attention_;
  int first_layer_;
  int last_layer_;
  std::int64_t pad_id_;
  double eps_;
  std::string base_;  // "bert" or "roberta"
  std::vector<ParameterInfo> infos_;
  std::vector<std::pair<std::string, torch::Tensor>> local_;
  std::optional<EmbeddingWeights> embeddings_;
  std::vector<LayerWeights> layers_;  // the transformer layers of this stage, in order
  std::optional<HeadWeights> head_;
  std::shared_ptr<LayerHooks> hooks_;
};

}  // namespace loom::executor
