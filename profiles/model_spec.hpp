// ModelSpec: the shape of a transformer model, and its JSON forms.
//
// Reads `loom-model/1` (docs/formats.md) and Hugging Face `config.json` (model_type bert,
// roberta, gpt2, llama, mistral, qwen2); writes `loom-model/1`. Values are validated on the way in:
// every size positive, heads divide hidden, and so on; a violation is an InputError naming the file
// and JSON path.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>

namespace loom::profiles {

// encoder: bidirectional (BERT, RoBERTa); decoder: causal (GPT).
enum class Family { kEncoder, kDecoder };

// The architecture's details beyond the family: RoBERTa offsets positions by padding_idx + 1;
// GPT-2 has pre-LayerNorm and a final LayerNorm. The Llama family (Llama, Mistral, Qwen2) are
// decoders with rotary positions, RMSNorm, a gated SwiGLU MLP and no biases but Qwen2's on q, k
// and v; their blocks are the same to the cost model, and the name says which config was read.
enum class ModelType { kBert, kRoberta, kGpt2, kLlama, kMistral, kQwen2 };

// Llama, Mistral or Qwen2: always a decoder with a gated MLP (ModelSpec::gated_mlp).
bool llama_family(ModelType type);

// The MLP's activation as the model's code writes it: the exact (erf) GeLU, one kernel, the only
// one Loom's executor runs; Hugging Face's `gelu_new` (GPT-2's activation_function), the tanh
// approximation written as eight elementwise operations, which eager PyTorch runs as eight
// kernels and whose autograd keeps four ffn-wide tensors where one GeLU kernel keeps its input;
// or another activation, counted as one kernel (relu, silu, gelu_pytorch_tanh, ...).
enum class Activation { kGelu, kGeluNew, kOther };

struct ModelSpec {
  std::string name;
  Family family = Family::kEncoder;
  ModelType model_type = ModelType::kBert;
  std::int64_t layers = 0;
  std::int64_t hidden = 0;
  std::int64_t heads = 0;
  std::int64_t ffn_hidden = 0;
  std::int64_t vocab = 0;
  std::int64_t max_positions = 0;
  std::int64_t type_vocab = 0;             // token-type embeddings (encoders); 0 = none
  std::optional<std::int64_t> num_labels;  // classification head; nullopt = language-model head
  bool tied_embeddings = true;
  // Grouped-query attention: key/value heads shared by groups of query heads (Llama 2 70B,
  // Llama 3). 0 = one per query head (multi-head attention). JSON "kv_heads", absent = 0.
  std::int64_t kv_heads = 0;
  // The MLP: GeLU(x W1) W2 (BERT, GPT) or the gated SwiGLU (SiLU(x W1) * x W3) W2 of Llama, with
  // ffn_hidden the width of W1 and W3. JSON "mlp": "gelu" | "swiglu", absent = "gelu".
  bool gated_mlp = false;
  // JSON "activation": "gelu" | "gelu_new" | "other", absent = "gelu"; a gated MLP's is its SiLU.
  Activation activation = Activation::kGelu;
  // Biases on the query, key and value products of a gated (Llama-family) block, as Qwen2 has
  // them (its o_proj and MLP have none); ungated blocks always carry their biases. JSON
  // "qkv_bias", absent = false.
  bool qkv_bias = false;

  // Key/value heads in use: kv_heads, or heads when it is 0.
  std::int64_t key_value_heads() const { return kv_heads > 0 ? kv_heads : heads; }
  bool operator==(const ModelSpec&) const = default;
};

const char* to_string(Family family);
const char* to_string(ModelType type);
const char* to_string(Activation activation);

// The longest sequence the position embeddings cover: max_positions, less the 2 that RoBERTa
// never uses (it numbers tokens from padding_idx + 1 = 2, as transformers does).
std::int64_t max_sequence_length(const ModelSpec& model);

// Reads a loom-model/1 object or a Hugging Face config.json object (recognised by its
// "model_type" key). `source` names the input in errors.
ModelSpec model_from_json(const nlohmann::json& value, const std::string& source);
nlohmann::json model_to_json(const ModelSpec& model);

// Checks the invariants a reader enforces (for specs built in code); throws InputError.
void validate_model(const ModelSpec& model, const std::string& source);

// The most labels a classification head may have: far more than any classifier has is a typo.
constexpr std::int64_t kMaxLabels = 1'000'000;

// The head `loom plan` plans for `model`. `num_labels` given: a classifier with that many labels,
// 0 for the language-model head (InputError naming --num-labels outside [0, kMaxLabels]). Not
// given: the model's own classifier (a loom-model's num_labels, a ...ForSequenceClassification
// config's labels), else a classifier with 2 labels for an encoder (what loom train fine-tunes),
// while a decoder keeps its language-model head.
ModelSpec with_head(ModelSpec model, std::optional<std::int64_t> num_labels);

// The head in words: "classifier, 2 labels", "masked-LM (tied to the word embedding)",
// "causal LM (its own output matrix)".
std::string head_text(const ModelSpec& model);

}  // namespace loom::profiles
