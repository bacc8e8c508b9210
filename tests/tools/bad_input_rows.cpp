// The rows of the bad-input table: models, configs, clusters and calibrations a plan is made
// from, plan files, data, environment variables and flags (bad_input_rows.hpp).
#include "tests/tools/bad_input_rows.hpp"

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "tests/tools/cli_sandbox.hpp"

namespace loom::test::bad_input {

json valid_model() {
  return json::parse(R"({
    "format": "loom-model/1", "name": "micro-bert", "family": "encoder", "model_type": "bert",
    "layers": 2, "hidden": 24, "heads": 3, "ffn_hidden": 48, "vocab": 100, "max_positions": 64,
    "type_vocab": 2, "num_labels": 2})");
}

// The local-cpu cluster with `devices` devices.
json cpu_cluster(int devices) {
  json c = json::parse(
      read_all(std::filesystem::path(LOOM_SOURCE_DIR) / "profiles/clusters/local-cpu.json"));
  c["name"] = "cpu-" + std::to_string(devices);
  c["devices_per_node"] = devices;
  return c;
}

std::string text(const json& j) { return j.dump(2) + "\n"; }

namespace {

// The same model as a Hugging Face config.json.
json valid_hf_config() {
  return json::parse(R"({
    "architectures": ["BertForSequenceClassification"], "model_type": "bert",
    "num_hidden_layers": 2, "hidden_size": 24, "num_attention_heads": 3,
    "intermediate_size": 48, "vocab_size": 100, "max_position_embeddings": 64,
    "type_vocab_size": 2, "hidden_act": "gelu", "layer_norm_eps": 1e-12})");
}

json valid_gpt2_config() {
  return json::parse(R"({
    "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_layer": 2, "n_embd": 24,
    "n_head": 3, "n_positions": 64, "vocab_size": 100})");
}

json edited(json j, const std::function<void(json&)>& edit) {
  edit(j);
  return j;
}

// A safetensors file: the 8-byte little-endian header length (`declared_length`, or the header's
// real length when negative), the header, then `data`.
std::string safetensors(const std::string& header, const std::string& data,
                        std::int64_t declared_length = -1) {
  const auto length =
      static_cast<std::uint64_t>(declared_length < 0 ? header.size() : declared_length);
  std::string out;
  for (int i = 0; i < 8; ++i) out += static_cast<char>((length >> (8 * i)) & 0xFFU);
  return out + header + data;
}

// Plan commands on the tiny model.
std::string plan_with(const std::string& model, const std::string& cluster,
                      const std::string& extra = "") {
  return "plan --model " + model + " --cluster " + cluster +
         " --global-batch 8 --seq-len 32 --precision fp32" + (extra.empty() ? "" : " " + extra);
}

const std::string kPlan = plan_with("model.json", "cluster-1.json");

std::string train_with(const std::string& plan, const std::string& extra) {
  return "train " + plan + " " + extra;
}

// add(name, files, args, expected substrings, env): appends a row to `rows`.
auto row_adder(std::vector<Row>& rows) {
  return [&rows](std::string name, Files files, std::string args, std::vector<std::string> expected,
                 std::string env = "") {
    rows.push_back(Row{std::move(name), std::move(files), std::move(args), std::move(expected),
                       std::move(env)});
  };
}

// Rows for the files a plan is made from (models, configs, profiles, clusters) and loom plan's
// flags.
void add_input_file_rows(std::vector<Row>& rows) {
  const json model = valid_model();
  const json hf = valid_hf_config();
  const json cluster = cpu_cluster(1);
  using J = json&;
  auto add = row_adder(rows);

  // --- loom-model/1 files ---------------------------------------------------------------------
  add("model: missing field", {{"m.json", text(edited(model, [](J j) { j.erase("layers"); }))}},
      plan_with("m.json", "cluster-1.json"),
      {"m.json", "$.layers", "missing required field", "integer"});
  add("model: wrong type", {{"m.json", text(edited(model, [](J j) { j["hidden"] = "24"; }))}},
      plan_with("m.json", "cluster-1.json"),
      {"m.json", "$.hidden", "expected an integer", "found a string"});
  add("model: negative size", {{"m.json", text(edited(model, [](J j) { j["layers"] = -2; }))}},
      plan_with("m.json", "cluster-1.json"),
      {"m.json", "$.layers", "from 1 to 100000", "found -2"});
  add("model: heads not dividing hidden",
      {{"m.json", text(edited(model, [](J j) { j["heads"] = 7; }))}},
      plan_with("m.json", "cluster-1.json"),
      {"m.json", "$.heads", "divisor of hidden (24)", "found 7"});
  add("model: more layers than any model",
      {{"m.json", text(edited(model, [](J j) { j["layers"] = 1'000'000'000'000; }))}},
      plan_with("m.json", "cluster-1.json"),
      {"m.json", "$.layers", "from 1 to 100000", "found 1000000000000"});
  add("model: unknown field", {{"m.json", text(edited(model, [](J j) { j["hiden"] = 24; }))}},
      plan_with("m.json", "cluster-1.json"), {"m.json", "$.hiden", "unknown field"});
  add("model: newer format version",
      {{"m.json", text(edited(model, [](J j) { j["format"] = "loom-model/2"; }))}},
      plan_with("m.json", "cluster-1.json"),
      {"m.json", "$.format", "loom-model/2", "upgrade loom"});

  // --- Hugging Face config.json ---------------------------------------------------------------
  add("config.json: missing field",
      {{"hf/config.json", text(edited(hf, [](J j) { j.erase("num_hidden_layers"); }))}},
      plan_with("hf/config.json", "cluster-1.json"),
      {"hf/config.json", "$.num_hidden_layers", "missing required field"});
  add("config.json: zero size",
      {{"hf/config.json", text(edited(hf, [](J j) { j["intermediate_size"] = 0; }))}},
      plan_with("hf/config.json", "cluster-1.json"),
      {"hf/config.json", "$.intermediate_size", ">= 1", "found 0"});
  add("config.json: heads not dividing hidden",
      {{"hf/config.json", text(edited(hf, [](J j) { j["num_attention_heads"] = 5; }))}},
      plan_with("hf/config.json", "cluster-1.json"),
      {"hf/config.json", "$.num_attention_heads", "divisor of hidden_size (24)"});
  add("config.json: unsupported model_type",
      {{"hf/config.json", text(edited(hf, [](J j) { j["model_type"] = "t5"; }))}},
      plan_with("hf/config.json", "cluster-1.json"),
      {"hf/config.json", "$.model_type", "\"bert\"", "\"t5\""});
  add("config.json: gpt2 heads not dividing n_embd",
      {{"gpt/config.json", text(edited(valid_gpt2_config(), [](J j) { j["n_head"] = 5; }))}},
      plan_with("gpt/config.json", "cluster-1.json"),
      {"gpt/config.json", "$.n_head", "divisor of n_embd (24)"});

  // --- loom-profile/1 files (--profile) -------------------------------------------------------
  const json profile = json::parse(R"({"format": "loom-profile/1", "device": "cpu",
    "precision": "fp32", "layers": [{"kind": "encoder_layer", "hidden": 24, "heads": 3,
    "ffn_hidden": 48, "seq_len": 32, "micro_batch": 4, "forward_s": 0.001, "backward_s": 0.002,
    "activation_bytes": 1000, "parameter_bytes": 2000}]})");
  add("profile: missing field",
      {{"p.json", text(edited(profile, [](J j) { j["layers"][0].erase("forward_s"); }))}},
      kPlan + " --profile p.json", {"p.json", "$.layers[0].forward_s", "missing required field"});
  add("profile: negative time",
      {{"p.json", text(edited(profile, [](J j) { j["layers"][0]["backward_s"] = -1; }))}},
      kPlan + " --profile p.json", {"p.json", "$.layers[0].backward_s", "> 0"});
  add("profile: no layers in a chain",
      {{"p.json", text(edited(profile, [](J j) { j["layers"][0]["chained_layers"] = 0; }))}},
      kPlan + " --profile p.json", {"p.json", "$.layers[0].chained_layers", ">= 1, found 0"});
  add("profile: made for another model",
      {{"p.json", text(edited(profile, [](J j) { j["layers"][0]["hidden"] = 48; }))}},
      kPlan + " --profile p.json", {"p.json", "$.layers", "another model"});
  add("profile: another precision",
      {{"p.json", text(edited(profile, [](J j) { j["precision"] = "bf16"; }))}},
      kPlan + " --profile p.json", {"p.json", "$.precision", "\"fp32\""});
  add("profile: unknown collective",
      {{"p.json", text(edited(profile,
                              [](J j) {
                                j["links"] = json::array({{{"collective", "broadcast"},
                                                           {"ranks", 2},
                                                           {"bytes", 1024},
                                                           {"time_s", 0.001},
                                                           {"scope", "intra_node"}}});
                              }))}},
      kPlan + " --profile p.json", {"p.json", "$.links[0].collective", "allreduce"});

  // --- loom-cluster/1 files -------------------------------------------------------------------
  add("cluster: missing field",
      {{"c.json", text(edited(cluster, [](J j) { j["device"].erase("memory_bytes"); }))}},
      plan_with("model.json", "c.json"),
      {"c.json", "$.device.memory_bytes", "missing required field"});
  add("cluster: zero devices",
      {{"c.json", text(edited(cluster, [](J j) { j["devices_per_node"] = 0; }))}},
      plan_with("model.json", "c.json"),
      {"c.json", "$.devices_per_node", "from 1 to 1000000", "found 0"});
  add("cluster: negative bandwidth",
      {{"c.json", text(edited(cluster, [](J j) { j["intra_node"]["bandwidth_gbps"] = -2; }))}},
      plan_with("model.json", "c.json"),
      {"c.json", "$.intra_node.bandwidth_gbps", "> 0", "found -2"});
  add("cluster: more devices than any cluster",
      {{"c.json", text(edited(cluster, [](J j) { j["nodes"] = std::int64_t{1} << 40; }))}},
      plan_with("model.json", "c.json"),
      {"c.json", "$.nodes", "from 1 to 1000000", "found 1099511627776"});
  add("cluster: two nodes without inter_node",
      {{"c.json", text(edited(cluster, [](J j) { j["nodes"] = 2; }))}},
      plan_with("model.json", "c.json"), {"c.json", "$.inter_node", "nodes > 1"});

  // --- loom plan: flags and infeasible requests -----------------------------------------------
  add("flag: unknown flag", {}, kPlan + " --frobnicate", {"--frobnicate"});
  add("flag: negative tp", {}, kPlan + " --tp -2", {"--tp", "expected a number > 0", "found -2"});
  add("flag: not a number", {},
      "plan --model model.json --cluster cluster-1.json --global-batch eight "
      "--seq-len 32",
      {"--global-batch", "expected a number > 0", "found \"eight\""});
  add("flag: tp not dividing heads", {}, plan_with("model.json", "cluster-2.json", "--tp 2"),
      {"--tp", "tp=2", "3 attention heads", "micro-bert"});
  add("flag: more nodes than any cluster", {},
      plan_with("model.json", "dgx-a100-80g", "--nodes 1000000000"),
      {"--nodes", "at most 125000 nodes of 8 devices", "found 1000000000"});
  add("flag: more ranks than devices", {}, plan_with("model.json", "cluster-1.json", "--dp 2"),
      {"--dp", "2 ranks", "1 devices"});
  const std::string fp8 =
      "plan --model model.json --global-batch 64 --seq-len 32 --gpus 8 --precision fp8";
  add("flag: fp8 for Loom's executor", {}, fp8 + " --cluster dgx-h100",
      {"runtime loom", "no fp8 products", "runtime megatron or fsdp"});
  add("flag: fp8 on a device without it", {}, fp8 + " --cluster dgx-a100-80g --runtime megatron",
      {"--precision", "has no fp8 rate", "use --precision bf16"});
  add("flag: per-tensor AdamW under Megatron-LM", {},
      plan_with("model.json", "dgx-a100-80g",
                "--gpus 8 --runtime megatron --optimizer-kernels per_tensor"),
      {"runtime megatron runs its own fused Adam", "optimizer_kernels per_tensor",
       "runtime loom or fsdp"});
  add("plan: a request that cannot fit, with -o",
      {{"small.json",
        text(edited(cluster, [](J j) { j["device"]["memory_bytes"] = std::int64_t{1} << 30; }))}},
      plan_with("bert-large", "small.json", "-o out.json"),
      {"bert-large on small.json", "does not fit", "smallest memory need is",
       "device has 1.0 GiB"});
}

// Rows for runtime calibrations (--calibration): names, runtimes, ranges and fields.
void add_calibration_rows(std::vector<Row>& rows) {
  auto add = row_adder(rows);
  const std::string h100 = plan_with("model.json", "dgx-h100", "--gpus 8");
  add("calibration: unknown name", {}, h100 + " --calibration fsdp-h200",
      {"--calibration", "\"fsdp-h200\" is neither a file nor a built-in calibration", "fsdp-h100"});
  add("calibration: another runtime's", {}, h100 + " --runtime megatron --calibration fsdp-h100",
      {"--calibration", "runtime, megatron", "fsdp-h100 is of runtime fsdp"});
  add("calibration: a hardware value out of its range",
      {{"c.json", R"({"format": "loom-calibration/1", "name": "mine", "runtime": "loom",
          "device": "H100-SXM5-80GB", "parameters": {"intra_node.bus_bandwidth_gbps": 116}})"}},
      h100 + " --calibration c.json",
      {"c.json", "$.parameters.intra_node.bus_bandwidth_gbps",
       "hardware value within [311.1, "
       "402.6]",
       "found 116"});
  add("calibration: a misspelt field",
      {{"c.json", R"({"format": "loom-calibration/1", "name": "mine", "runtime": "loom",
          "device": "H100-SXM5-80GB", "parameter": {}})"}},
      h100 + " --calibration c.json", {"c.json", "$.parameters", "missing"});
}

// Rows for loom-plan/1 files and loom train's checks of a plan.
void add_plan_file_rows(std::vector<Row>& rows, const Plans& plans) {
  const json model = valid_model();
  const json hf = valid_hf_config();
  const json cluster = cpu_cluster(1);
  const json& plan = plans.one;
  const json& plan2 = plans.two;
  using J = json&;
  auto add = row_adder(rows);

  // --- loom-plan/1 files ----------------------------------------------------------------------
  add("plan file: missing field",
      {{"p.json", text(edited(plan, [](J j) { j.erase("strategy"); }))}}, "simulate p.json",
      {"p.json", "$.strategy", "missing required field"});
  add("plan file: wrong type",
      {{"p.json", text(edited(plan, [](J j) { j["strategy"]["dp"] = "1"; }))}}, "simulate p.json",
      {"p.json", "$.strategy.dp", "expected an integer", "found a string"});
  add("plan file: zero micro-batch",
      {{"p.json", text(edited(plan, [](J j) { j["strategy"]["micro_batch"] = 0; }))}},
      "simulate p.json", {"p.json", "$.strategy.micro_batch", ">= 1", "found 0"});
  add("plan file: a size beyond an int",
      {{"p.json",
        text(edited(plan, [](J j) { j["strategy"]["tp"] = (std::int64_t{1} << 32) + 1; }))}},
      "simulate p.json", {"p.json", "$.strategy.tp", "from 1 to 2147483647", "found 4294967297"});
  add("plan file: tp not dividing heads",
      {{"p.json", text(edited(plan2,
                              [](J j) {
                                j["strategy"]["dp"] = 1;
                                j["strategy"]["tp"] = 2;
                                j["strategy"]["num_micro_batches"] = 2;
                              }))}},
      "simulate p.json", {"p.json", "$.strategy", "tp=2", "3 attention heads"});
  add("plan file: made for another model (stages)",
      {{"p.json", text(edited(plan, [](J j) { j["model"]["layers"] = 1; }))}}, "simulate p.json",
      {"p.json", "$.stages", "partition of the layer sequence"});
  add("plan file: made for another cluster (devices)",
      {{"p.json", text(edited(plan2, [](J j) { j["cluster"]["devices_per_node"] = 1; }))}},
      "simulate p.json", {"p.json", "$.strategy", "2 ranks", "1 devices"});
  add("plan file: a rank on a device the cluster lacks",
      {{"p.json", text(edited(plan, [](J j) { j["ranks"][0]["device"] = "node0/gpu0"; }))}},
      "simulate p.json", {"p.json", "$.ranks[0].device", "a device of the plan's cluster"});
  add("plan file: fewer ranks than the strategy, with -o",
      {{"p.json", text(edited(plan2, [](J j) { j["ranks"].erase(1); }))}}, "slurm p.json -o job.sh",
      {"p.json", "$.ranks", "dp*tp*pp = 2", "found 1"});
  add("plan file: newer loom, with -o",
      {{"p.json", text(edited(plan, [](J j) { j["loom_version"] = "9.0.0"; }))}},
      "report p.json -o report.html", {"p.json", "$.loom_version", "upgrade loom"});
  add("plan file: not JSON, with -o", {{"p.json", "{\"format\": \"loom-plan/1\",\n"}},
      "report p.json -o report.html", {"p.json", "not valid JSON"});
  add("plan file: a cluster file given as a plan", {}, "simulate cluster-1.json",
      {"cluster-1.json", "$.format", "\"loom-plan/1\"", "\"loom-cluster/1\""});
  add("plan file: an extrapolated point without its source",
      {{"p.json", text(edited(plan,
                              [](J j) {
                                j["extrapolated"] = json::array(
                                    {{{"what", "head"}, {"wanted", "b=1"}, {"how", "scaled"}}});
                              }))}},
      "simulate p.json", {"p.json", "$.extrapolated[0].from", "missing required field"});
  add("profile --for: a plan file that is not a plan", {}, "profile --for cluster-1.json -o x.json",
      {"cluster-1.json", "$.format", "\"loom-plan/1\""});

  // --- loom train: world size, plan against checkpoint ----------------------------------------
  add("train: world size not matching the plan", {},
      train_with("plan.json", "--data synthetic:400 --steps 5"),
      {"plan.json", "$.strategy", "3 rank", "WORLD_SIZE", "dp*tp*pp = 1"}, "WORLD_SIZE=3 RANK=0");
  add("train: WORLD_SIZE not a number", {},
      train_with("plan.json", "--data synthetic:400 --steps 5"),
      {"WORLD_SIZE", "non-negative integer", "two"}, "WORLD_SIZE=two");
  add("train: a decoder's plan (loom train trains encoders)",
      {{"gpt-plan.json", text(edited(plan,
                                     [](J j) {
                                       j["model"]["family"] = "decoder";
                                       j["model"]["model_type"] = "gpt2";
                                       j["model"]["type_vocab"] = 0;
                                     }))}},
      train_with("gpt-plan.json", "--data synthetic:400 --steps 5"),
      {"gpt-plan.json", "$.model.model_type", "BERT or RoBERTa encoder", "gpt2"});
  add("train: an encoder whose MLP runs gelu_new (the executor's GeLU is exact)",
      {{"tanh-plan.json", text(edited(plan, [](J j) { j["model"]["activation"] = "gelu_new"; }))}},
      train_with("tanh-plan.json", "--data synthetic:400 --steps 5"),
      {"tanh-plan.json", "$.model.activation", "exact GeLU", "gelu_new"});
  add("train: --init of a checkpoint whose config.json says gelu_new",
      {{"tanh/config.json", text(edited(hf, [](J j) { j["hidden_act"] = "gelu_new"; }))}},
      train_with("plan.json", "--data synthetic:400 --steps 5 --init tanh"),
      {"tanh/config.json", "$.hidden_act", "gelu_new", "another model"});
  add("train: a plan with one label (the reviews have two)",
      {{"one.json", text(edited(plan, [](J j) { j["model"]["num_labels"] = 1; }))}},
      train_with("one.json", "--data synthetic:400 --steps 5"),
      {"one.json", "$.model.num_labels", "at least 2 labels", "found 1"});
  add("train: a plan with a language-model head",
      {{"lm.json", text(edited(plan, [](J j) { j["model"].erase("num_labels"); }))}},
      train_with("lm.json", "--data synthetic:400 --steps 5"),
      {"lm.json", "$.model.num_labels", "classification head", "--num-labels"});
  const json other = edited(hf, [](J j) { j["hidden_size"] = 48; });
  add("train: a plan made for another model than --init's config.json",
      {{"other/config.json", text(other)}},
      train_with("plan.json", "--data synthetic:400 --steps 5 --init other"),
      {"other/config.json", "$.hidden_size", "24", "48", "another model"});
}

// Rows for checkpoints, vocabularies, data sets and the flags of the other commands.
void add_data_and_flag_rows(std::vector<Row>& rows, const Plans& plans) {
  const json model = valid_model();
  const json hf = valid_hf_config();
  const json cluster = cpu_cluster(1);
  const json& plan = plans.one;
  using J = json&;
  auto add = row_adder(rows);

  // --- safetensors ----------------------------------------------------------------------------
  const std::string tensor_header =
      R"({"bert.embeddings.word_embeddings.weight":{"dtype":"F32","shape":[2,2],)"
      R"("data_offsets":[0,16]}})";
  const std::string init = "--data synthetic:400 --steps 5 --init init";
  add("safetensors: a header longer than the file",
      {{"init/config.json", text(hf)},
       {"init/model.safetensors", safetensors(tensor_header, std::string(16, '\0'), 1'000'000)}},
      train_with("plan.json", init), {"init/model.safetensors", "header", "truncated"});
  add("safetensors: data offsets past the buffer",
      {{"init/config.json", text(hf)},
       {"init/model.safetensors", safetensors(tensor_header, std::string(8, '\0'))}},
      train_with("plan.json", init),
      {"init/model.safetensors", "bert.embeddings.word_embeddings.weight", "8-byte", "end 16"});
  add("safetensors: a shape that does not match its bytes",
      {{"init/config.json", text(hf)},
       {"init/model.safetensors",
        safetensors(R"({"x":{"dtype":"F32","shape":[3,3],"data_offsets":[0,16]}})",
                    std::string(16, '\0'))}},
      train_with("plan.json", init),
      {"init/model.safetensors", "tensor \"x\"", "36 bytes", "16 bytes"});
  add("safetensors: a tensor of the wrong shape for the model",
      {{"init/config.json", text(hf)},
       {"init/model.safetensors", safetensors(tensor_header, std::string(16, '\0'))}},
      train_with("plan.json", init),
      {"init/model.safetensors", "bert.embeddings.word_embeddings.weight", "[100, 24]", "[2, 2]"});

  // --- vocab.txt ------------------------------------------------------------------------------
  add("vocab: no [UNK]", {{"v.txt", "[PAD]\n[CLS]\n[SEP]\n[MASK]\ngood\n"}},
      train_with("plan.json", "--data synthetic:400 --steps 5 --tokenizer v.txt"),
      {"v.txt", "[UNK]", "special tokens"});
  std::string big = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n";
  for (int i = 0; i < 200; ++i) big += "word" + std::to_string(i) + "\n";
  add("vocab: larger than the model's vocabulary", {{"v.txt", big}},
      train_with("plan.json", "--data synthetic:400 --steps 5 --tokenizer v.txt"),
      {"v.txt", "at most the model's 100 token ids", "found 204"});

  // --- CSV ------------------------------------------------------------------------------------
  const std::string csv = "--tokenizer vocab.txt --steps 5 --data ";
  add("csv: empty", {{"empty.csv", ""}}, train_with("plan.json", csv + "empty.csv"),
      {"empty.csv", "line 1", "review,sentiment"});
  add("csv: header only", {{"head.csv", "review,sentiment\n"}},
      train_with("plan.json", csv + "head.csv"), {"head.csv", "at least one review"});
  add("csv: unknown sentiment",
      {{"r.csv", "review,sentiment\n\"a good film\",positive\nmeh,maybe\n"}},
      train_with("plan.json", csv + "r.csv"),
      {"r.csv", "line 3", "field sentiment", "positive or negative", "maybe"});

  // --- aclImdb folders and other data ---------------------------------------------------------
  add("aclImdb: no reviews", {{"aclImdb/train/pos/", ""}, {"aclImdb/train/neg/", ""}},
      train_with("plan.json", csv + "aclImdb"),
      {"aclImdb/train", "at least one review", "pos/", "neg/"});
  add("aclImdb: no neg folder", {{"aclImdb/train/pos/0_9.txt", "a good film"}},
      train_with("plan.json", csv + "aclImdb"), {"aclImdb/train/neg", "a folder of reviews"});
  add("data: synthetic:0", {}, train_with("plan.json", "--steps 5 --data synthetic:0"),
      {"synthetic:0", "synthetic:N", "from 1"});

  // --- loom train, launch and the top level: flags --------------------------------------------
  add("train flag: zero steps", {}, train_with("plan.json", "--data synthetic:400 --steps 0"),
      {"--steps", "expected a number > 0", "found 0"});
  add("train flag: missing --data", {}, "train plan.json --steps 5", {"--data", "required"});
  add("launch flag: zero ranks", {},
      "launch --nproc 0 -- loom train plan.json --data synthetic --steps 5",
      {"--nproc", "expected a number > 0", "found 0"});
  // --- loom logits: a checkpoint folder's config and the ids --------------------------------
  const std::string hf_config = R"({"model_type": "bert", "num_hidden_layers": 1,
    "hidden_size": 16, "num_attention_heads": 2, "intermediate_size": 32, "vocab_size": 100,
    "max_position_embeddings": 64, "type_vocab_size": 2})";
  add("logits flag: no checkpoint folder", {{"ids.json", R"({"input_ids": [[2, 3]]})"}},
      "logits --init nowhere --ids ids.json", {"--init", "nowhere/config.json", "does not exist"});
  add("logits ids: not rows of integers",
      {{"hf/config.json", hf_config},
       {"hf/model.safetensors", "x"},
       {"ids.json", R"({"input_ids": [[2, "a", 3]]})"}},
      "logits --init hf --ids ids.json", {"ids.json", "$.input_ids[0][1]", "an integer"});
  add("logits: a checkpoint whose config.json says gelu_new",
      {{"tanh/config.json", R"({"model_type": "bert", "num_hidden_layers": 1, "hidden_size": 16,
         "num_attention_heads": 2, "intermediate_size": 32, "vocab_size": 100,
         "max_position_embeddings": 64, "type_vocab_size": 2, "hidden_act": "gelu_new"})"},
       {"tanh/model.safetensors", "x"},
       {"ids.json", R"({"input_ids": [[2, 3]]})"}},
      "logits --init tanh --ids ids.json",
      {"tanh/config.json", "$.hidden_act", "exact GeLU", "gelu_new"});
  // --- more refusals the contract asks for ------------------------------------------------------
  add("flag: a global batch beyond any job", {},
      "plan --model model.json --cluster cluster-1.json --global-batch 1000000000000 "
      "--seq-len 32",
      {"--global-batch", "at most 1000000 samples per step", "found 1000000000000"});
  add("flag: -o in a folder that does not exist", {},
      plan_with("model.json", "cluster-1.json", "-o nowhere/plan.json"),
      {"nowhere/plan.json", "existing folder"});
  add("plan file: a stage total that is not the sum",
      {{"p.json",
        text(edited(plan, [](J j) { j["predicted"]["memory_bytes_by_stage"][0]["total"] = -5; }))}},
      "simulate p.json", {"p.json", "$.predicted.memory_bytes_by_stage[0].total"});
  add("flag: a pinned micro-batch that does not divide the batch", {},
      plan_with("model.json", "cluster-1.json", "--micro-batch 3"),
      {"--micro-batch 3", "does not divide the 8 samples per data-parallel rank"});
  add("validate flag: data that is not there", {},
      "validate plan.json --steps 3 --data nowhere.csv",
      {"nowhere.csv", "synthetic", "no such file or folder"});
  add("plan: RoBERTa beyond its usable positions", {},
      "plan --model roberta-base --cluster cluster-1.json --global-batch 8 --seq-len 513",
      {"seq_len=513", "at most 512"});
  add("train flag: dropout not a probability", {},
      train_with("plan.json", "--data synthetic:400 --steps 5 --dropout nan"),
      {"--dropout", "a probability in [0, 1)", "found \"nan\""});
  add("train flag: negative seed", {},
      train_with("plan.json", "--data synthetic:400 --steps 5 --seed=-1"),
      {"--seed", "an integer from 0 to 18446744073709551615", "found \"-1\""});
  add("train flag: a seed beyond 64 bits", {},
      train_with("plan.json", "--data synthetic:400 --steps 5 --seed 18446744073709551616"),
      {"--seed", "found \"18446744073709551616\""});
  add("train flag: --checkpoint a file", {{"afile", "x"}},
      train_with("plan.json", "--data synthetic:400 --steps 5 --checkpoint afile"),
      {"--checkpoint", "a folder", "afile"});
  add("train flag: --output a file", {{"afile", "x"}},
      train_with("plan.json", "--data synthetic:400 --steps 1 --output afile"),
      {"--output", "afile is a file"});
  add("export: a folder that is no checkpoint", {{"empty/", ""}}, "export empty -o out",
      {"empty", "trainer_state.json"});
  add("data: synthetic beyond a million", {},
      train_with("plan.json", "--steps 5 --data synthetic:1000001"),
      {"synthetic:1000001", "from 1 to 1000000"});
  add("launch flag: more local ranks than a machine runs", {}, "launch --nproc 100000 -- true",
      {"--nproc", "at most 1024 local ranks", "found 100000"});
  add("slurm flag: minutes beyond 59", {}, "slurm plan.json --time 99:99:99 -o job.sh",
      {"--time", "minutes and seconds below 60", "found 99:99:99"});
  add("top level: unknown subcommand", {}, "frobnicate",
      {"\"frobnicate\" is not a subcommand", "expected one of", "plan", "train"});
}

}  // namespace

std::vector<Row> table(const Plans& plans) {
  std::vector<Row> rows;
  add_input_file_rows(rows);
  add_calibration_rows(rows);
  add_plan_file_rows(rows, plans);
  add_data_and_flag_rows(rows, plans);
  return rows;
}

}  // namespace loom::test::bad_input
