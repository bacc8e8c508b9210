// What `loom plan` and `loom simulate` say in words, and the options that choose the head, the
// devices, the precision and the micro-batch the way users name them (docs/README.md).
#include <catch2/catch.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "profiles/cluster.hpp"
#include "profiles/loader.hpp"
#include "tests/tools/cli_sandbox.hpp"

using Catch::Contains;
using loom::test::CliResult;

namespace {

class Sandbox : public loom::test::CliSandbox {
 public:
  Sandbox() : CliSandbox("test-plan-text") {}
};

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// The line of `text` that starts with `prefix` ("" when none does).
std::string line_starting(const std::string& text, const std::string& prefix) {
  for (const std::string& line : lines_of(text)) {
    if (line.rfind(prefix, 0) == 0) return line;
  }
  return "";
}

// A Hugging Face masked-LM config as the Hub ships bert-base-cased's, scaled down.
constexpr const char* kHubConfig = R"({
  "architectures": ["BertForMaskedLM"], "model_type": "bert", "num_hidden_layers": 2,
  "hidden_size": 24, "num_attention_heads": 3, "intermediate_size": 48, "vocab_size": 100,
  "max_position_embeddings": 64, "type_vocab_size": 2})";

const std::string kNaiveSplit =
    "plan --model bert-base --cluster v100-32g-2x-pcie --global-batch 32 --seq-len 512 "
    "--stages 0-0,1-13 --micro-batch 32 --zero 0 --recompute none";

void require_error(const CliResult& r, const std::string& line) {
  INFO("stdout: " << r.out);
  CHECK(r.exit_code == 2);
  CHECK(r.out.empty());
  CHECK(r.err == line + "\n");
}

}  // namespace

TEST_CASE("loom plan says what it planned: head, precision, idle share, layers, one unit",
          "[tools][cli]") {
  Sandbox box;
  // The cluster at its datasheet values (the shipped file is calibrated), so that the figures
  // below follow from the values the comments name.
  // Without the host floor (costmodel/compute.hpp), whose defaults would add its share to
  // every pass: the figures are the kernels' alone.
  const std::string datasheet = (box.work() / "v100-datasheet.json").string();
  loom::profiles::Cluster v100 =
      loom::profiles::datasheet_cluster(loom::profiles::load_cluster("v100-32g-2x-pcie"));
  v100.device.host_launch_us = 0;
  v100.device.host_pass_us = 0;
  loom::profiles::write_file_atomically(datasheet, loom::profiles::cluster_to_json(v100).dump(2));
  std::string args = kNaiveSplit;
  args.replace(args.find("v100-32g-2x-pcie"), std::string("v100-32g-2x-pcie").size(), datasheet);
  const CliResult r = box.loom(args + " -o plan.json");
  INFO("stderr: " << r.err);
  REQUIRE(r.exit_code == 0);
  // The figures come from the GEMM shape model on V100's 80 SMs (its fp16 ceiling the 83 TFLOP/s
  // measured on a V100 at this PCIe part's clock, 74.4): BERT-base's 768-wide products at 16,384
  // tokens and the eager attention's scale, mask, softmax and dropout kernels over the 512^2
  // scores, under autocast (softmax and its dropout in fp32, with casts up and down).
  const std::vector<std::string> expected = {
      "model    bert-base (12 layers, hidden 768)", "head     classifier, 2 labels",
      "cluster  v100-32g-2x-pcie: 1 x 2 V100-PCIE-32GB",
      "job      global batch 32, seq 512, precision fp16 (the best the V100-PCIE-32GB runs; "
      "--precision to choose)",
      "runtime  loom (Loom's executor)",
      // No calibration of runtime loom on the V100 PCIe: the file's hardware values.
      "calibration none: the cluster's hardware values alone",
      "strategy dp=1 tp=1 pp=2 zero=0 micro-batch=32 micro-batches=1 schedule=1f1b "
      "recompute=none attention=math",
      "", "step time                389.144 ms", "samples/s                82.2",
      "tokens/s                 42103", "model TFLOP/s per GPU    11.92  (MFU 10.6 %)",
      "hw TFLOP/s per GPU       11.92", "peak memory              15.75 GiB of 32.00 GiB",
      // Half of the two GPUs' time is idle: stage 0 holds only the embedding, and waits for
      // stage 1 almost the whole step; the per-stage shares say so.
      "devices idle             50.6 % of the step (waiting on other stages or on communication); "
      "by stage: 0 99.5 %, 1 1.6 %",
      "pipeline bubble          0.2 % added to m x the slowest stage's time (Megatron's (p-1)/m "
      "for equal stages; not the idle share)",
      // The stages pass the fp32 residual stream (autocast).
      "exposed communication    dp 0.000 ms, tp 0.000 ms, pp 6.313 ms, zero 0.000 ms",
      "optimizer step           3.331 ms", "prediction               simulation", "",
      "stage  params      grads       optimizer   activations buffers     process     total       "
      "layers",
      // Loom's autocast keeps fp32 weights, gradients and moments (4 + 4 + 8 bytes for stage 1's
      // 85.6 M parameters: 0.32, 0.32, 0.64 GiB), and a layer keeps sbh (38 + 7as/h) = 94 sbh =
      // 1.18 GB at s = 512, b = 32 (13.22 GiB for 12); the buffers are the fp16 weight copies
      // (0.16), two cuBLAS workspaces (0.016) and the last layer's backward temporaries: the
      // unfused attention's dQ, dK, dV and its scores' fp32 gradient, 6 sbh + 4 as^2b = 0.45 GiB.
      // The process column is what each GPU process holds beyond the allocator's tensors: the
      // CUDA context (0.50 GiB), NCCL's buffers for the pipeline pair (1 peer x 8 channels x
      // 9.19 MiB = 0.072) and a tenth of the working buffers (less the workspaces) as the
      // allocator's fragmentation: stage 0 0.572 + 0.003 = 0.57, stage 1 0.572 + 0.060 = 0.63.
      // The step is 41 us longer than the bare transfers: NCCL's launch cost on the pipeline
      // send (collective_launch_us).
      "0      0.09 GiB    0.09 GiB    0.18 GiB    0.06 GiB    0.05 GiB    0.57 GiB    1.03 GiB    "
      "emb",
      "1      0.32 GiB    0.32 GiB    0.64 GiB    13.22 GiB   0.62 GiB    0.63 GiB    15.75 GiB   "
      "1-12 + "
      "head",
      "(emb = embedding, 0 in --stages; 1-12 = transformer layers; head = classifier, 13 in "
      "--stages)",
      "why: ranked by simulation of the top 1: 389.144 ms per step simulated (396.453 ms "
      "analytical)",
      "why: every dimension was pinned; evaluated as given",
      "why: stages 0-0 | 1-13 as pinned; slowest stage 378.944 ms per micro-batch"};
  CHECK(lines_of(r.out) == expected);

  // simulate prints the same summary, with its comparison in the same unit.
  const CliResult sim = box.loom("simulate plan.json");
  REQUIRE(sim.exit_code == 0);
  CHECK_THAT(sim.out, Contains("\nhead     classifier, 2 labels\n"));
  CHECK_THAT(sim.out, Contains("\ndevices idle             50.6 % of the step"));
  CHECK(line_starting(sim.out, "simulated step") ==
        "simulated step 389.144 ms; the plan recorded 389.144 ms (simulation, +0.0 %)");
  // The plan JSON keeps Megatron's figure under its own key.
  const nlohmann::json plan = nlohmann::json::parse(loom::test::read_all(box.work() / "plan.json"));
  CHECK(plan.at("predicted").at("bubble_fraction").get<double>() ==
        Approx(0.002108801).epsilon(1e-6));
}

TEST_CASE("loom plan on a CPU: per device, fp32 by default, no schedule without a pipeline",
          "[tools][cli]") {
  Sandbox box;
  const CliResult r = box.loom(
      "plan --model tiny-bert --cluster local-cpu --global-batch 16 --seq-len 64 --micro-batch 8 "
      "--gpus 2 --top 2");
  INFO("stderr: " << r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(line_starting(r.out, "job ") ==
        "job      global batch 16, seq 64, precision fp32 (what Loom computes in on CPUs; "
        "--precision to choose)");
  CHECK(line_starting(r.out, "strategy ") ==
        "strategy dp=2 tp=1 pp=1 zero=1 micro-batch=8 micro-batches=1 recompute=none "
        "attention=math");
  CHECK(line_starting(r.out, "model TFLOP/s") == "model TFLOP/s per device 0.02  (MFU 24.8 %)");
  CHECK(line_starting(r.out, "hw TFLOP/s") == "hw TFLOP/s per device    0.02");
  CHECK(line_starting(r.out, "peak memory") ==
        "peak memory              76.06 MiB of 12288.00 MiB");
  CHECK(line_starting(r.out, "pipeline bubble").empty());  // no pipeline
  CHECK(
      line_starting(r.out, "0      ") ==
      "0      18.24 MiB   18.24 MiB   18.24 MiB   21.32 MiB   0.00 MiB    76.06 MiB   emb + 1-4 + "
      "head");
  CHECK(
      line_starting(r.out, "  1 ") ==
      "  1   2   1   1    1     8       1 -               none       -    105.661 ms       151.4  "
      "24.8 %  76.06 MiB    optimizer");
  CHECK(r.out.find("schedule=") == std::string::npos);
  CHECK(r.out.find(" s per step") == std::string::npos);  // the reasons in ms too
}

TEST_CASE("loom plan reads a checkpoint folder and plans the head --num-labels asks for",
          "[tools][cli]") {
  Sandbox box;
  std::filesystem::create_directories(box.work() / "ckpt");
  box.write("ckpt/config.json", kHubConfig);
  const std::string plan =
      "plan --model ckpt --cluster local-cpu --global-batch 8 --seq-len 32 --micro-batch 4 ";
  // A masked-LM config is fine-tuned as a classifier with 2 labels unless told otherwise.
  const CliResult two = box.loom(plan + "-o two.json");
  INFO("stderr: " << two.err);
  REQUIRE(two.exit_code == 0);
  CHECK(line_starting(two.out, "model ") == "model    ckpt (2 layers, hidden 24)");
  CHECK(line_starting(two.out, "head ") == "head     classifier, 2 labels");
  CHECK(nlohmann::json::parse(loom::test::read_all(box.work() / "two.json"))
            .at("model")
            .at("num_labels") == 2);
  const CliResult three = box.loom(plan + "--num-labels 3 -o three.json");
  REQUIRE(three.exit_code == 0);
  CHECK(line_starting(three.out, "head ") == "head     classifier, 3 labels");
  CHECK(nlohmann::json::parse(loom::test::read_all(box.work() / "three.json"))
            .at("model")
            .at("num_labels") == 3);
  const CliResult lm = box.loom(plan + "--num-labels 0 -o lm.json");
  REQUIRE(lm.exit_code == 0);
  CHECK(line_starting(lm.out, "head ") == "head     masked-LM (tied to the word embedding)");
  CHECK(line_starting(lm.out, "(emb") ==
        "(emb = embedding, 0 in --stages; 1-2 = transformer layers; head = masked-LM head, 3 in "
        "--stages)");
  CHECK_FALSE(nlohmann::json::parse(loom::test::read_all(box.work() / "lm.json"))
                  .at("model")
                  .contains("num_labels"));
  // The language-model head costs more than the classifier.
  const CliResult json_two = box.loom(plan + "--json");
  const CliResult json_lm = box.loom(plan + "--num-labels 0 --json");
  REQUIRE(json_two.exit_code == 0);
  REQUIRE(json_lm.exit_code == 0);
  auto step = [](const CliResult& r) {
    return nlohmann::json::parse(r.out).at("plans").at(0).at("predicted").at("step_time_s");
  };
  CHECK(step(json_lm).get<double>() > step(json_two).get<double>());

  std::filesystem::create_directories(box.work() / "empty");
  box.write("empty/notes.txt", "no config here\n");
  require_error(box.loom("plan --model empty --cluster local-cpu --global-batch 8 --seq-len 32"),
                "loom plan: error: empty: a checkpoint folder holding config.json (a Hugging "
                "Face model's configuration), found a folder without one");
}

TEST_CASE("loom plan --gpus, --micro-batch-per-device and a precision the device lacks",
          "[tools][cli]") {
  Sandbox box;
  const std::string tiny =
      "plan --model tiny-bert --cluster dgx-a100-80g --global-batch 16 "
      "--seq-len 64 --tp 1 --pp 1 --zero 0 ";
  const CliResult two = box.loom(tiny + "--gpus 2 --micro-batch-per-device 4");
  INFO("stderr: " << two.err);
  REQUIRE(two.exit_code == 0);
  CHECK(line_starting(two.out, "cluster ") == "cluster  dgx-a100-80g: 1 x 2 A100-SXM4-80GB");
  CHECK(line_starting(two.out, "strategy ") ==
        "strategy dp=2 tp=1 pp=1 zero=0 micro-batch=4 micro-batches=2 recompute=none "
        "attention=flash");
  // The same plan as --micro-batch.
  auto without_timing = [](const std::string& out) { return out.substr(0, out.find("searched ")); };
  CHECK(without_timing(box.loom(tiny + "--gpus 2 --micro-batch 4").out) == without_timing(two.out));
  const CliResult sixteen = box.loom(tiny + "--gpus 16 --nodes 2 --micro-batch 1");
  REQUIRE(sixteen.exit_code == 0);
  CHECK(line_starting(sixteen.out, "cluster ") == "cluster  dgx-a100-80g: 2 x 8 A100-SXM4-80GB");

  require_error(box.loom(tiny + "--gpus 12"),
                "loom plan: error: --gpus: at most the 8 devices of one node of dgx-a100-80g, or "
                "a multiple of 8 (whole nodes), found 12");
  require_error(box.loom(tiny + "--gpus 16 --nodes 3"),
                "loom plan: error: --gpus: --gpus 16 is 2 nodes of 8 devices, but --nodes is 3: "
                "give one of them");
  require_error(box.loom(tiny + "--gpus 2 --micro-batch 4 --micro-batch-per-device 4"),
                "loom plan: error: --micro-batch-per-device: another name for --micro-batch: "
                "give one of them");
  require_error(box.loom("plan --model bert-base --cluster v100-32g-2x-pcie --global-batch 32 "
                         "--seq-len 128 --precision bf16"),
                "loom plan: error: --precision: the V100-PCIE-32GB has no bf16 rate in its "
                "peak_tflops: use --precision fp16 (the best it runs)");
  require_error(box.loom(tiny + "--num-labels -1"),
                "loom plan: error: --num-labels: expected a number >= 0, found -1 (see loom plan "
                "--help)");
}

TEST_CASE("loom plan --reduce-dtype: FSDP's reduction width, named and kept", "[tools][cli]") {
  Sandbox box;
  const std::string gpt2 =
      "plan --model gpt2 --cluster dgx-a100-80g --global-batch 64 --seq-len 1024 --dp 32 --tp 1 "
      "--pp 1 --zero 3 ";
  const CliResult bf16 = box.loom(gpt2 + "--runtime fsdp --reduce-dtype bf16 -o fsdp.json");
  INFO("stderr: " << bf16.err);
  REQUIRE(bf16.exit_code == 0);
  CHECK(line_starting(bf16.out, "runtime ") ==
        "runtime  fsdp (PyTorch FSDP's memory and overlap rules), gradients reduced in bf16");
  CHECK(nlohmann::json::parse(box.read("fsdp.json"))["job"]["reduce_dtype"] == "bf16");
  // loom validate runs Loom's executor, which reduces fp32 gradients: it compares with runtime
  // loom's prediction whatever the plan's reduce dtype.
  REQUIRE(box.loom("plan --model tiny-bert --cluster local-cpu --global-batch 4 --seq-len 16 "
                   "--dp 1 --tp 1 --pp 1 --micro-batch 4 --runtime fsdp --reduce-dtype bf16 "
                   "-o cpu.json")
              .exit_code == 0);
  const CliResult validated = box.loom("validate cpu.json --steps 2 --warmup 1");
  INFO("stderr: " << validated.err);
  CHECK(validated.exit_code == 0);
  CHECK_THAT(validated.out, Contains("compared with runtime loom's prediction"));
  require_error(box.loom(gpt2 + "--runtime loom --reduce-dtype bf16"),
                "loom plan: error: gpt2 on dgx-a100-80g: runtime loom reduces gradients in "
                "4-byte elements: reduce_dtype bf16 needs runtime fsdp, nemo or megatron (or no "
                "reduce_dtype)");
}

TEST_CASE("loom plan --optimizer-dtype: NeMo's bf16 optimizer states, named and kept",
          "[tools][cli]") {
  Sandbox box;
  const std::string llama =
      "plan --model llama2-7b --cluster dgx-h100 --gpus 8 --global-batch 64 --seq-len 4096 "
      "--dp 8 --tp 1 --pp 1 --cp 1 --precision bf16 --runtime nemo ";
  const CliResult bf16 = box.loom(llama + "--zero 2 --optimizer-dtype bf16 -o nemo.json");
  INFO("stderr: " << bf16.err);
  REQUIRE(bf16.exit_code == 0);
  CHECK_THAT(line_starting(bf16.out, "runtime "), Contains(", optimizer states in bf16"));
  const nlohmann::json plan = nlohmann::json::parse(box.read("nemo.json"));
  CHECK(plan["job"]["optimizer_dtype"] == "bf16");
  // The moments shrink from 8 to 4 bytes and the 2-byte remainders go: 6 B per parameter over
  // dp 8 less than the fp32 plan's (the bf16 weights, 2 B, count the parameters).
  const CliResult fp32 = box.loom(llama + "--zero 2 -o fp32.json");
  REQUIRE(fp32.exit_code == 0);
  const nlohmann::json& half = plan["predicted"]["memory_bytes_by_stage"][0];
  const nlohmann::json other = nlohmann::json::parse(box.read("fp32.json"));
  const nlohmann::json& full = other["predicted"]["memory_bytes_by_stage"][0];
  CHECK(full["optimizer"].get<double>() - half["optimizer"].get<double>() ==
        Approx(6.0 / 8 * half["parameters"].get<double>() / 2).epsilon(1e-9));
  require_error(box.loom(llama + "--zero 1 --optimizer-dtype bf16"),
                "loom plan: error: llama2-7b on dgx-h100: runtime nemo: optimizer_dtype bf16 is "
                "Apex DistributedFusedAdam's dtype: it needs zero=2 (Megatron-Core's optimizers "
                "keep fp32 states)");
}
