// ModelSpec: built-in models, the loom-model/1 round trip and Hugging Face config.json reading.
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "profiles/errors.hpp"
#include "profiles/json_reader.hpp"
#include "profiles/loader.hpp"
#include "profiles/model_spec.hpp"

namespace fs = std::filesystem;
using loom::profiles::Family;
using loom::profiles::ModelSpec;
using loom::profiles::ModelType;

namespace {

ModelSpec parse_model(const std::string& text, const std::string& source) {
  return loom::profiles::model_from_json(loom::profiles::parse_json_text(text, source), source);
}

// bert-base-uncased's config.json as published, plus an id2label map (ignored: a masked-LM head).
const char* const kBertBaseUncased = R"({
  "architectures": ["BertForMaskedLM"],
  "attention_probs_dropout_prob": 0.1,
  "gradient_checkpointing": false,
  "hidden_act": "gelu",
  "hidden_dropout_prob": 0.1,
  "hidden_size": 768,
  "id2label": {"0": "LABEL_0", "1": "LABEL_1"},
  "initializer_range": 0.02,
  "intermediate_size": 3072,
  "label2id": {"LABEL_0": 0, "LABEL_1": 1},
  "layer_norm_eps": 1e-12,
  "max_position_embeddings": 512,
  "model_type": "bert",
  "num_attention_heads": 12,
  "num_hidden_layers": 12,
  "pad_token_id": 0,
  "position_embedding_type": "absolute",
  "transformers_version": "4.6.0.dev0",
  "type_vocab_size": 2,
  "use_cache": true,
  "vocab_size": 30522
})";

// roberta-base's config.json as published.
const char* const kRobertaBase = R"({
  "architectures": ["RobertaForMaskedLM"],
  "attention_probs_dropout_prob": 0.1,
  "bos_token_id": 0,
  "eos_token_id": 2,
  "hidden_act": "gelu",
  "hidden_dropout_prob": 0.1,
  "hidden_size": 768,
  "initializer_range": 0.02,
  "intermediate_size": 3072,
  "layer_norm_eps": 1e-05,
  "max_position_embeddings": 514,
  "model_type": "roberta",
  "num_attention_heads": 12,
  "num_hidden_layers": 12,
  "pad_token_id": 1,
  "type_vocab_size": 1,
  "vocab_size": 50265
})";

// gpt2's config.json as published, with n_inner spelled out as null (4 * n_embd).
const char* const kGpt2 = R"({
  "activation_function": "gelu_new",
  "architectures": ["GPT2LMHeadModel"],
  "attn_pdrop": 0.1,
  "bos_token_id": 50256,
  "embd_pdrop": 0.1,
  "eos_token_id": 50256,
  "initializer_range": 0.02,
  "layer_norm_epsilon": 1e-05,
  "model_type": "gpt2",
  "n_ctx": 1024,
  "n_embd": 768,
  "n_head": 12,
  "n_inner": null,
  "n_layer": 12,
  "n_positions": 1024,
  "resid_pdrop": 0.1,
  "summary_activation": null,
  "summary_first_dropout": 0.1,
  "summary_proj_to_labels": true,
  "summary_type": "cls_index",
  "summary_use_proj": true,
  "task_specific_params": {"text-generation": {"do_sample": true, "max_length": 50}},
  "vocab_size": 50257
})";

// A fine-tuned three-way classifier (as written by Trainer.save_model): no num_labels key.
const char* const kBertClassifier = R"({
  "_name_or_path": "bert-base-uncased",
  "architectures": ["BertForSequenceClassification"],
  "attention_probs_dropout_prob": 0.1,
  "classifier_dropout": null,
  "hidden_act": "gelu",
  "hidden_dropout_prob": 0.1,
  "hidden_size": 768,
  "id2label": {"0": "negative", "1": "neutral", "2": "positive"},
  "initializer_range": 0.02,
  "intermediate_size": 3072,
  "label2id": {"negative": 0, "neutral": 1, "positive": 2},
  "layer_norm_eps": 1e-12,
  "max_position_embeddings": 512,
  "model_type": "bert",
  "num_attention_heads": 12,
  "num_hidden_layers": 12,
  "pad_token_id": 0,
  "position_embedding_type": "absolute",
  "problem_type": "single_label_classification",
  "torch_dtype": "float32",
  "transformers_version": "4.30.2",
  "type_vocab_size": 2,
  "use_cache": true,
  "vocab_size": 30522
})";

}  // namespace

TEST_CASE("every built-in model loads and round-trips through loom-model/1", "[profiles][model]") {
  const std::vector<std::string> names = loom::profiles::builtin_model_names();
  REQUIRE(names.size() >= 5);
  for (const char* expected :
       {"bert-base", "bert-large", "roberta-base", "roberta-large", "gpt2"}) {
    CHECK(std::find(names.begin(), names.end(), expected) != names.end());
  }
  for (const std::string& name : names) {
    CAPTURE(name);
    ModelSpec m = loom::profiles::load_model(name);
    CHECK(m.name == name);
    CHECK(m.layers > 0);
    CHECK(m.hidden % m.heads == 0);
    nlohmann::json j = loom::profiles::model_to_json(m);
    CHECK(j.at("format") == "loom-model/1");
    CHECK(loom::profiles::model_from_json(j, "round trip of " + name) == m);
    // And through text, as a file would hold it.
    CHECK(parse_model(j.dump(2), "text round trip of " + name) == m);
  }
}

TEST_CASE("built-in bert-large and gpt2 hold the published shapes", "[profiles][model]") {
  ModelSpec bert = loom::profiles::load_model("bert-large");
  CHECK(bert.family == Family::kEncoder);
  CHECK(bert.model_type == ModelType::kBert);
  CHECK(bert.layers == 24);
  CHECK(bert.hidden == 1024);
  CHECK(bert.heads == 16);
  CHECK(bert.ffn_hidden == 4096);
  CHECK(bert.vocab == 30522);
  CHECK(bert.max_positions == 512);
  CHECK(bert.type_vocab == 2);

  ModelSpec gpt2 = loom::profiles::load_model("gpt2");
  CHECK(gpt2.family == Family::kDecoder);
  CHECK(gpt2.model_type == ModelType::kGpt2);
  CHECK(gpt2.layers == 12);
  CHECK(gpt2.hidden == 768);
  CHECK(gpt2.vocab == 50257);
  CHECK(gpt2.type_vocab == 0);
  CHECK_FALSE(gpt2.num_labels.has_value());
}

TEST_CASE("a loom-model/1 round trip keeps optional fields", "[profiles][model]") {
  ModelSpec m;
  m.name = "custom";
  m.family = Family::kEncoder;
  m.model_type = ModelType::kRoberta;
  m.layers = 6;
  m.hidden = 512;
  m.heads = 8;
  m.ffn_hidden = 1536;
  m.vocab = 1000;
  m.max_positions = 130;
  m.type_vocab = 0;
  m.num_labels = 5;
  m.tied_embeddings = false;
  CHECK(loom::profiles::model_from_json(loom::profiles::model_to_json(m), "custom") == m);
  m.num_labels.reset();
  CHECK(loom::profiles::model_from_json(loom::profiles::model_to_json(m), "custom") == m);
}

TEST_CASE("a Hugging Face bert-base-uncased config.json reads as bert-base",
          "[profiles][model][hf]") {
  ModelSpec m = parse_model(kBertBaseUncased, "bert-base-uncased/config.json");
  CHECK(m.name == "bert-base-uncased");
  CHECK(m.family == Family::kEncoder);
  CHECK(m.model_type == ModelType::kBert);
  CHECK(m.layers == 12);
  CHECK(m.hidden == 768);
  CHECK(m.heads == 12);
  CHECK(m.ffn_hidden == 3072);
  CHECK(m.vocab == 30522);
  CHECK(m.max_positions == 512);
  CHECK(m.type_vocab == 2);
  CHECK(m.tied_embeddings);
  // A masked-LM checkpoint has a language-model head even when id2label is present.
  CHECK_FALSE(m.num_labels.has_value());

  // The same shape as the built-in bert-base (apart from its name and head).
  ModelSpec builtin = loom::profiles::load_model("bert-base");
  CHECK(builtin.layers == m.layers);
  CHECK(builtin.hidden == m.hidden);
  CHECK(builtin.heads == m.heads);
  CHECK(builtin.ffn_hidden == m.ffn_hidden);
  CHECK(builtin.vocab == m.vocab);
}

TEST_CASE("a Hugging Face roberta-base config.json reads its own vocabulary and positions",
          "[profiles][model][hf]") {
  ModelSpec m = parse_model(kRobertaBase, "x/config.json");
  CHECK(m.name == "x");
  CHECK(m.family == Family::kEncoder);
  CHECK(m.model_type == ModelType::kRoberta);
  CHECK(m.layers == 12);
  CHECK(m.hidden == 768);
  CHECK(m.heads == 12);
  CHECK(m.ffn_hidden == 3072);
  CHECK(m.vocab == 50265);
  CHECK(m.max_positions == 514);
  CHECK(m.type_vocab == 1);
  CHECK_FALSE(m.num_labels.has_value());
}

TEST_CASE("a Hugging Face gpt2 config.json reads the n_* fields", "[profiles][model][hf]") {
  ModelSpec m = parse_model(kGpt2, "gpt2/config.json");
  CHECK(m.name == "gpt2");
  CHECK(m.family == Family::kDecoder);
  CHECK(m.model_type == ModelType::kGpt2);
  CHECK(m.layers == 12);
  CHECK(m.hidden == 768);
  CHECK(m.heads == 12);
  CHECK(m.ffn_hidden == 4 * 768);  // n_inner null: 4 * n_embd
  CHECK(m.vocab == 50257);
  CHECK(m.max_positions == 1024);
  CHECK(m.type_vocab == 0);
  CHECK(m.tied_embeddings);
  CHECK_FALSE(m.num_labels.has_value());

  // The shape matches the built-in gpt2, so a converted config round-trips to it.
  ModelSpec builtin = loom::profiles::load_model("gpt2");
  m.name = builtin.name;
  CHECK(m == builtin);
}

TEST_CASE("a gpt2 config.json with an explicit n_inner uses it", "[profiles][model][hf]") {
  nlohmann::json j = loom::profiles::parse_json_text(kGpt2, "gpt2/config.json");
  j["n_inner"] = 2048;
  CHECK(loom::profiles::model_from_json(j, "gpt2/config.json").ffn_hidden == 2048);
}

TEST_CASE("a sequence-classification config.json takes its label count from id2label",
          "[profiles][model][hf]") {
  ModelSpec m = parse_model(kBertClassifier, "runs/imdb/config.json");
  CHECK(m.name == "bert-base-uncased");  // _name_or_path wins over the folder
  REQUIRE(m.num_labels.has_value());
  CHECK(*m.num_labels == 3);
  CHECK(m.layers == 12);
  CHECK(m.hidden == 768);

  // An explicit num_labels takes precedence.
  nlohmann::json j = loom::profiles::parse_json_text(kBertClassifier, "c/config.json");
  j["num_labels"] = 4;
  CHECK(loom::profiles::model_from_json(j, "c/config.json").num_labels == 4);
}

TEST_CASE("load_model reads a loom-model file and a config.json from disk", "[profiles][model]") {
  fs::path dir = fs::temp_directory_path() / ("loom-test-model-spec-" + std::to_string(::getpid()));
  fs::create_directories(dir / "roberta-base");
  struct Cleanup {
    fs::path dir;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } cleanup{dir};

  ModelSpec expected = loom::profiles::load_model("bert-large");
  expected.name = "my-bert";
  std::string model_path = (dir / "my-bert.json").string();
  std::ofstream(model_path) << loom::profiles::model_to_json(expected).dump(2);
  CHECK(loom::profiles::load_model(model_path) == expected);

  std::string hf_path = (dir / "roberta-base" / "config.json").string();
  std::ofstream(hf_path) << kRobertaBase;
  ModelSpec hf = loom::profiles::load_model(hf_path);
  CHECK(hf.name == "roberta-base");
  CHECK(hf.vocab == 50265);
  CHECK(hf.max_positions == 514);

  std::string missing = (dir / "absent.json").string();
  REQUIRE_THROWS_AS(loom::profiles::load_model(missing), loom::InputError);
  REQUIRE_THROWS_WITH(loom::profiles::load_model(missing), Catch::Contains(missing));
}

TEST_CASE("a plan's head: the model's own, else a classifier for encoders, or --num-labels",
          "[profiles][model]") {
  using loom::profiles::with_head;
  // bert-base-uncased's Hub config (BertForMaskedLM) reads with its masked-LM head...
  const ModelSpec hub = parse_model(kBertBaseUncased, "bert-base-uncased/config.json");
  CHECK_FALSE(hub.num_labels.has_value());
  CHECK(loom::profiles::head_text(hub) == "masked-LM (tied to the word embedding)");
  // ...and a plan fine-tunes it as loom train does: a classifier with 2 labels.
  CHECK(with_head(hub, std::nullopt).num_labels == 2);
  CHECK(loom::profiles::head_text(with_head(hub, std::nullopt)) == "classifier, 2 labels");
  CHECK(with_head(hub, 5).num_labels == 5);
  CHECK_FALSE(with_head(hub, 0).num_labels.has_value());
  // A sequence-classification config keeps its own labels unless told otherwise.
  const ModelSpec classifier = parse_model(kBertClassifier, "runs/imdb/config.json");
  CHECK(with_head(classifier, std::nullopt).num_labels == 3);
  CHECK(with_head(classifier, 2).num_labels == 2);
  CHECK_FALSE(with_head(classifier, 0).num_labels.has_value());
  // A decoder keeps its language-model head.
  const ModelSpec gpt2 = parse_model(kGpt2, "gpt2/config.json");
  CHECK_FALSE(with_head(gpt2, std::nullopt).num_labels.has_value());
  CHECK(loom::profiles::head_text(gpt2) == "causal LM (tied to the word embedding)");
  ModelSpec untied = gpt2;
  untied.tied_embeddings = false;
  CHECK(loom::profiles::head_text(untied) == "causal LM (its own output matrix)");
  CHECK(loom::profiles::head_text(with_head(gpt2, 1)) == "classifier, 1 label");
  REQUIRE_THROWS_WITH(with_head(hub, -1),
                      "--num-labels: expected 0 (the language-model head) or a label count from "
                      "1 to 1000000, found -1");
  REQUIRE_THROWS_AS(with_head(hub, loom::profiles::kMaxLabels + 1), loom::InputError);
}

TEST_CASE("load_model reads a checkpoint folder's config.json", "[profiles][model]") {
  fs::path dir = fs::temp_directory_path() / ("loom-test-model-dir-" + std::to_string(::getpid()));
  fs::create_directories(dir / "ckpt");
  fs::create_directories(dir / "empty");
  struct Cleanup {
    fs::path dir;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } cleanup{dir};
  std::ofstream((dir / "ckpt" / "config.json").string()) << kRobertaBase;
  const ModelSpec from_folder = loom::profiles::load_model((dir / "ckpt").string());
  CHECK(from_folder == loom::profiles::load_model((dir / "ckpt" / "config.json").string()));
  CHECK(loom::profiles::load_model((dir / "ckpt").string() + "/") == from_folder);
  CHECK(from_folder.vocab == 50265);
  const std::string empty = (dir / "empty").string();
  REQUIRE_THROWS_WITH(loom::profiles::load_model(empty),
                      empty +
                          ": a checkpoint folder holding config.json (a Hugging Face model's "
                          "configuration), found a folder without one");
}

TEST_CASE("the MLP's activation: gelu, gelu_new from GPT-2's config, or another",
          "[profiles][model][hf]") {
  using loom::profiles::Activation;
  nlohmann::json gpt2 = loom::profiles::parse_json_text(kGpt2, "gpt2/config.json");
  CHECK(loom::profiles::model_from_json(gpt2, "gpt2/config.json").activation ==
        Activation::kGeluNew);
  // GPT2Config's default is gelu_new; any other name than gelu and gelu_new is "other".
  gpt2.erase("activation_function");
  CHECK(loom::profiles::model_from_json(gpt2, "gpt2/config.json").activation ==
        Activation::kGeluNew);
  gpt2["activation_function"] = "gelu_pytorch_tanh";
  CHECK(loom::profiles::model_from_json(gpt2, "gpt2/config.json").activation == Activation::kOther);
  gpt2["activation_function"] = "gelu";
  CHECK(loom::profiles::model_from_json(gpt2, "gpt2/config.json").activation == Activation::kGelu);
  nlohmann::json bert = loom::profiles::parse_json_text(kBertBaseUncased, "b/config.json");
  CHECK(loom::profiles::model_from_json(bert, "b/config.json").activation == Activation::kGelu);
  bert["hidden_act"] = "gelu_new";
  CHECK(loom::profiles::model_from_json(bert, "b/config.json").activation == Activation::kGeluNew);
  bert["hidden_act"] = "relu";
  CHECK(loom::profiles::model_from_json(bert, "b/config.json").activation == Activation::kOther);
  // The built-in GPT-2 files say so; loom-model/1 keeps it and refuses what it cannot mean.
  CHECK(loom::profiles::load_model("gpt2-xl").activation == Activation::kGeluNew);
  CHECK(loom::profiles::load_model("gpt3-175b").activation == Activation::kGelu);
  nlohmann::json j = loom::profiles::model_to_json(loom::profiles::load_model("gpt2"));
  CHECK(j.at("activation") == "gelu_new");
  j["activation"] = "other";
  CHECK(loom::profiles::model_from_json(j, "m.json").activation == Activation::kOther);
  j["activation"] = "relu";
  REQUIRE_THROWS_WITH(loom::profiles::model_from_json(j, "m.json"),
                      Catch::Contains("m.json") && Catch::Contains("$.activation") &&
                          Catch::Contains("gelu_new") && Catch::Contains("relu"));
  j["activation"] = "gelu_new";
  j["mlp"] = "swiglu";
  REQUIRE_THROWS_WITH(loom::profiles::model_from_json(j, "m.json"),
                      Catch::Contains("m.json") && Catch::Contains("$.activation") &&
                          Catch::Contains("swiglu") && Catch::Contains("found \"gelu_new\""));
}

// meta-llama/Llama-2-7b-hf's config.json as published.
const char* const kLlama2 = R"({
  "_name_or_path": "meta-llama/Llama-2-7b-hf",
  "architectures": ["LlamaForCausalLM"],
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 11008,
  "max_position_embeddings": 4096,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 32,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": null,
  "tie_word_embeddings": false,
  "torch_dtype": "float16",
  "transformers_version": "4.31.0.dev0",
  "use_cache": true,
  "vocab_size": 32000
})";

TEST_CASE("a Llama config.json reads as a gated decoder with its own head",
          "[profiles][model][hf]") {
  ModelSpec m = parse_model(kLlama2, "Llama-2-7b-hf/config.json");
  CHECK(m.name == "meta-llama/Llama-2-7b-hf");
  CHECK(m.model_type == ModelType::kLlama);
  CHECK(m.family == Family::kDecoder);
  CHECK(m.gated_mlp);
  CHECK(m.layers == 32);
  CHECK(m.hidden == 4096);
  CHECK(m.heads == 32);
  CHECK(m.kv_heads == 0);  // as many key/value heads as heads: multi-head attention
  CHECK(m.ffn_hidden == 11008);
  CHECK(m.vocab == 32000);
  CHECK(m.max_positions == 4096);
  CHECK(m.type_vocab == 0);
  CHECK_FALSE(m.tied_embeddings);
  CHECK_FALSE(m.qkv_bias);
  CHECK_FALSE(m.num_labels);
  // The built-in llama2-7b is the same model.
  ModelSpec builtin = loom::profiles::load_model("llama2-7b");
  builtin.name = m.name;
  CHECK(builtin == m);
  // loom-model/1 keeps the type, the gated MLP and Qwen2's biases.
  m.model_type = ModelType::kQwen2;
  m.qkv_bias = true;
  m.kv_heads = 4;
  nlohmann::json j = loom::profiles::model_to_json(m);
  CHECK(j.at("model_type") == "qwen2");
  CHECK(j.at("qkv_bias") == true);
  CHECK(loom::profiles::model_from_json(j, "m.json") == m);
  j.erase("mlp");  // a Llama-family type implies the gated MLP
  CHECK(loom::profiles::model_from_json(j, "m.json").gated_mlp);
}

TEST_CASE("Llama-family config.json defaults and refusals", "[profiles][model][hf]") {
  nlohmann::json c = loom::profiles::parse_json_text(kLlama2, "l/config.json");
  // LlamaConfig's defaults: key/value heads = heads, untied head; Mistral and Qwen2 alike.
  c.erase("num_key_value_heads");
  c.erase("tie_word_embeddings");
  for (const char* type : {"llama", "mistral", "qwen2"}) {
    c["model_type"] = type;
    ModelSpec m = loom::profiles::model_from_json(c, "l/config.json");
    CHECK(std::string(to_string(m.model_type)) == type);
    CHECK(m.kv_heads == 0);
    CHECK_FALSE(m.tied_embeddings);
    CHECK(m.qkv_bias == (std::string(type) == "qwen2"));  // Qwen2's q, k, v always have biases
  }
  c["model_type"] = "llama";
  c["num_key_value_heads"] = 8;
  CHECK(loom::profiles::model_from_json(c, "l/config.json").kv_heads == 8);
  auto refused = [&](const char* key, const nlohmann::json& value, const char* words) {
    nlohmann::json bad = c;
    bad[key] = value;
    REQUIRE_THROWS_WITH(loom::profiles::model_from_json(bad, "l/config.json"),
                        Catch::Contains("l/config.json") &&
                            Catch::Contains(std::string("$.") + key) && Catch::Contains(words));
  };
  refused("num_key_value_heads", 5, "divisor of num_attention_heads (32)");
  refused("hidden_act", "gelu", "\"silu\"");
  refused("head_dim", 96, "(128), found 96");
  refused("attention_bias", true, "attention output");
  refused("mlp_bias", true, "without biases");
  // A loom-model of a Llama-family type must keep its gated MLP, and only gated blocks take
  // qkv_bias.
  nlohmann::json j = loom::profiles::model_to_json(loom::profiles::load_model("llama2-70b"));
  j["mlp"] = "gelu";
  REQUIRE_THROWS_WITH(loom::profiles::model_from_json(j, "m.json"),
                      Catch::Contains("$.mlp") && Catch::Contains("\"llama\""));
  nlohmann::json g = loom::profiles::model_to_json(loom::profiles::load_model("gpt2"));
  g["qkv_bias"] = true;
  REQUIRE_THROWS_WITH(loom::profiles::model_from_json(g, "m.json"), Catch::Contains("$.qkv_bias"));
}
