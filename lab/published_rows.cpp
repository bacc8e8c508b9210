// Mapping a published row to Loom's model, cluster, job and strategy (published_rows.hpp).
#include "lab/published_rows.hpp"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "costmodel/layers.hpp"
#include "costmodel/runtime_zero.hpp"
#include "planner/calibration_choice.hpp"
#include "profiles/errors.hpp"
#include "profiles/loader.hpp"

namespace loom::published {

namespace {

using nlohmann::json;

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text;
}

bool contains(const std::string& text, const std::string& part) {
  return lower(text).find(lower(part)) != std::string::npos;
}

// Typed access to one JSON object of a row, with errors that name the file and the JSON path.
class Fields {
 public:
  Fields(const json& value, std::string file, std::string path)
      : value_(value), file_(std::move(file)), path_(std::move(path)) {
    if (!value_.is_object()) throw InputError(file_, path_, "expected an object");
  }
  bool has(const char* key) const { return value_.contains(key) && !value_.at(key).is_null(); }
  std::optional<std::int64_t> integer(const char* key, std::int64_t min_value) const {
    if (!has(key)) return std::nullopt;
    const json& v = value_.at(key);
    if (!v.is_number_integer() || v.get<std::int64_t>() < min_value) {
      fail(key, "an integer >= " + std::to_string(min_value));
    }
    return v.get<std::int64_t>();
  }
  std::int64_t required_integer(const char* key, std::int64_t min_value) const {
    auto v = integer(key, min_value);
    if (!v) fail(key, "an integer >= " + std::to_string(min_value));
    return *v;
  }
  std::optional<double> number(const char* key) const {
    if (!has(key)) return std::nullopt;
    const json& v = value_.at(key);
    if (!v.is_number() || v.get<double>() < 0) fail(key, "a number >= 0");
    return v.get<double>();
  }
  std::optional<std::string> text(const char* key) const {
    if (!has(key)) return std::nullopt;
    if (!value_.at(key).is_string()) fail(key, "a string");
    return value_.at(key).get<std::string>();
  }
  std::string required_text(const char* key) const {
    auto v = text(key);
    if (!v) fail(key, "a string");
    return *v;
  }
  bool flag(const char* key) const {
    if (!has(key)) return false;
    if (!value_.at(key).is_boolean()) fail(key, "true or false");
    return value_.at(key).get<bool>();
  }
  Fields object(const char* key) const {
    if (!has(key)) fail(key, "an object");
    return Fields(value_.at(key), file_, path_ + "." + key);
  }
  [[noreturn]] void fail(const char* key, const std::string& what) const {
    throw InputError(file_, path_ + "." + key, "expected " + what);
  }

 private:
  const json& value_;
  std::string file_;
  std::string path_;
};

// The shipped cluster file for each GPU name the sources use, its device's name, and what the
// choice assumes.
struct GpuEntry {
  const char* gpu;
  const char* cluster;
  const char* device;  // the cluster file's device.name
  double memory_gib;   // 0: the cluster file's
  const char* assumption;
};
constexpr GpuEntry kGpus[] = {
    {"A100-SXM4-80GB", "dgx-a100-80g", "A100-SXM4-80GB", 0, nullptr},
    {"A100-80GB", "dgx-a100-80g", "A100-SXM4-80GB", 0,
     "A100 form factor not stated: SXM4 (DGX A100) assumed"},
    {"A100-SXM4-40GB", "dgx-a100-40g", "A100-SXM4-40GB", 0, nullptr},
    {"A100-40GB", "dgx-a100-40g", "A100-SXM4-40GB", 0,
     "A100 form factor not stated: SXM4 (DGX A100) assumed"},
    {"H100-SXM5-80GB", "dgx-h100", "H100-SXM5-80GB", 0, nullptr},
    {"H100-80GB", "dgx-h100", "H100-SXM5-80GB", 0,
     "H100 form factor not stated: SXM5 (DGX H100) assumed"},
    {"H100-SXM-96GB-HBM2e (500 W power limit)", "h100-96g-hbm2e", "H100-SXM-96GB-HBM2e", 0,
     "the 500 W power limit is not modelled (SXM peak rates)"},
    {"H100-SXM-HBM2e 94/95GB (lower TDP)", "h100-96g-hbm2e", "H100-SXM-96GB-HBM2e", 94,
     "the lower-TDP part is not modelled (SXM peak rates), 94 GiB of memory"},
    {"V100-SXM2-16GB", "dgx1-v100-16g", "V100-SXM2-16GB", 0, nullptr},
    {"V100-SXM2-32GB", "dgx1-v100-32g", "V100-SXM2-32GB", 0, nullptr},
    {"V100", "dgx2-v100-32g", "V100-SXM3-32GB", 0,
     "V100 memory and interconnect not stated: a DGX-2 (16 x V100 32GB, NVSwitch) assumed"},
};

constexpr double kGib = 1024.0 * 1024.0 * 1024.0;

costmodel::Runtime row_runtime(const Fields& row, std::vector<std::string>* assumptions);

// The GPU's cluster (`given`, else the shipped file for the GPU) sized as the row ran: its GPU
// count, GPUs per node and inter-node rate.
std::variant<profiles::Cluster, std::string> row_cluster(const Fields& row, const std::string& file,
                                                         const profiles::Cluster* given,
                                                         RowMapping* out) {
  const std::string gpu = row.required_text("gpu");
  const GpuEntry* entry = nullptr;
  for (const GpuEntry& e : kGpus) {
    if (gpu == e.gpu) entry = &e;
  }
  if (!entry && !(given && given->device.name == gpu)) {
    return "unknown GPU \"" + gpu + "\" (no cluster file for it)";
  }
  if (given && given->device.name != gpu && given->device.name != entry->device) {
    return "GPU \"" + gpu + "\" is not the cluster's device (" + given->device.name + ")";
  }
  if (entry && entry->assumption) out->assumptions.push_back(entry->assumption);
  out->cluster_file = given ? given->name : entry->cluster;
  // A shipped cluster gets the shipped calibration of the row's runtime on its device, as a plan
  // would (planner/calibration_choice.hpp); a given cluster is used as it is.
  std::vector<std::string> unused;
  const profiles::Cluster base =
      given ? *given
            : planner::with_calibration(profiles::load_cluster(entry->cluster),
                                        row_runtime(row, &unused), std::nullopt)
                  .cluster;
  ClusterSizing& sizing = out->sizing;
  if (entry && entry->memory_gib > 0) sizing.memory_gib = entry->memory_gib;
  if (auto n = row.integer("gpus", 1)) {
    sizing.gpus = *n;
  } else {
    out->assumptions.push_back("GPU count not stated: one GPU (the limit applies per GPU)");
  }
  sizing.gpus_per_node = row.integer("gpus_per_node", 1);
  if (row.has("interconnect")) {
    auto rate = row.object("interconnect").number("inter_node_gbps");
    if (rate && *rate > 0) sizing.inter_node_gbps = *rate;
  }
  try {
    return sized_cluster(base, sizing, file);
  } catch (const InputError& e) {
    return std::string("GPU count does not fit the cluster: ") + e.what();
  }
}

// The Llama key/value heads the row's model object leaves out: 8 for Llama 3 and for Llama 2's
// 34B and 70B (grouped-query attention), one per head for Llama 2 7B and 13B.
std::int64_t llama_kv_heads(const std::string& name) {
  if (contains(name, "llama-3") || contains(name, "llama-2-70b") || contains(name, "llama-2-34b")) {
    return 8;
  }
  return 0;
}

profiles::ModelSpec decoder_model(profiles::ModelSpec m, std::int64_t seq,
                                  std::vector<std::string>* assumptions) {
  m.family = profiles::Family::kDecoder;
  m.model_type = profiles::ModelType::kGpt2;
  m.max_positions = seq;
  if (contains(m.name, "mpt")) {
    // Loom's models have biases, so MPT's bias-free layers are counted with GPT-2's biases.
    m.tied_embeddings = true;
    assumptions->push_back("MPT has no biases: Loom counts GPT-2's");
  } else if (contains(m.name, "llama")) {
    m.model_type = profiles::ModelType::kLlama;
    m.gated_mlp = true;
    m.tied_embeddings = false;
    m.kv_heads = llama_kv_heads(m.name);
  } else if (contains(m.name, "gpt2")) {
    // The gpt2 checkpoints' config.json: activation_function gelu_new.
    m.tied_embeddings = true;
    m.activation = profiles::Activation::kGeluNew;
    m.max_positions = std::max<std::int64_t>(seq, 1024);
  }
  return m;
}

profiles::ModelSpec encoder_model(profiles::ModelSpec m, std::int64_t seq, const Fields& row) {
  m.family = profiles::Family::kEncoder;
  m.model_type = profiles::ModelType::kBert;
  m.max_positions = std::max<std::int64_t>(seq, 512);
  m.type_vocab = contains(m.name, "distilbert") ? 0 : 2;
  // GLUE MNLI classifies into 3 labels; SQuAD's span head gives 2 logits per token, the size of
  // the 2-label classifier Loom fine-tunes by default.
  m.num_labels = contains(row.text("notes").value_or(""), "mnli") ? 3 : 2;
  return m;
}

// The model object with the architecture details the row leaves to its name (published_rows.hpp).
profiles::ModelSpec row_model(const Fields& row, const std::string& file, const std::string& path,
                              std::vector<std::string>* assumptions) {
  const Fields f = row.object("model");
  profiles::ModelSpec m;
  m.name = f.required_text("name");
  m.layers = f.required_integer("layers", 1);
  m.hidden = f.required_integer("hidden", 1);
  m.heads = f.required_integer("heads", 1);
  m.ffn_hidden = f.required_integer("ffn_hidden", 1);
  m.vocab = f.required_integer("vocab", 1);
  const std::int64_t seq = f.required_integer("seq_len", 1);
  const std::string family = f.required_text("family");
  if (family == "decoder") {
    m = decoder_model(m, seq, assumptions);
  } else if (family == "encoder") {
    m = encoder_model(m, seq, row);
  } else {
    f.fail("family", "\"encoder\" or \"decoder\"");
  }
  if (auto v = f.integer("kv_heads", 0)) m.kv_heads = *v;
  if (auto v = f.text("mlp")) m.gated_mlp = *v == "swiglu";
  if (f.has("tied_embeddings")) m.tied_embeddings = f.flag("tied_embeddings");
  if (auto v = f.integer("max_positions", 1)) m.max_positions = std::max(*v, seq);
  if (auto v = f.integer("type_vocab", 0)) m.type_vocab = *v;
  if (auto v = f.integer("num_labels", 1)) m.num_labels = *v;
  profiles::validate_model(m, file + " " + path + ".model");
  return m;
}

// The runtime as published: NeMo, DeepSpeed, Megatron-LM, or PyTorch FSDP (Composer, fms-fsdp and
// torchtitan run it); plain data parallelism (DDP, Horovod, apex) is Loom's own runtime, whose
// data parallelism is DDP's: bucketed gradient all-reduces overlapped with the backward pass.
costmodel::Runtime row_runtime(const Fields& row, std::vector<std::string>* assumptions) {
  if (auto named = row.text("runtime")) {
    if (auto r = costmodel::parse_runtime(*named)) return *r;
    std::string names;
    for (const std::string& n : costmodel::runtime_names())
      names += (names.empty() ? "" : ", ") + n;
    row.fail("runtime", names);
  }
  const std::string framework = row.text("framework").value_or("");
  if (contains(framework, "xla")) assumptions->push_back("XLA's kernel fusion is not modelled");
  if (contains(framework, "nemo")) return costmodel::Runtime::kNemo;
  if (contains(framework, "megatron")) return costmodel::Runtime::kMegatron;
  if (contains(framework, "deepspeed") && !contains(framework, "no deepspeed")) {
    return costmodel::Runtime::kDeepspeed;
  }
  if (contains(framework, "fsdp") || contains(framework, "composer") ||
      contains(framework, "torchtitan")) {
    return costmodel::Runtime::kFsdp;
  }
  assumptions->push_back("plain data parallel (" + framework +
                         "): Loom's runtime, whose gradient all-reduce is DDP's");
  return costmodel::Runtime::kLoom;
}

// Recomputation as published into `s` (recompute and recompute_layers); the reason when Loom
// cannot express it. Checkpointing every n-th block with n not stated is taken as every 2nd:
// torchtitan's layer-interval option as its configurations set it ("2"), and what the FSDP
// blog's HFU / MFU ratios of 1.14-1.16 imply (an extra forward on about half the blocks).
std::optional<std::string> row_recompute(const std::string& text, std::int64_t layers,
                                         costmodel::Strategy& s,
                                         std::vector<std::string>* assumptions) {
  if (auto r = costmodel::parse_recompute(text)) {
    s.recompute = *r;
    return std::nullopt;
  }
  if (text.rfind("selective (attention core", 0) == 0) {
    // Megatron-Core's selective recomputation as NeMo names it: the attention core only.
    s.recompute = costmodel::Recompute::kSelective;
    return std::nullopt;
  }
  if (text == "selective op") {
    assumptions->push_back("torchtitan's per-operator checkpointing as selective recomputation");
    s.recompute = costmodel::Recompute::kSelective;
    return std::nullopt;
  }
  if (text == "selective layer" || contains(text, "every n-th")) {
    const std::int64_t chunk = costmodel::largest_chunk_layers(s, layers);
    if (chunk < 2) return "checkpointing every 2nd block of a one-layer chunk";
    s.recompute = costmodel::Recompute::kFull;
    s.recompute_layers = static_cast<int>(chunk / 2);
    assumptions->push_back(
        "checkpointing every n-th block (\"" + text + "\") as every 2nd: full recomputation of " +
        std::to_string(s.recompute_layers) + " of " + std::to_string(chunk) + " layers");
    return std::nullopt;
  }
  return "recompute \"" + text + "\" has no Loom equivalent";
}

// The optimizer's kernels as the source's training script runs them. Two step with a Python loop
// over the parameters: Hugging Face's Trainer without DeepSpeed (transformers 4.12 creates its
// own transformers.AdamW), and DeepLearningExamples' PyTorch BERT in fp32 and tf32 (run_squad.py
// creates BertAdam; in fp16 apex's FusedAdam). Every other engine's Adam is fused.
costmodel::OptimizerKernels row_optimizer_kernels(const std::string& framework,
                                                  costmodel::Precision precision,
                                                  std::vector<std::string>* assumptions) {
  if (contains(framework, "hugging face trainer") && contains(framework, "no deepspeed")) {
    assumptions->push_back("transformers.AdamW: a per-tensor loop (optimizer_kernels per_tensor)");
    return costmodel::OptimizerKernels::kPerTensor;
  }
  if (contains(framework, "apex amp o2") && costmodel::element_bytes(precision) == 4) {
    assumptions->push_back(
        "run_squad.py's BertAdam in fp32 and tf32: a per-tensor loop (optimizer_kernels "
        "per_tensor; its per-tensor gradient clipping is not counted)");
    return costmodel::OptimizerKernels::kPerTensor;
  }
  return costmodel::OptimizerKernels::kFused;
}

// The job and strategy as published; the reason when Loom cannot express them.
std::optional<std::string> row_job_strategy(const Fields& row, RowMapping* out) {
  const std::int64_t gpus = out->cluster.device_count();
  const std::string precision_text = row.required_text("precision");
  auto precision = profiles::parse_precision(precision_text);
  if (!precision) return "precision " + precision_text + ": Loom has no such precision";
  if (auto why = profiles::precision_refusal(out->cluster.device, *precision)) return *why;
  costmodel::Strategy& s = out->strategy;
  s.tp = static_cast<int>(row.integer("tp", 1).value_or(1));
  s.pp = static_cast<int>(row.integer("pp", 1).value_or(1));
  s.cp = static_cast<int>(row.integer("cp", 1).value_or(1));
  s.dp = static_cast<int>(row.integer("dp", 1).value_or(gpus / (std::int64_t{s.tp} * s.pp * s.cp)));
  s.zero = static_cast<int>(row.integer("zero", 0).value_or(0));
  if (s.zero > 3) row.fail("zero", "a ZeRO stage 0-3");
  // Megatron's interleaved 1F1B: model chunks per pipeline rank.
  s.virtual_stages = static_cast<int>(row.integer("virtual_stages", 1).value_or(1));
  if (s.virtual_stages > 1) s.schedule = costmodel::Schedule::kInterleaved;
  if (s.world_size() != gpus) {
    return std::string(s.cp > 1 ? "dp*tp*pp*cp = " : "dp*tp*pp = ") +
           std::to_string(s.world_size()) + " is not the " + std::to_string(gpus) + " GPUs";
  }
  auto micro_batch = row.integer("micro_batch", 1);
  if (!micro_batch) return "micro-batch not stated";
  s.micro_batch = *micro_batch;
  s.num_micro_batches = row.integer("grad_accum", 1).value_or(1);
  const std::int64_t global =
      row.integer("global_batch", 1)
          .value_or(std::int64_t{s.dp} * s.micro_batch * s.num_micro_batches);
  if (global != std::int64_t{s.dp} * s.micro_batch * s.num_micro_batches) {
    return "global batch " + std::to_string(global) + " is not dp*micro_batch*grad_accum";
  }
  if (auto why = row_recompute(row.text("recompute").value_or("none"), out->model.layers, s,
                               &out->assumptions)) {
    return why;
  }
  const std::string attention = row.text("attention").value_or("unknown");
  if (auto a = costmodel::parse_attention(attention)) {
    s.attention = *a;
  } else {
    out->assumptions.push_back("attention kernel \"" + attention + "\": math assumed");
  }
  s.sequence_parallel = row.flag("sequence_parallel");
  const std::string framework = row.text("framework").value_or("");
  // torchtitan's tensor parallelism is sequence parallel: its plan shards the norms' inputs and
  // outputs over the sequence (SequenceParallel on attention_norm, ffn_norm and norm, Shard(1)
  // between the blocks; apply_tp in torchtitan/parallelisms/parallelize_llama.py).
  if (s.tp > 1 && !row.has("sequence_parallel") && contains(framework, "torchtitan")) {
    s.sequence_parallel = true;
    out->assumptions.push_back("sequence parallel (torchtitan's tensor-parallel plan)");
  }
  costmodel::Job& job = out->job;
  job.global_batch = global;
  job.seq_len = row.object("model").required_integer("seq_len", 1);
  job.precision = *precision;
  job.runtime = row_runtime(row, &out->assumptions);
  // llm-foundry's MPT models train with its fused cross-entropy (loss_fn: fused_crossentropy,
  // flash-attn's kernel), which writes the logits' gradient in place.
  if (contains(framework, "llm-foundry")) {
    job.loss = costmodel::Loss::kFused;
    out->assumptions.push_back("llm-foundry's fused cross-entropy (loss_fn fused_crossentropy)");
  }
  // Gradients reduced in 16 bits: llm-foundry's benchmark runs set Composer's FSDP
  // mixed_precision PURE (scripts/train/benchmarking/submit_benchmarks.py), fms-fsdp's bf16
  // policy has reduce_dtype bf16 (fms_fsdp/policies/mixed_precision.py). torchtitan keeps its
  // default fp32 reduction, as the file's conditions state.
  // NeMo's performance runs reduce in bf16 (optim.grad_sync_dtype), as the file's conditions
  // state.
  if (job.runtime == costmodel::Runtime::kNemo) {
    job.reduce_precision = costmodel::Precision::kBf16;
    out->assumptions.push_back("gradients reduced in bf16 (NeMo's grad_sync_dtype)");
    // Nemotron-4 340B's configuration keeps the optimizer states in bf16 (optim.dtype bf16 in
    // launcher_scripts/conf/training/nemotron/nemotron_340b.yaml of NeMo-Framework-Launcher
    // 24.07); the others keep fp32.
    if (out->model.name == "Nemotron-340B" &&
        costmodel::megatron_optimizer(s.zero) ==
            costmodel::MegatronOptimizer::kDistributedFusedAdam) {
      job.optimizer_precision = costmodel::Precision::kBf16;
      out->assumptions.push_back("optimizer states in bf16 (the launcher's optim.dtype)");
    }
    // The performance configurations set ub_tp_comm_overlap (the file's conditions).
    job.tp_comm_overlap = true;
    if (s.tp > 1 && s.sequence_parallel) {
      out->assumptions.push_back("tp communication overlapped (NeMo's ub_tp_comm_overlap)");
    }
  }
  if (job.runtime == costmodel::Runtime::kFsdp && costmodel::element_bytes(job.precision) == 2 &&
      (contains(framework, "llm-foundry") || contains(framework, "fms-fsdp"))) {
    // fp8 jobs keep bf16 gradients: they are reduced in bf16.
    job.reduce_precision =
        job.precision == costmodel::Precision::kFp8 ? costmodel::Precision::kBf16 : job.precision;
    out->assumptions.push_back(std::string("gradients reduced in ") +
                               profiles::to_string(*job.reduce_precision) + " (" + framework +
                               "'s mixed precision)");
  }
  job.compile = contains(framework, "torch.compile");
  job.optimizer_kernels = row_optimizer_kernels(framework, job.precision, &out->assumptions);
  // DeepSpeed's autotuner reads forward + backward + step() over steps 3-5; at fp16 they overflow
  // the default initial loss scale (initial_scale_power 32, halved after two overflows and then
  // at each) and skip the update (DeepSpeed 0.5: runtime/constants.py, fp16/loss_scaler.py,
  // autotuning/constants.py start_profile_step and end_profile_step).
  if (job.runtime == costmodel::Runtime::kDeepspeed &&
      job.precision == costmodel::Precision::kFp16 &&
      contains(row.text("notes").value_or(""), "autotuner metric")) {
    out->timed_overflowed_steps = true;
    out->assumptions.push_back(
        "the autotuner's metric: steps skipped on fp16 overflow (no update, no weight gather)");
  }
  // apex AMP O2 and Keras mixed precision cast the model to 16 bits: no fp32 residual stream.
  if (costmodel::element_bytes(job.precision) == 2 &&
      (contains(framework, "AMP O2") || contains(framework, "Keras AMP"))) {
    job.half_model = true;
    out->assumptions.push_back("the model and its activations in 16 bits (" + framework + ")");
  }
  if (auto why_not = costmodel::check_strategy(out->model, gpus, job, s)) return *why_not;
  return std::nullopt;
}

}  // namespace

profiles::Cluster sized_cluster(const profiles::Cluster& base, const ClusterSizing& sizing,
                                const std::string& file) {
  profiles::Cluster cluster = base;
  if (sizing.memory_gib) {
    cluster.device.memory_bytes = static_cast<std::int64_t>(*sizing.memory_gib * kGib);
  }
  if (sizing.gpus_per_node && cluster.links.empty()) {
    cluster.devices_per_node = *sizing.gpus_per_node;
  }
  cluster = profiles::with_devices(cluster, sizing.gpus, file);
  if (sizing.inter_node_gbps && cluster.inter_node) {
    // The bus-bandwidth ceiling is a share of the link's rate: it scales with the row's rate.
    profiles::LinkClass& link = *cluster.inter_node;
    if (link.bus_bandwidth_gbps) {
      link.bus_bandwidth_gbps =
          *link.bus_bandwidth_gbps * *sizing.inter_node_gbps / link.bandwidth_gbps;
    }
    link.bandwidth_gbps = *sizing.inter_node_gbps;
  }
  return cluster;
}

MappedRow map_row(const nlohmann::json& row_json, const std::string& file, const std::string& path,
                  const profiles::Cluster* cluster_file) {
  const Fields row(row_json, file, path);
  RowMapping out;
  out.model = row_model(row, file, path, &out.assumptions);
  if (contains(out.model.name, "deberta")) {
    // Its attention adds content-to-position and position-to-content score products and their
    // gathers over relative positions to every layer: work BERT's attention has not.
    return std::string(
        "DeBERTa's disentangled attention: Loom's models have only BERT's and GPT's");
  }
  auto cluster = row_cluster(row, file, cluster_file, &out);
  if (auto* why = std::get_if<std::string>(&cluster)) return *why;
  out.cluster = std::get<profiles::Cluster>(std::move(cluster));
  if (auto why = row_job_strategy(row, &out)) return *why;
  return out;
}

}  // namespace loom::published
