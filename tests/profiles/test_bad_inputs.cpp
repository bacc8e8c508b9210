// Bad inputs: one row (kRows) or test per kind of mistake in a loom-model/1 file, a Hugging Face
// config.json and a loom-cluster/1 file. Each starts from a valid document, changes one thing, and
// checks that the InputError names the source, the JSON path and what was expected; the tests are
// the mistakes that take more than one change or another reader.
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

// Which valid document a row changes, read by its reader.
enum class Doc { kModel, kHf, kGpt2, kCluster, kLinkedCluster };

// One mistake: the document, its one change as a JSON Patch (RFC 6902), and the InputError it
// must give (the JSON path, and words the expectation contains).
struct BadRow {
  const char* what;
  Doc doc;
  const char* patch;
  const char* path;
  std::initializer_list<std::string> words;
};

void require_row_error(const BadRow& row) {
  INFO(row.what);
  switch (row.doc) {
    case Doc::kModel:
      require_model_error(valid_model().patch(json::parse(row.patch)), row.path, row.words);
      return;
    case Doc::kHf:
      require_hf_error(valid_hf_config().patch(json::parse(row.patch)), row.path, row.words);
      return;
    case Doc::kGpt2:
      require_hf_error(valid_gpt2_config().patch(json::parse(row.patch)), row.path, row.words);
      return;
    case Doc::kCluster:
      require_cluster_error(valid_cluster().patch(json::parse(row.patch)), row.path, row.words);
      return;
    case Doc::kLinkedCluster:
      require_cluster_error(valid_linked_cluster().patch(json::parse(row.patch)), row.path,
                            row.words);
      return;
  }
}

}  // namespace

// One row per kind of mistake that one change to a valid document makes.
const BadRow kRows[] = {
    {"loom-model: missing required field",
     Doc::kModel,
     R"([{"op": "remove", "path": "/layers"}])",
     "$.layers",
     {"missing required field", "integer"}},
    {"loom-model: null for a required field",
     Doc::kModel,
     R"([{"op": "add", "path": "/vocab", "value": null}])",
     "$.vocab",
     {"missing required field"}},
    {"loom-model: missing format",
     Doc::kModel,
     R"([{"op": "remove", "path": "/format"}, {"op": "remove", "path": "/model_type"}])",
     "$.format",
     {"missing required field", "string"}},
    {"loom-model: string where an integer is expected",
     Doc::kModel,
     R"([{"op": "add", "path": "/hidden", "value": "1024"}])",
     "$.hidden",
     {"expected an integer", "found a string"}},
    {"loom-model: non-integer number for an integer",
     Doc::kModel,
     R"([{"op": "add", "path": "/layers", "value": 12.5}])",
     "$.layers",
     {"expected an integer", "found a number"}},
    {"loom-model: integral float for an integer",
     Doc::kModel,
     R"([{"op": "add", "path": "/layers", "value": 24.0}])",
     "$.layers",
     {"expected an integer", "found a number"}},
    {"loom-model: wrong type for a boolean",
     Doc::kModel,
     R"([{"op": "add", "path": "/tied_embeddings", "value": "yes"}])",
     "$.tied_embeddings",
     {"true or false", "found a string"}},
    {"loom-model: zero size",
     Doc::kModel,
     R"([{"op": "add", "path": "/heads", "value": 0}])",
     "$.heads",
     {">= 1", "found 0"}},
    {"loom-model: negative size",
     Doc::kModel,
     R"([{"op": "add", "path": "/vocab", "value": -30522}])",
     "$.vocab",
     {">= 1", "found -30522"}},
    {"loom-model: zero labels",
     Doc::kModel,
     R"([{"op": "add", "path": "/num_labels", "value": 0}])",
     "$.num_labels",
     {">= 1", "found 0"}},
    {"loom-model: heads that do not divide hidden",
     Doc::kModel,
     R"([{"op": "add", "path": "/heads", "value": 15}])",
     "$.heads",
     {"divisor of hidden", "1024", "found 15"}},
    {"loom-model: unknown field (a typo)",
     Doc::kModel,
     R"([{"op": "add", "path": "/hiden", "value": 1024}])",
     "$.hiden",
     {"unknown field"}},
    {"loom-model: wrong format string",
     Doc::kModel,
     R"([{"op": "add", "path": "/format", "value": "loom-cluster/1"}])",
     "$.format",
     {"\"loom-model/1\"", "\"loom-cluster/1\""}},
    {"loom-model: newer format version",
     Doc::kModel,
     R"([{"op": "add", "path": "/format", "value": "loom-model/2"}])",
     "$.format",
     {"\"loom-model/2\"", "newer", "unknown", "upgrade"}},
    {"loom-model: value outside the allowed choices",
     Doc::kModel,
     R"([{"op": "add", "path": "/family", "value": "causal"}])",
     "$.family",
     {"\"encoder\"", "\"decoder\"", "found \"causal\""}},
    {"loom-model: token types on a decoder",
     Doc::kModel,
     R"([{"op": "add", "path": "/family", "value": "decoder"}, {"op": "add", "path": "/model_type", "value": "gpt2"}, {"op": "add", "path": "/type_vocab", "value": 2}])",
     "$.type_vocab",
     {"decoder"}},
    {"loom-model: empty name",
     Doc::kModel,
     R"([{"op": "add", "path": "/name", "value": ""}])",
     "$.name",
     {"non-empty"}},
    {"config.json: missing required field",
     Doc::kHf,
     R"([{"op": "remove", "path": "/hidden_size"}])",
     "$.hidden_size",
     {"missing required field", "integer"}},
    // Unknown keys are normal in a config.json (dropout, activation, ...), so a typo shows up as
    // the field it should have been.
    {"config.json: a typo is a missing field",
     Doc::kHf,
     R"([{"op": "copy", "from": "/hidden_size", "path": "/hiden_size"}, {"op": "remove", "path": "/hidden_size"}])",
     "$.hidden_size",
     {"missing required field"}},
    {"config.json: gpt2 without n_positions or n_ctx",
     Doc::kGpt2,
     R"([{"op": "remove", "path": "/n_positions"}, {"op": "remove", "path": "/n_ctx"}])",
     "$.n_ctx",
     {"missing required field"}},
    {"config.json: string where an integer is expected",
     Doc::kHf,
     R"([{"op": "add", "path": "/num_hidden_layers", "value": "12"}])",
     "$.num_hidden_layers",
     {"expected an integer", "found a string"}},
    {"config.json: non-integer number for an integer",
     Doc::kHf,
     R"([{"op": "add", "path": "/intermediate_size", "value": 3072.5}])",
     "$.intermediate_size",
     {"expected an integer", "found a number"}},
    {"config.json: zero size",
     Doc::kHf,
     R"([{"op": "add", "path": "/vocab_size", "value": 0}])",
     "$.vocab_size",
     {">= 1", "found 0"}},
    {"config.json: num_attention_heads that does not divide hidden_size",
     Doc::kHf,
     R"([{"op": "add", "path": "/num_attention_heads", "value": 11}])",
     "$.num_attention_heads",
     {"divisor of hidden_size", "768", "found 11"}},
    {"config.json: n_head that does not divide n_embd",
     Doc::kGpt2,
     R"([{"op": "add", "path": "/n_head", "value": 7}])",
     "$.n_head",
     {"divisor of n_embd", "768", "found 7"}},
    {"config.json: model_type of the wrong type",
     Doc::kHf,
     R"([{"op": "add", "path": "/model_type", "value": 2}])",
     "$.model_type",
     {"\"bert\"", "found an integer"}},
    {"config.json: a classifier with an empty id2label",
     Doc::kHf,
     R"([{"op": "add", "path": "/id2label", "value": {}}])",
     "$.id2label",
     {"at least one label"}},
    {"config.json: a classifier with zero num_labels",
     Doc::kHf,
     R"([{"op": "add", "path": "/num_labels", "value": 0}])",
     "$.num_labels",
     {">= 1", "found 0"}},
    {"config.json: wrong type for tie_word_embeddings",
     Doc::kHf,
     R"([{"op": "add", "path": "/tie_word_embeddings", "value": 1}])",
     "$.tie_word_embeddings",
     {"true or false", "found an integer"}},
    {"loom-cluster: string where an integer is expected",
     Doc::kCluster,
     R"([{"op": "add", "path": "/nodes", "value": "4"}])",
     "$.nodes",
     {"expected an integer", "found a string"}},
    {"loom-cluster: string where a number is expected",
     Doc::kCluster,
     R"([{"op": "add", "path": "/inter_node/bandwidth_gbps", "value": "200 GB/s"}])",
     "$.inter_node.bandwidth_gbps",
     {"expected a number", "found a string"}},
    {"loom-cluster: non-integer number for an integer",
     Doc::kCluster,
     R"([{"op": "add", "path": "/devices_per_node", "value": 7.5}])",
     "$.devices_per_node",
     {"expected an integer", "found a number"}},
    {"loom-cluster: an integer too large",
     Doc::kCluster,
     R"([{"op": "add", "path": "/device/memory_bytes", "value": 18446744073709551615}])",
     "$.device.memory_bytes",
     {"expected an integer", "too large"}},
    {"loom-cluster: wrong format string",
     Doc::kCluster,
     R"([{"op": "add", "path": "/format", "value": "loom-model/1"}])",
     "$.format",
     {"\"loom-cluster/1\"", "\"loom-model/1\""}},
    {"loom-cluster: newer format version",
     Doc::kCluster,
     R"([{"op": "add", "path": "/format", "value": "loom-cluster/2"}])",
     "$.format",
     {"\"loom-cluster/2\"", "newer", "upgrade"}},
    {"loom-cluster: value outside the allowed choices",
     Doc::kCluster,
     R"([{"op": "add", "path": "/device/kind", "value": "tpu"}])",
     "$.device.kind",
     {"\"gpu\"", "\"cpu\"", "found \"tpu\""}},
    {"loom-cluster: several nodes without inter_node",
     Doc::kCluster,
     R"([{"op": "remove", "path": "/inter_node"}])",
     "$.inter_node",
     {"nodes > 1", "nodes = 4"}},
    {"loom-cluster: links that are not an array",
     Doc::kLinkedCluster,
     R"([{"op": "add", "path": "/links", "value": {}}])",
     "$.links",
     {"expected an array", "found an object"}},
    {"loom-cluster: link with a missing field",
     Doc::kLinkedCluster,
     R"([{"op": "remove", "path": "/links/1/bandwidth_gbps"}])",
     "$.links[1].bandwidth_gbps",
     {"missing required field"}},
    {"loom-cluster: link from a device to itself",
     Doc::kLinkedCluster,
     R"([{"op": "add", "path": "/links/0/b", "value": "node0/gpu0"}])",
     "$.links[0].b",
     {"different endpoint", "node0/gpu0"}},
};

TEST_CASE("bad inputs: each row's one change is refused with its path and expectation",
          "[profiles][errors]") {
  for (const BadRow& row : kRows) require_row_error(row);
}

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

TEST_CASE("loom-model: family inconsistent with model_type", "[profiles][errors][model]") {
  json j = valid_model();
  j["family"] = "decoder";
  j.erase("type_vocab");
  require_model_error(j, "$.family", {"\"encoder\"", "\"bert\""});

  json gpt = valid_model();
  gpt["model_type"] = "gpt2";  // a GPT-2 model_type in an encoder
  require_model_error(gpt, "$.family", {"\"decoder\"", "\"gpt2\""});
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

TEST_CASE("config.json: negative size", "[profiles][errors][hf]") {
  json j = valid_hf_config();
  j["max_position_embeddings"] = -512;
  require_hf_error(j, "$.max_position_embeddings", {">= 1", "found -512"});

  json t = valid_hf_config();
  t["type_vocab_size"] = -1;
  require_hf_error(t, "$.type_vocab_size", {">= 0", "found -1"});
}

TEST_CASE("config.json: unsupported model_type", "[profiles][errors][hf]") {
  json j = valid_hf_config();
  j["model_type"] = "gemma";
  require_hf_error(
      j, "$.model_type",
      {"\"bert\"", "\"roberta\"", "\"gpt2\"", "\"llama\"", "\"qwen2\"", "found \"gemma\""});
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
