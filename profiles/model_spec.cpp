#include "profiles/model_spec.hpp"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "profiles/errors.hpp"
#include "profiles/json_reader.hpp"

namespace loom::profiles {

const char* to_string(Family family) { return family == Family::kEncoder ? "encoder" : "decoder"; }

std::int64_t max_sequence_length(const ModelSpec& model) {
  return model.model_type == ModelType::kRoberta ? model.max_positions - 2 : model.max_positions;
}

const char* to_string(ModelType type) {
  switch (type) {
    case ModelType::kBert:
      return "bert";
    case ModelType::kRoberta:
      return "roberta";
    case ModelType::kGpt2:
      return "gpt2";
    case ModelType::kLlama:
      return "llama";
    case ModelType::kMistral:
      return "mistral";
    case ModelType::kQwen2:
      return "qwen2";
  }
  return "bert";
}

bool llama_family(ModelType type) {
  return type == ModelType::kLlama || type == ModelType::kMistral || type == ModelType::kQwen2;
}

const char* to_string(Activation activation) {
  switch (activation) {
    case Activation::kGelu:
      return "gelu";
    case Activation::kGeluNew:
      return "gelu_new";
    case Activation::kOther:
      return "other";
  }
  return "gelu";
}

namespace {

// The layer sequence (embedding, layers, head) is indexed with ints and partitioned layer by layer:
// far more layers than any model has (GPT-3: 96) is a typo, not a model.
constexpr std::int64_t kMaxLayers = 100'000;

ModelType parse_model_type(ObjectReader& r, const std::string& key) {
  std::string t = r.choice(key, {"bert", "roberta", "gpt2", "llama", "mistral", "qwen2"});
  if (t == "roberta") return ModelType::kRoberta;
  if (t == "gpt2") return ModelType::kGpt2;
  if (t == "llama") return ModelType::kLlama;
  if (t == "mistral") return ModelType::kMistral;
  if (t == "qwen2") return ModelType::kQwen2;
  return ModelType::kBert;
}

// An activation by its Hugging Face name: gelu (the exact GeLU), gelu_new (the chain of
// elementwise operations), or any other, counted as one kernel (gelu_fast and quick_gelu are
// chains of their own that Loom does not count). loom-model/1 spells the last "other".
Activation activation_named(const std::string& name) {
  if (name == "gelu") return Activation::kGelu;
  return name == "gelu_new" ? Activation::kGeluNew : Activation::kOther;
}

Activation hf_activation(ObjectReader& r, const std::string& key, const char* fallback) {
  return activation_named(r.optional_string(key).value_or(fallback));
}

// A name for a Hugging Face model: its _name_or_path, else the folder holding config.json.
std::string hf_name(ObjectReader& r, const std::string& source, ModelType type) {
  if (auto n = r.optional_string("_name_or_path"); n && !n->empty()) return *n;
  std::filesystem::path p(source);
  std::string folder = p.parent_path().filename().string();
  if (!folder.empty() && folder != "." && folder != "..") return folder;
  return std::string("hf-") + to_string(type);
}

// A field that must be false (or absent) for Loom to count the model as it is.
void require_false(ObjectReader& r, const std::string& key, const std::string& why) {
  if (r.optional_boolean(key).value_or(false)) r.fail(key, "expected false or absent: " + why);
}

// LlamaConfig, MistralConfig and Qwen2Config (transformers' configuration_llama.py,
// configuration_mistral.py, configuration_qwen2.py): num_key_value_heads defaults to the head
// count, tie_word_embeddings to false; Qwen2's q, k and v projections always carry biases
// (modeling_qwen2.py), Llama's only with attention_bias. RMSNorm's eps, rope_theta, rope_scaling
// and Mistral's sliding_window do not change the sizes Loom plans with.
void read_llama_family(ObjectReader& r, ModelSpec& m) {
  m.family = Family::kDecoder;
  m.gated_mlp = true;
  m.layers = r.integer("num_hidden_layers", 1, kMaxLayers);
  m.hidden = r.integer("hidden_size", 1);
  m.heads = r.integer("num_attention_heads", 1);
  const std::int64_t kv = r.optional_integer("num_key_value_heads", 1).value_or(m.heads);
  if (m.heads % kv != 0) {
    r.fail("num_key_value_heads", "expected a divisor of num_attention_heads (" +
                                      std::to_string(m.heads) + "), found " + std::to_string(kv));
  }
  m.kv_heads = kv == m.heads ? 0 : kv;
  m.ffn_hidden = r.integer("intermediate_size", 1);
  m.vocab = r.integer("vocab_size", 1);
  m.max_positions = r.integer("max_position_embeddings", 1);
  m.type_vocab = 0;
  if (auto act = r.optional_string("hidden_act"); act && *act != "silu") {
    r.fail("hidden_act", "expected \"silu\" (the gated SwiGLU MLP), found \"" + *act + "\"");
  }
  if (auto d = r.optional_integer("head_dim", 1);
      d && m.hidden % m.heads == 0 && *d != m.hidden / m.heads) {
    r.fail("head_dim", "expected hidden_size / num_attention_heads (" +
                           std::to_string(m.hidden / m.heads) + "), found " + std::to_string(*d) +
                           ": Loom plans heads of that width");
  }
  require_false(r, "mlp_bias", "Loom counts a Llama MLP without biases");
  if (m.model_type == ModelType::kQwen2) {
    m.qkv_bias = true;
  } else {
    m.qkv_bias = r.optional_boolean("attention_bias").value_or(false);
    if (m.qkv_bias) {
      r.fail("attention_bias",
             "expected false or absent: Loom counts biases on q, k and v (Qwen2's) but not on "
             "the attention output");
    }
  }
}

ModelSpec from_hugging_face(ObjectReader& r, const std::string& source) {
  ModelSpec m;
  m.model_type = parse_model_type(r, "model_type");
  m.name = hf_name(r, source, m.model_type);
  if (llama_family(m.model_type)) {
    read_llama_family(r, m);
  } else if (m.model_type == ModelType::kGpt2) {
    m.family = Family::kDecoder;
    m.layers = r.integer("n_layer", 1, kMaxLayers);
    m.hidden = r.integer("n_embd", 1);
    m.heads = r.integer("n_head", 1);
    m.ffn_hidden = r.optional_integer("n_inner", 1).value_or(4 * m.hidden);
    m.vocab = r.integer("vocab_size", 1);
    if (r.has("n_positions")) {
      m.max_positions = r.integer("n_positions", 1);
    } else {
      m.max_positions = r.integer("n_ctx", 1);
    }
    m.type_vocab = 0;
    m.activation = hf_activation(r, "activation_function", "gelu_new");  // GPT2Config's default
  } else {
    m.family = Family::kEncoder;
    m.layers = r.integer("num_hidden_layers", 1, kMaxLayers);
    m.hidden = r.integer("hidden_size", 1);
    m.heads = r.integer("num_attention_heads", 1);
    m.ffn_hidden = r.integer("intermediate_size", 1);
    m.vocab = r.integer("vocab_size", 1);
    m.max_positions = r.integer("max_position_embeddings", 1);
    m.type_vocab = r.optional_integer("type_vocab_size", 0).value_or(2);
    m.activation = hf_activation(r, "hidden_act", "gelu");
  }
  // PretrainedConfig's default ties; LlamaConfig, MistralConfig and Qwen2Config default to false.
  m.tied_embeddings =
      r.optional_boolean("tie_word_embeddings").value_or(!llama_family(m.model_type));
  // A sequence-classification checkpoint says so in "architectures"; its label count is
  // "num_labels" or the size of "id2label" (Hugging Face writes the latter).
  bool classifier = false;
  if (r.has("architectures")) {
    const auto& arch = r.array("architectures");
    for (const auto& a : arch) {
      if (a.is_string() &&
          a.get<std::string>().find("ForSequenceClassification") != std::string::npos) {
        classifier = true;
      }
    }
  }
  if (classifier) {
    if (auto n = r.optional_integer("num_labels", 1)) {
      m.num_labels = *n;
    } else if (r.has("id2label")) {
      m.num_labels = static_cast<std::int64_t>(r.object("id2label").size());
      if (*m.num_labels < 1) r.fail("id2label", "expected at least one label");
    } else {
      m.num_labels = 2;
    }
  }
  // A Hugging Face config has many more fields (dropout rates, ids): not ours to check.
  return m;
}

}  // namespace

void validate_model(const ModelSpec& m, const std::string& source) {
  auto bad = [&](const std::string& field, const std::string& expectation) {
    throw InputError(source, "$." + field, expectation);
  };
  if (m.layers < 1) bad("layers", "expected an integer >= 1");
  if (m.layers > kMaxLayers) {
    bad("layers", "expected at most " + std::to_string(kMaxLayers) + " layers, found " +
                      std::to_string(m.layers));
  }
  if (m.hidden < 1) bad("hidden", "expected an integer >= 1");
  if (m.heads < 1) bad("heads", "expected an integer >= 1");
  if (m.hidden % m.heads != 0) {
    bad("heads", "expected a divisor of hidden (" + std::to_string(m.hidden) + "), found " +
                     std::to_string(m.heads));
  }
  if (m.ffn_hidden < 1) bad("ffn_hidden", "expected an integer >= 1");
  if (m.vocab < 1) bad("vocab", "expected an integer >= 1");
  if (m.max_positions < 1) bad("max_positions", "expected an integer >= 1");
  if (m.type_vocab < 0) bad("type_vocab", "expected an integer >= 0");
  if (m.num_labels && *m.num_labels < 1) bad("num_labels", "expected an integer >= 1");
  if (m.kv_heads < 0 || (m.kv_heads > 0 && m.heads % m.kv_heads != 0)) {
    bad("kv_heads", "expected 0 (one per head) or a divisor of heads (" + std::to_string(m.heads) +
                        "), found " + std::to_string(m.kv_heads));
  }
  if (m.gated_mlp && m.activation != Activation::kGelu) {
    bad("activation",
        std::string("expected \"gelu\" or absent for a gated (swiglu) MLP, found \"") +
            to_string(m.activation) + "\"");
  }
  if (llama_family(m.model_type) && !m.gated_mlp) {
    bad("mlp", std::string("expected \"swiglu\" or absent for model_type \"") +
                   to_string(m.model_type) + "\"");
  }
  if (m.qkv_bias && !m.gated_mlp) {
    bad("qkv_bias", "expected false or absent for an ungated block (its biases are counted)");
  }
  bool decoder_type = m.model_type == ModelType::kGpt2 || llama_family(m.model_type);
  if (decoder_type != (m.family == Family::kDecoder)) {
    bad("family", std::string("expected \"") + (decoder_type ? "decoder" : "encoder") +
                      "\" for model_type \"" + to_string(m.model_type) + "\"");
  }
  if (m.family == Family::kDecoder && m.type_vocab != 0) {
    bad("type_vocab", "expected 0 or absent for a decoder (token types are an encoder feature)");
  }
}

ModelSpec model_from_json(const nlohmann::json& value, const std::string& source) {
  ObjectReader r(value, source);
  ModelSpec m;
  // A Hugging Face config has no "format" but its own size fields; one that lacks the layer count
  // is still a config (no loom-model "layers" either), so the error names the missing field.
  bool hugging_face = !r.has("format") && r.has("model_type") &&
                      (r.has("num_hidden_layers") || r.has("n_layer") || !r.has("layers"));
  if (hugging_face) {
    m = from_hugging_face(r, source);
    if (m.hidden % m.heads != 0) {
      const char* heads = m.model_type == ModelType::kGpt2 ? "n_head" : "num_attention_heads";
      const char* hidden = m.model_type == ModelType::kGpt2 ? "n_embd" : "hidden_size";
      r.fail(heads, std::string("expected a divisor of ") + hidden + " (" +
                        std::to_string(m.hidden) + "), found " + std::to_string(m.heads));
    }
    validate_model(m, source);
    return m;
  }
  r.expect_format("loom-model");
  m.name = r.string("name");
  if (m.name.empty()) r.fail("name", "expected a non-empty string");
  std::string family = r.choice("family", {"encoder", "decoder"});
  m.family = family == "decoder" ? Family::kDecoder : Family::kEncoder;
  if (r.has("model_type")) {
    m.model_type = parse_model_type(r, "model_type");
  } else {
    r.skip("model_type");
    m.model_type = m.family == Family::kDecoder ? ModelType::kGpt2 : ModelType::kBert;
  }
  m.layers = r.integer("layers", 1, kMaxLayers);
  m.hidden = r.integer("hidden", 1);
  m.heads = r.integer("heads", 1);
  m.ffn_hidden = r.integer("ffn_hidden", 1);
  m.vocab = r.integer("vocab", 1);
  m.max_positions = r.integer("max_positions", 1);
  m.type_vocab = r.optional_integer("type_vocab", 0).value_or(0);
  m.num_labels = r.optional_integer("num_labels", 1);
  m.tied_embeddings = r.optional_boolean("tied_embeddings").value_or(true);
  m.kv_heads = r.optional_integer("kv_heads", 1).value_or(0);
  m.gated_mlp = llama_family(m.model_type);
  if (r.has("mlp")) m.gated_mlp = r.choice("mlp", {"gelu", "swiglu"}) == "swiglu";
  m.qkv_bias = r.optional_boolean("qkv_bias").value_or(false);
  // validate_model refuses an activation other than gelu with a gated MLP.
  if (r.has("activation")) {
    m.activation = activation_named(r.choice("activation", {"gelu", "gelu_new", "other"}));
  }
  r.optional_string("source");
  r.finish();
  validate_model(m, source);
  return m;
}

nlohmann::json model_to_json(const ModelSpec& m) {
  nlohmann::json j;
  j["format"] = "loom-model/1";
  j["name"] = m.name;
  j["family"] = to_string(m.family);
  j["model_type"] = to_string(m.model_type);
  j["layers"] = m.layers;
  j["hidden"] = m.hidden;
  j["heads"] = m.heads;
  j["ffn_hidden"] = m.ffn_hidden;
  j["vocab"] = m.vocab;
  j["max_positions"] = m.max_positions;
  j["type_vocab"] = m.type_vocab;
  if (m.num_labels) j["num_labels"] = *m.num_labels;
  j["tied_embeddings"] = m.tied_embeddings;
  if (m.kv_heads > 0) j["kv_heads"] = m.kv_heads;
  if (m.gated_mlp) j["mlp"] = "swiglu";
  if (m.qkv_bias) j["qkv_bias"] = true;
  if (m.activation != Activation::kGelu) j["activation"] = to_string(m.activation);
  return j;
}

ModelSpec with_head(ModelSpec model, std::optional<std::int64_t> num_labels) {
  if (num_labels) {
    if (*num_labels < 0 || *num_labels > kMaxLabels) {
      throw InputError("--num-labels", "",
                       "expected 0 (the language-model head) or a label count from 1 to " +
                           std::to_string(kMaxLabels) + ", found " + std::to_string(*num_labels));
    }
    model.num_labels = *num_labels > 0 ? num_labels : std::nullopt;
  } else if (!model.num_labels && model.family == Family::kEncoder) {
    model.num_labels = 2;
  }
  return model;
}

std::string head_text(const ModelSpec& model) {
  if (model.num_labels) {
    return "classifier, " + std::to_string(*model.num_labels) +
           (*model.num_labels == 1 ? " label" : " labels");
  }
  return std::string(model.family == Family::kEncoder ? "masked-LM" : "causal LM") +
         (model.tied_embeddings ? " (tied to the word embedding)" : " (its own output matrix)");
}

}  // namespace loom::profiles
