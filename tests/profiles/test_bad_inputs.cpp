// Bad inputs: one test per kind of mistake in a loom-model/1 file, a Hugging Face config.json and a
// loom-cluster/1 file. Each starts from a valid document, changes one thing, and checks that the
// InputError names the source, the JSON path and what was expected.
#include <catch2/catch.hpp>
#include <functional>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string>

#include "profiles/cluster.hpp"
#include "profiles/errors.hpp"
#include "profiles/json_reader.hpp"
#include "profiles/model_spec.hpp"
#include "profiles/topology.hpp"

using Catch::Contains;
using nlohmann::json;

namespace {

const char* const kModelSource = "models/bad-bert.json";
const char* const kHfSource = "checkpoints/bert/config.json";
const char* const kClusterSource = "clusters/bad-dgx.json";

json valid_model() {
  return json::parse(R"({
    "format": "loom-model/1",
    "name": "bert-large",
    "family": "encoder",
    "model_type": "bert",
    "layers": 24,
    "hidden": 1024,
    "heads": 16,
    "ffn_hidden": 4096,
    "vocab": 30522,
    "max_positions": 512,
    "type_vocab": 2,
    "num_labels": 2,
    "tied_embeddings": true
  })");
}

json valid_hf_config() {
  return json::parse(R"({
    "architectures": ["BertForSequenceClassification"],
    "attention_probs_dropout_prob": 0.1,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "hidden_size": 768,
    "id2label": {"0": "NEGATIVE", "1": "POSITIVE"},
    "initializer_range": 0.02,
    "intermediate_size": 3072,
    "layer_norm_eps": 1e-12,
    "max_position_embeddings": 512,
    "model_type": "bert",
    "num_attention_heads": 12,
    "num_hidden_layers": 12,
    "pad_token_id": 0,
    "type_vocab_size": 2,
    "vocab_size": 30522
  })");
}

json valid_gpt2_config() {
  return json::parse(R"({
    "architectures": ["GPT2LMHeadModel"],
    "model_type": "gpt2",
    "n_ctx": 1024,
    "n_embd": 768,
    "n_head": 12,
    "n_inner": null,
    "n_layer": 12,
    "n_positions": 1024,
    "vocab_size": 50257
  })");
}

json valid_cluster() {
  return json::parse(R"({
    "format": "loom-cluster/1",
    "name": "dgx-a100-80g",
    "nodes": 4,
    "devices_per_node": 8,
    "device": {
      "name": "A100-SXM4-80GB",
      "kind": "gpu",
      "memory_bytes": 85899345920,
      "peak_tflops": {"fp32": 19.5, "tf32": 156, "fp16": 312, "bf16": 312},
      "memory_bandwidth_gbps": 2039,
      "matrix_efficiency": 0.6
    },
    "intra_node": {"kind": "nvswitch", "bandwidth_gbps": 300, "latency_us": 3},
    "inter_node": {"kind": "infiniband", "bandwidth_gbps": 200, "latency_us": 8}
  })");
}

// One node of four GPUs with explicit NVLink pairs.
json valid_linked_cluster() {
  return json::parse(R"({
    "format": "loom-cluster/1",
    "name": "quad",
    "nodes": 1,
    "devices_per_node": 4,
    "device": {
      "name": "V100-SXM2-16GB",
      "memory_bytes": 17179869184,
      "peak_tflops": {"fp32": 15.7, "fp16": 125},
      "memory_bandwidth_gbps": 900
    },
    "intra_node": {"kind": "pcie", "bandwidth_gbps": 15.75, "latency_us": 10},
    "links": [
      {"a": "node0/gpu0", "b": "node0/gpu1", "bandwidth_gbps": 50, "latency_us": 2},
      {"a": "node0/gpu2", "b": "node0/gpu3", "bandwidth_gbps": 50, "latency_us": 2},
      {"a": "node0/gpu0", "b": "node0/gpu2", "bandwidth_gbps": 25, "latency_us": 2},
      {"a": "node0/gpu1", "b": "node0/gpu3", "bandwidth_gbps": 25, "latency_us": 2}
    ]
  })");
}

// Runs `read`, which must throw loom::InputError with exactly this source and path and an
// expectation containing every one of `words`; the composed message must name all three.
void require_input_error(const std::function<void()>& read, const std::string& source,
                         const std::string& path, std::initializer_list<std::string> words) {
  INFO("expected an InputError at " << source << ": " << path);
  try {
    read();
  } catch (const loom::InputError& e) {
    INFO("message: " << e.what());
    CHECK(e.source() == source);
    CHECK(e.path() == path);
    CHECK_THAT(e.what(), Contains(source));
    CHECK_THAT(e.what(), Contains(path));
    CHECK_THAT(e.what(), Contains(e.expectation()));
    for (const std::string& word : words) CHECK_THAT(e.expectation(), Contains(word));
    return;
  }
  FAIL("no exception thrown");
}

void require_model_error(const json& value, const std::string& path,
                         std::initializer_list<std::string> words) {
  require_input_error([&] { loom::profiles::model_from_json(value, kModelSource); }, kModelSource,
                      path, words);
}

void require_hf_error(const json& value, const std::string& path,
                      std::initializer_list<std::string> words) {
  require_input_error([&] { loom::profiles::model_from_json(value, kHfSource); }, kHfSource, path,
                      words);
}

void require_cluster_error(const json& value, const std::string& path,
                           std::initializer_list<std::string> words) {
  require_input_error([&] { loom::profiles::cluster_from_json(value, kClusterSource); },
                      kClusterSource, path, words);
}

}  // namespace

// The valid documents really are valid, so every failure below comes from the one change.
TEST_CASE("bad inputs: the base documents are valid", "[profiles][errors]") {
  CHECK(loom::profiles::model_from_json(valid_model(), kModelSource).heads == 16);
  CHECK(loom::profiles::model_from_json(valid_hf_config(), kHfSource).num_labels == 2);
  CHECK(loom::profiles::model_from_json(valid_gpt2_config(), kHfSource).heads == 12);
  CHECK(loom::profiles::cluster_from_json(valid_cluster(), kClusterSource).nodes == 4);
  loom::profiles::Cluster quad =
      loom::profiles::cluster_from_json(valid_linked_cluster(), kClusterSource);
  CHECK(loom::profiles::Topology(quad).device_count() == 4);
}

// ---------------------------------------------------------------------------------------------
// loom-model/1

TEST_CASE("loom-model: missing required field", "[profiles][errors][model]") {
  json j = valid_model();
  j.erase("layers");
  require_model_error(j, "$.layers", {"missing required field", "integer"});
}

TEST_CASE("loom-model: null for a required field", "[profiles][errors][model]") {
  json j = valid_model();
  j["vocab"] = nullptr;
  require_model_error(j, "$.vocab", {"missing required field"});
}

TEST_CASE("loom-model: missing format", "[profiles][errors][model]") {
  json j = valid_model();
  j.erase("format");
  j.erase("model_type");  // with model_type and no format the object reads as a config.json
  require_model_error(j, "$.format", {"missing required field", "string"});
}

TEST_CASE("loom-model: string where an integer is expected", "[profiles][errors][model]") {
  json j = valid_model();
  j["hidden"] = "1024";
  require_model_error(j, "$.hidden", {"expected an integer", "found a string"});
}

TEST_CASE("loom-model: non-integer number for an integer", "[profiles][errors][model]") {
  json j = valid_model();
  j["layers"] = 12.5;
  require_model_error(j, "$.layers", {"expected an integer", "found a number"});
}

TEST_CASE("loom-model: integral float for an integer", "[profiles][errors][model]") {
  json j = valid_model();
  j["layers"] = 24.0;
  require_model_error(j, "$.layers", {"expected an integer", "found a number"});
}

TEST_CASE("loom-model: wrong type for a boolean", "[profiles][errors][model]") {
  json j = valid_model();
  j["tied_embeddings"] = "yes";
  require_model_error(j, "$.tied_embeddings", {"true or false", "found a string"});
}

TEST_CASE("loom-model: zero size", "[profiles][errors][model]") {
  json j = valid_model();
  j["heads"] = 0;
  require_model_error(j, "$.heads", {">= 1", "found 0"});
}

TEST_CASE("loom-model: negative size", "[profiles][errors][model]") {
  json j = valid_model();
  j["vocab"] = -30522;
  require_model_error(j, "$.vocab", {">= 1", "found -30522"});
}

TEST_CASE("loom-model: zero labels", "[profiles][errors][model]") {
  json j = valid_model();
  j["num_labels"] = 0;
  require_model_error(j, "$.num_labels", {">= 1", "found 0"});
}

TEST_CASE("loom-model: heads that do not divide hidden", "[profiles][errors][model]") {
  json j = valid_model();
  j["heads"] = 15;
  require_model_error(j, "$.heads", {"divisor of hidden", "1024", "found 15"});
}

TEST_CASE("loom-model: unknown field (a typo)", "[profiles][errors][model]") {
  json j = valid_model();
  j["hiden"] = 1024;
  require_model_error(j, "$.hiden", {"unknown field"});
}

TEST_CASE("loom-model: wrong format string", "[profiles][errors][model]") {
  json j = valid_model();
  j["format"] = "loom-cluster/1";
  require_model_error(j, "$.format", {"\"loom-model/1\"", "\"loom-cluster/1\""});
}

TEST_CASE("loom-model: newer format version", "[profiles][errors][model]") {
  json j = valid_model();
  j["format"] = "loom-model/2";
  require_model_error(j, "$.format", {"\"loom-model/2\"", "newer", "unknown", "upgrade"});
}

TEST_CASE("loom-model: value outside the allowed choices", "[profiles][errors][model]") {
  json j = valid_model();
  j["family"] = "causal";
  require_model_error(j, "$.family", {"\"encoder\"", "\"decoder\"", "found \"causal\""});
}

TEST_CASE("loom-model: family inconsistent with model_type", "[profiles][errors][model]") {
  json j = valid_model();
  j["family"] = "decoder";
  j.erase("type_vocab");
  require_model_error(j, "$.family", {"\"encoder\"", "\"bert\""});

  json gpt = valid_model();
  gpt["model_type"] = "gpt2";  // a GPT-2 model_type in an encoder
  require_model_error(gpt, "$.family", {"\"decoder\"", "\"gpt2\""});
}

TEST_CASE("loom-model: token types on a decoder", "[profiles][errors][model]") {
  json j = valid_model();
  j["family"] = "decoder";
  j["model_type"] = "gpt2";
  j["type_vocab"] = 2;
  require_model_error(j, "$.type_vocab", {"decoder"});
}

TEST_CASE("loom-model: empty name", "[profiles][errors][model]") {
  json j = valid_model();
  j["name"] = "";
  require_model_error(j, "$.name", {"non-empty"});
}

TEST_CASE("loom-model: not an object", "[profiles][errors][model]") {
  require_model_error(json::array({1, 2}), "$", {"JSON object", "array"});
}

TEST_CASE("loom-model: invalid JSON syntax", "[profiles][errors][model]") {
  std::string text = valid_model().dump(2);
  text.pop_back();  // drop the closing brace
  require_input_error([&] { loom::profiles::parse_json_text(text, kModelSource); }, kModelSource,
                      "", {"not valid JSON", "line"});
  require_input_error([&] { loom::profiles::parse_json_text("{\"layers\": 24,,}", kModelSource); },
                      kModelSource, "", {"not valid JSON"});
}

TEST_CASE("loom-model: comments are allowed", "[profiles][errors][model]") {
  std::string text = "// a comment\n" + valid_model().dump(2);
  CHECK(loom::profiles::parse_json_text(text, kModelSource) == valid_model());
}

TEST_CASE("loom-model: validate_model checks a spec built in code", "[profiles][errors][model]") {
  loom::profiles::ModelSpec m = loom::profiles::model_from_json(valid_model(), kModelSource);
  m.heads = 10;
  require_input_error([&] { loom::profiles::validate_model(m, "code"); }, "code", "$.heads",
                      {"divisor of hidden"});
  m.heads = 16;
  m.ffn_hidden = 0;
  require_input_error([&] { loom::profiles::validate_model(m, "code"); }, "code", "$.ffn_hidden",
                      {">= 1"});
}

// ---------------------------------------------------------------------------------------------
// Hugging Face config.json

TEST_CASE("config.json: missing required field", "[profiles][errors][hf]") {
  json j = valid_hf_config();
  j.erase("hidden_size");
  require_hf_error(j, "$.hidden_size", {"missing required field", "integer"});
}

TEST_CASE("config.json: a typo is a missing field", "[profiles][errors][hf]") {
  // Unknown keys are normal in a config.json (dropout, activation, ...), so a typo shows up as the
  // field it should have been.
  json j = valid_hf_config();
  j["hiden_size"] = j["hidden_size"];
  j.erase("hidden_size");
  require_hf_error(j, "$.hidden_size", {"missing required field"});
}

TEST_CASE("config.json: gpt2 without n_positions or n_ctx", "[profiles][errors][hf]") {
  json j = valid_gpt2_config();
  j.erase("n_positions");
  j.erase("n_ctx");
  require_hf_error(j, "$.n_ctx", {"missing required field"});
}

TEST_CASE("config.json: string where an integer is expected", "[profiles][errors][hf]") {
  json j = valid_hf_config();
  j["num_hidden_layers"] = "12";
  require_hf_error(j, "$.num_hidden_layers", {"expected an integer", "found a string"});
}

TEST_CASE("config.json: non-integer number for an integer", "[profiles][errors][hf]") {
  json j = valid_hf_config();
  j["intermediate_size"] = 3072.5;
  require_hf_error(j, "$.intermediate_size", {"expected an integer", "found a number"});
}

TEST_CASE("config.json: zero size", "[profiles][errors][hf]") {
  json j = valid_hf_config();
  j["vocab_size"] = 0;
  require_hf_error(j, "$.vocab_size", {">= 1", "found 0"});
}

TEST_CASE("config.json: negative size", "[profiles][errors][hf]") {
  json j = valid_hf_config();
  j["max_position_embeddings"] = -512;
  require_hf_error(j, "$.max_position_embeddings", {">= 1", "found -512"});

  json t = valid_hf_config();
  t["type_vocab_size"] = -1;
  require_hf_error(t, "$.type_vocab_size", {">= 0", "found -1"});
}

TEST_CASE("config.json: num_attention_heads that does not divide hidden_size",
          "[profiles][errors][hf]") {
  json j = valid_hf_config();
  j["num_attention_heads"] = 11;
  require_hf_error(j, "$.num_attention_heads", {"divisor of hidden_size", "768", "found 11"});
}

TEST_CASE("config.json: n_head that does not divide n_embd", "[profiles][errors][hf]") {
  json j = valid_gpt2_config();
  j["n_head"] = 7;
  require_hf_error(j, "$.n_head", {"divisor of n_embd", "768", "found 7"});
}

TEST_CASE("config.json: unsupported model_type", "[profiles][errors][hf]") {
  json j = valid_hf_config();
  j["model_type"] = "gemma";
  require_hf_error(
      j, "$.model_type",
      {"\"bert\"", "\"roberta\"", "\"gpt2\"", "\"llama\"", "\"qwen2\"", "found \"gemma\""});
}

TEST_CASE("config.json: model_type of the wrong type", "[profiles][errors][hf]") {
  json j = valid_hf_config();
  j["model_type"] = 2;
  require_hf_error(j, "$.model_type", {"\"bert\"", "found an integer"});
}

TEST_CASE("config.json: a classifier with an empty id2label", "[profiles][errors][hf]") {
  json j = valid_hf_config();
  j["id2label"] = json::object();
  require_hf_error(j, "$.id2label", {"at least one label"});
}

TEST_CASE("config.json: a classifier with zero num_labels", "[profiles][errors][hf]") {
  json j = valid_hf_config();
  j["num_labels"] = 0;
  require_hf_error(j, "$.num_labels", {">= 1", "found 0"});
}

TEST_CASE("config.json: wrong type for tie_word_embeddings", "[profiles][errors][hf]") {
  json j = valid_hf_config();
  j["tie_word_embeddings"] = 1;
  require_hf_error(j, "$.tie_word_embeddings", {"true or false", "found an integer"});
}

TEST_CASE("config.json: invalid JSON syntax", "[profiles][errors][hf]") {
  std::string text = valid_hf_config().dump(2);
  text.replace(text.find(':'), 1, "=");
  require_input_error([&] { loom::profiles::parse_json_text(text, kHfSource); }, kHfSource, "",
                      {"not valid JSON", "line"});
}

// ---------------------------------------------------------------------------------------------
// loom-cluster/1

TEST_CASE("loom-cluster: missing required field", "[profiles][errors][cluster]") {
  json j = valid_cluster();
  j["device"].erase("memory_bytes");
  require_cluster_error(j, "$.device.memory_bytes", {"missing required field", "integer"});

  json k = valid_cluster();
  k["intra_node"].erase("latency_us");
  require_cluster_error(k, "$.intra_node.latency_us", {"missing required field", "number"});
}

TEST_CASE("loom-cluster: string where an integer is expected", "[profiles][errors][cluster]") {
  json j = valid_cluster();
  j["nodes"] = "4";
  require_cluster_error(j, "$.nodes", {"expected an integer", "found a string"});
}

TEST_CASE("loom-cluster: string where a number is expected", "[profiles][errors][cluster]") {
  json j = valid_cluster();
  j["inter_node"]["bandwidth_gbps"] = "200 GB/s";
  require_cluster_error(j, "$.inter_node.bandwidth_gbps", {"expected a number", "found a string"});
}

TEST_CASE("loom-cluster: non-integer number for an integer", "[profiles][errors][cluster]") {
  json j = valid_cluster();
  j["devices_per_node"] = 7.5;
  require_cluster_error(j, "$.devices_per_node", {"expected an integer", "found a number"});
}

TEST_CASE("loom-cluster: an integer too large", "[profiles][errors][cluster]") {
  json j = valid_cluster();
  j["device"]["memory_bytes"] = 18446744073709551615ULL;
  require_cluster_error(j, "$.device.memory_bytes", {"expected an integer", "too large"});
}

TEST_CASE("loom-cluster: zero size", "[profiles][errors][cluster]") {
  json j = valid_cluster();
  j["device"]["memory_bytes"] = 0;
  require_cluster_error(j, "$.device.memory_bytes", {">= 1", "found 0"});

  json k = valid_cluster();
  k["intra_node"]["bandwidth_gbps"] = 0;
  require_cluster_error(k, "$.intra_node.bandwidth_gbps", {"> 0", "found 0"});
}

TEST_CASE("loom-cluster: negative size", "[profiles][errors][cluster]") {
  json j = valid_cluster();
  j["nodes"] = -2;
  require_cluster_error(j, "$.nodes", {"from 1 to 1000000", "found -2"});

  json k = valid_cluster();
  k["inter_node"]["latency_us"] = -1;
  require_cluster_error(k, "$.inter_node.latency_us", {">= 0", "found -1"});
}

TEST_CASE("loom-cluster: unknown field (a typo)", "[profiles][errors][cluster]") {
  json j = valid_cluster();
  j["device"]["memory_bandwith_gbps"] = 2039;
  require_cluster_error(j, "$.device.memory_bandwith_gbps", {"unknown field"});

  json k = valid_cluster();
  k["device"]["peak_tflops"]["bf61"] = 312;
  require_cluster_error(k, "$.device.peak_tflops.bf61", {"unknown field"});

  json top = valid_cluster();
  top["hiden"] = true;
  require_cluster_error(top, "$.hiden", {"unknown field"});
}

TEST_CASE("loom-cluster: wrong format string", "[profiles][errors][cluster]") {
  json j = valid_cluster();
  j["format"] = "loom-model/1";
  require_cluster_error(j, "$.format", {"\"loom-cluster/1\"", "\"loom-model/1\""});
}

TEST_CASE("loom-cluster: newer format version", "[profiles][errors][cluster]") {
  json j = valid_cluster();
  j["format"] = "loom-cluster/2";
  require_cluster_error(j, "$.format", {"\"loom-cluster/2\"", "newer", "upgrade"});
}

TEST_CASE("loom-cluster: value outside the allowed choices", "[profiles][errors][cluster]") {
  json j = valid_cluster();
  j["device"]["kind"] = "tpu";
  require_cluster_error(j, "$.device.kind", {"\"gpu\"", "\"cpu\"", "found \"tpu\""});
}

TEST_CASE("loom-cluster: several nodes without inter_node", "[profiles][errors][cluster]") {
  json j = valid_cluster();
  j.erase("inter_node");
  require_cluster_error(j, "$.inter_node", {"nodes > 1", "nodes = 4"});
}

TEST_CASE("loom-cluster: validate_cluster checks a cluster built in code",
          "[profiles][errors][cluster]") {
  loom::profiles::Cluster c = loom::profiles::cluster_from_json(valid_cluster(), kClusterSource);
  c.inter_node.reset();
  require_input_error([&] { loom::profiles::validate_cluster(c, "code"); }, "code", "$.inter_node",
                      {"nodes > 1"});
}

TEST_CASE("loom-cluster: peak_tflops all zero", "[profiles][errors][cluster]") {
  json j = valid_cluster();
  j["device"]["peak_tflops"] = {{"fp32", 0}, {"tf32", 0}, {"fp16", 0}, {"bf16", 0}};
  require_cluster_error(j, "$.device.peak_tflops", {"at least one", "> 0"});

  json empty = valid_cluster();
  empty["device"]["peak_tflops"] = json::object();
  require_cluster_error(empty, "$.device.peak_tflops", {"at least one"});
}

TEST_CASE("loom-cluster: efficiency above 1", "[profiles][errors][cluster]") {
  json j = valid_cluster();
  j["device"]["matrix_efficiency"] = 1.5;
  require_cluster_error(j, "$.device.matrix_efficiency", {"fraction", "(0, 1]"});

  json k = valid_cluster();
  k["device"]["memory_efficiency"] = 0;
  require_cluster_error(k, "$.device.memory_efficiency", {"> 0", "found 0"});
}

TEST_CASE("loom-cluster: sm_count and achievable_tflops", "[profiles][errors][cluster]") {
  json j = valid_cluster();
  j["device"]["sm_count"] = 108;
  require_cluster_error(j, "$.device.achievable_tflops", {"required with device.sm_count"});

  json k = valid_cluster();
  k["device"]["achievable_tflops"] = {{"bf16", 200}};
  require_cluster_error(k, "$.device.sm_count", {"required with device.achievable_tflops"});

  json above = valid_cluster();
  above["device"]["sm_count"] = 108;
  above["device"]["achievable_tflops"] = {{"bf16", 1e6}};
  require_cluster_error(above, "$.device.achievable_tflops.bf16", {"at most the peak"});

  json zero = valid_cluster();
  zero["device"]["sm_count"] = 0;
  require_cluster_error(zero, "$.device.sm_count", {"from 1", "found 0"});

  json att = valid_cluster();
  att["device"]["attention_efficiency"] = 2;
  require_cluster_error(att, "$.device.attention_efficiency", {"fraction", "(0, 1]"});
}

TEST_CASE("loom-cluster: links that are not an array", "[profiles][errors][cluster]") {
  json j = valid_linked_cluster();
  j["links"] = json::object();
  require_cluster_error(j, "$.links", {"expected an array", "found an object"});
}

TEST_CASE("loom-cluster: link with a missing field", "[profiles][errors][cluster]") {
  json j = valid_linked_cluster();
  j["links"][1].erase("bandwidth_gbps");
  require_cluster_error(j, "$.links[1].bandwidth_gbps", {"missing required field"});
}

TEST_CASE("loom-cluster: link from a device to itself", "[profiles][errors][cluster]") {
  json j = valid_linked_cluster();
  j["links"][0]["b"] = "node0/gpu0";
  require_cluster_error(j, "$.links[0].b", {"different endpoint", "node0/gpu0"});
}

TEST_CASE("loom-cluster: link naming a device that does not exist", "[profiles][errors][cluster]") {
  json j = valid_linked_cluster();
  j["links"][2]["b"] = "node0/gpu9";
  // The reader accepts any name (it may be a switch); the topology knows the devices.
  loom::profiles::Cluster c = loom::profiles::cluster_from_json(j, kClusterSource);
  require_input_error([&] { loom::profiles::Topology t(c); }, "cluster \"quad\"", "$.links[2]",
                      {"node0/gpu9", "4 devices", "node0/gpu0 .. node0/gpu3"});

  json other_node = valid_linked_cluster();
  other_node["links"][0]["a"] = "node1/gpu0";
  c = loom::profiles::cluster_from_json(other_node, kClusterSource);
  require_input_error([&] { loom::profiles::Topology t(c); }, "cluster \"quad\"", "$.links[0]",
                      {"node1/gpu0"});
}

TEST_CASE("loom-cluster: links that leave a device unreachable", "[profiles][errors][cluster]") {
  json j = valid_linked_cluster();
  j["links"] = json::array({j["links"][0]});  // only gpu0 - gpu1
  loom::profiles::Cluster c = loom::profiles::cluster_from_json(j, kClusterSource);
  require_input_error([&] { loom::profiles::Topology t(c); }, "cluster \"quad\"", "$.links",
                      {"reachable", "node0/gpu2"});
}

TEST_CASE("loom-cluster: invalid JSON syntax", "[profiles][errors][cluster]") {
  std::string text = valid_cluster().dump(2);
  text.insert(text.find("\"nodes\""), "'");
  require_input_error([&] { loom::profiles::parse_json_text(text, kClusterSource); },
                      kClusterSource, "", {"not valid JSON", "line"});
}

TEST_CASE("JSON text: a number too large for a double is bad input, not a crash",
          "[profiles][errors]") {
  // Found by fuzz_model_json (fuzz/regressions/*/number-overflow).
  require_input_error(
      [] { loom::profiles::parse_json_text(R"({"layers": 46e650654})", "model.json"); },
      "model.json", "", {"not valid JSON", "number overflow"});
}
