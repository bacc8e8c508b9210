#include "costmodel/strategy.hpp"

#include <nlohmann/json.hpp>

#include "costmodel/runtime.hpp"
#include "profiles/errors.hpp"
#include "profiles/json_reader.hpp"

namespace loom::costmodel {

const char* to_string(Recompute recompute) {
  switch (recompute) {
    case Recompute::kNone:
      return "none";
    case Recompute::kSelective:
      return "selective";
    case Recompute::kFull:
      return "full";
  }
  return "none";
}

std::optional<Recompute> parse_recompute(const std::string& text) {
  if (text == "none") return Recompute::kNone;
  if (text == "selective") return Recompute::kSelective;
  if (text == "full") return Recompute::kFull;
  return std::nullopt;
}

const char* to_string(Attention attention) {
  return attention == Attention::kFlash ? "flash" : "math";
}

std::optional<Attention> parse_attention(const std::string& text) {
  if (text == "math") return Attention::kMath;
  if (text == "flash") return Attention::kFlash;
  return std::nullopt;
}

const char* to_string(Runtime runtime) {
  switch (runtime) {
    case Runtime::kLoom:
      return "loom";
    case Runtime::kMegatron:
      return "megatron";
    case Runtime::kDeepspeed:
      return "deepspeed";
    case Runtime::kFsdp:
      return "fsdp";
    case Runtime::kNemo:
      return "nemo";
  }
  return "loom";
}

std::vector<std::string> runtime_names() {
  std::vector<std::string> names;
  for (Runtime r :
       {Runtime::kLoom, Runtime::kMegatron, Runtime::kDeepspeed, Runtime::kFsdp, Runtime::kNemo}) {
    names.emplace_back(to_string(r));
  }
  return names;
}

std::optional<Runtime> parse_runtime(const std::string& text) {
  if (text == "loom") return Runtime::kLoom;
  if (text == "megatron") return Runtime::kMegatron;
  if (text == "deepspeed") return Runtime::kDeepspeed;
  if (text == "fsdp") return Runtime::kFsdp;
  if (text == "nemo") return Runtime::kNemo;
  return std::nullopt;
}

int layer_sequence_length(const profiles::ModelSpec& model) {
  return static_cast<int>(model.layers) + 2;
}

std::vector<StageRange> even_partition(const profiles::ModelSpec& model, int chunks) {
  std::vector<StageRange> out;
  int layers = static_cast<int>(model.layers);
  int next = 1;  // first transformer layer in the sequence
  for (int c = 0; c < chunks; ++c) {
    int count = layers / chunks + (c < layers % chunks ? 1 : 0);
    StageRange r{next, next + count - 1};
    if (c == 0) r.first_layer = 0;
    next += count;
    if (c == chunks - 1) r.last_layer = layers + 1;
    out.push_back(r);
  }
  return out;
}

namespace {
std::string num(std::int64_t v) { return std::to_string(v); }

// Context parallelism's own conditions (context_parallel.hpp): a sequence in 2 cp equal chunks,
// and the fused attention kernel, which TransformerEngine's ring runs block by block.
std::optional<std::string> check_context_parallel(const Job& job, const Strategy& s) {
  if (s.cp == 1) return std::nullopt;
  if (job.seq_len % (2 * std::int64_t{s.cp}) != 0) {
    return "context parallelism cuts each sequence into 2*cp chunks: cp=" + num(s.cp) +
           " needs seq_len=" + num(job.seq_len) + " to be a multiple of " +
           num(2 * std::int64_t{s.cp});
  }
  if (s.attention != Attention::kFlash) {
    return "context parallelism (cp=" + num(s.cp) +
           ") runs the fused attention kernel block by block: it needs attention=flash";
  }
  if (s.sequence_parallel && rank_tokens(job, s) % s.tp != 0) {
    return "sequence parallelism needs tp=" + num(s.tp) + " to divide each cp rank's " +
           num(rank_tokens(job, s)) + " tokens";
  }
  return std::nullopt;
}

}  // namespace

Strategy gradient_view(const Strategy& s) {
  Strategy out = s;
  out.dp = s.dp * s.cp;
  out.cp = 1;
  return out;
}

std::optional<std::string> check_strategy(const profiles::ModelSpec& model, std::int64_t devices,
                                          const Job& job, const Strategy& s) {
  if (s.dp < 1 || s.tp < 1 || s.pp < 1 || s.cp < 1) return "dp, tp, pp and cp must be >= 1";
  if (s.zero < 0 || s.zero > 3) return "zero must be 0, 1, 2 or 3 (found " + num(s.zero) + ")";
  if (s.micro_batch < 1) return "micro-batch must be >= 1";
  if (s.num_micro_batches < 1) return "the number of micro-batches must be >= 1";
  if (s.world_size() > devices) {
    if (s.cp > 1) {
      return "dp*tp*pp*cp = " + num(s.dp) + "*" + num(s.tp) + "*" + num(s.pp) + "*" + num(s.cp) +
             " = " + num(s.world_size()) + " ranks, but the cluster has " + num(devices) +
             " devices";
    }
    return "dp*tp*pp = " + num(s.dp) + "*" + num(s.tp) + "*" + num(s.pp) + " = " +
           num(s.world_size()) + " ranks, but the cluster has " + num(devices) + " devices";
  }
  if (auto why = check_context_parallel(job, s)) return why;
  if (model.heads % s.tp != 0) {
    return "tp=" + num(s.tp) + " does not divide the " + num(model.heads) + " attention heads";
  }
  if (model.key_value_heads() % s.tp != 0) {
    return "tp=" + num(s.tp) + " does not divide the " + num(model.key_value_heads()) +
           " key/value heads";
  }
  if (model.ffn_hidden % s.tp != 0) {
    return "tp=" + num(s.tp) + " does not divide ffn_hidden=" + num(model.ffn_hidden);
  }
  if (s.recompute_layers < 0 || s.recompute_layers > model.layers) {
    return "recompute_layers=" + num(s.recompute_layers) + " must be between 1 and the " +
           num(model.layers) + " transformer layers (0 = every layer)";
  }
  if (s.recompute_layers > 0 && s.recompute != Recompute::kFull) {
    return std::string(
               "recompute_layers counts the layers that recompute in full: it needs "
               "recompute=full (found recompute=") +
           to_string(s.recompute) + ")";
  }
  if (s.sequence_parallel && s.tp == 1) {
    return "sequence parallelism shards the sequence over the tensor-parallel group: it needs "
           "tp > 1 (found tp=1)";
  }
  if (s.sequence_parallel && job.seq_len % s.tp != 0) {
    return "sequence parallelism needs tp=" + num(s.tp) + " to divide seq_len=" + num(job.seq_len);
  }
  if (auto why = check_schedule(s.schedule, s.pp, s.num_micro_batches, s.virtual_stages)) {
    return why;
  }
  std::int64_t chunks = static_cast<std::int64_t>(s.pp) * s.virtual_stages;
  if (chunks > model.layers) {
    return "pp*v = " + num(chunks) + " pipeline chunks but only " + num(model.layers) +
           " transformer layers";
  }
  if (s.dp * s.micro_batch * s.num_micro_batches != job.global_batch) {
    return "dp*micro_batch*micro_batches = " + num(s.dp) + "*" + num(s.micro_batch) + "*" +
           num(s.num_micro_batches) + " = " + num(s.dp * s.micro_batch * s.num_micro_batches) +
           " is not the global batch " + num(job.global_batch);
  }
  if (job.seq_len > profiles::max_sequence_length(model)) {
    return "seq_len=" + num(job.seq_len) +
           " exceeds the model's max_positions=" + num(model.max_positions) +
           (model.model_type == profiles::ModelType::kRoberta
                ? " less the 2 positions RoBERTa reserves (at most " +
                      num(profiles::max_sequence_length(model)) + ")"
                : std::string());
  }
  // What the job's runtime cannot run (runtime.hpp).
  return runtime_refusal(job, s);
}

std::optional<std::string> check_partition(const profiles::ModelSpec& model, const Strategy& s,
                                           const std::vector<StageRange>& stages) {
  std::size_t chunks = static_cast<std::size_t>(s.pp) * s.virtual_stages;
  if (stages.size() != chunks) {
    return "expected " + num(static_cast<std::int64_t>(chunks)) + " stages (pp*v), found " +
           num(static_cast<std::int64_t>(stages.size()));
  }
  int next = 0;
  for (std::size_t i = 0; i < stages.size(); ++i) {
    if (stages[i].first_layer != next || stages[i].last_layer < stages[i].first_layer) {
      return "stage " + num(static_cast<std::int64_t>(i)) + " must start at layer " + num(next) +
             " and end at or after it (found " + num(stages[i].first_layer) + ".." +
             num(stages[i].last_layer) + ")";
    }
    next = stages[i].last_layer + 1;
  }
  if (next != layer_sequence_length(model)) {
    return "stages must cover layers 0.." + num(layer_sequence_length(model) - 1) +
           " (embedding, " + num(model.layers) + " transformer layers, head); they end at " +
           num(next - 1);
  }
  return std::nullopt;
}

std::string describe(const Strategy& s) {
  std::string out = "dp=" + std::to_string(s.dp) + " tp=" + std::to_string(s.tp) +
                    " pp=" + std::to_string(s.pp) + " zero=" + std::to_string(s.zero) +
                    " micro-batch=" + std::to_string(s.micro_batch) +
                    " micro-batches=" + std::to_string(s.num_micro_batches) +
                    " schedule=" + to_string(s.schedule);
  if (s.virtual_stages > 1) out += " virtual-stages=" + std::to_string(s.virtual_stages);
  out += std::string(" recompute=") + to_string(s.recompute);
  if (s.recompute_layers > 0) out += " recompute-layers=" + std::to_string(s.recompute_layers);
  if (s.sequence_parallel) out += " sequence-parallel";
  if (s.attention == Attention::kFlash) out += " attention=flash";
  if (s.cp > 1) out += " cp=" + std::to_string(s.cp);
  return out;
}

std::int64_t largest_chunk_layers(const Strategy& s, std::int64_t layers) {
  const std::int64_t chunks = std::max<std::int64_t>(1, std::int64_t{s.pp} * s.virtual_stages);
  return std::max<std::int64_t>(1, (layers + chunks - 1) / chunks);
}

double recompute_share(const Strategy& s, std::int64_t layers) {
  if (s.recompute == Recompute::kNone) return 0;
  if (s.recompute_layers <= 0) return 1;
  const std::int64_t largest = largest_chunk_layers(s, layers);
  return static_cast<double>(std::min<std::int64_t>(s.recompute_layers, largest)) /
         static_cast<double>(largest);
}

bool recomputes_part(const Strategy& s, std::int64_t layers) {
  const double share = recompute_share(s, layers);
  return share > 0 && share < 1;
}

std::string recompute_cell(const Strategy& s) {
  std::string out = to_string(s.recompute);
  if (s.recompute_layers > 0) out += "(" + std::to_string(s.recompute_layers) + ")";
  return out;
}

nlohmann::json strategy_to_json(const Strategy& s) {
  nlohmann::json out = {{"dp", s.dp},
                        {"tp", s.tp},
                        {"pp", s.pp},
                        {"zero", s.zero},
                        {"micro_batch", s.micro_batch},
                        {"num_micro_batches", s.num_micro_batches},
                        {"schedule", to_string(s.schedule)},
                        {"virtual_stages", s.virtual_stages},
                        {"recompute", to_string(s.recompute)},
                        {"sequence_parallel", s.sequence_parallel},
                        {"attention", to_string(s.attention)}};
  if (s.recompute_layers > 0) out["recompute_layers"] = s.recompute_layers;
  if (s.cp > 1) out["cp"] = s.cp;
  return out;
}

Strategy strategy_from_json(const nlohmann::json& value, const std::string& source,
                            const std::string& path) {
  profiles::ObjectReader r(value, source, path);
  Strategy s;
  constexpr std::int64_t kIntMax = profiles::ObjectReader::kIntMax;  // read into ints
  s.dp = static_cast<int>(r.integer("dp", 1, kIntMax));
  s.tp = static_cast<int>(r.integer("tp", 1, kIntMax));
  s.pp = static_cast<int>(r.integer("pp", 1, kIntMax));
  s.zero = static_cast<int>(r.integer("zero", 0, 3));
  s.micro_batch = r.integer("micro_batch", 1);
  // A million micro-batches per step is far beyond any real job, and keeps the simulator's task
  // graph (a few tasks per micro-batch and layer) within memory.
  s.num_micro_batches = r.integer("num_micro_batches", 1, 1'000'000);
  s.schedule = *parse_schedule(r.choice("schedule", schedule_names()));
  s.virtual_stages = static_cast<int>(r.optional_integer("virtual_stages", 1, kIntMax).value_or(1));
  s.recompute = *parse_recompute(r.choice("recompute", {"none", "selective", "full"}));
  s.recompute_layers =
      static_cast<int>(r.optional_integer("recompute_layers", 1, kIntMax).value_or(0));
  s.sequence_parallel = r.optional_boolean("sequence_parallel").value_or(false);
  if (r.has("attention")) s.attention = *parse_attention(r.choice("attention", {"math", "flash"}));
  s.cp = static_cast<int>(r.optional_integer("cp", 1, kIntMax).value_or(1));
  r.finish();
  return s;
}

const char* to_string(Loss loss) { return loss == Loss::kFused ? "fused" : "eager"; }

std::optional<Loss> parse_loss(const std::string& text) {
  if (text == "eager") return Loss::kEager;
  if (text == "fused") return Loss::kFused;
  return std::nullopt;
}

const char* to_string(OptimizerKernels kernels) {
  switch (kernels) {
    case OptimizerKernels::kFused:
      return "fused";
    case OptimizerKernels::kForeach:
      return "foreach";
    case OptimizerKernels::kPerTensor:
      return "per_tensor";
  }
  return "fused";
}

std::optional<OptimizerKernels> parse_optimizer_kernels(const std::string& text) {
  if (text == "fused") return OptimizerKernels::kFused;
  if (text == "foreach") return OptimizerKernels::kForeach;
  if (text == "per_tensor") return OptimizerKernels::kPerTensor;
  return std::nullopt;
}

nlohmann::json job_to_json(const Job& j) {
  nlohmann::json out = {{"global_batch", j.global_batch},
                        {"seq_len", j.seq_len},
                        {"precision", profiles::to_string(j.precision)},
                        {"optimizer", j.optimizer},
                        {"runtime", to_string(j.runtime)}};
  if (j.optimizer_kernels != OptimizerKernels::kFused) {
    out["optimizer_kernels"] = to_string(j.optimizer_kernels);
  }
  if (j.loss != Loss::kEager) out["loss"] = to_string(j.loss);
  if (j.compile) out["compile"] = true;
  if (j.half_model) out["half_model"] = true;
  if (j.reduce_precision) out["reduce_dtype"] = profiles::to_string(*j.reduce_precision);
  if (j.optimizer_precision) {
    out["optimizer_dtype"] = profiles::to_string(*j.optimizer_precision);
  }
  if (j.tp_comm_overlap) out["tp_comm_overlap"] = true;
  return out;
}

Job job_from_json(const nlohmann::json& value, const std::string& source, const std::string& path) {
  profiles::ObjectReader r(value, source, path);
  Job j;
  j.global_batch = r.integer("global_batch", 1, kMaxGlobalBatch);
  j.seq_len = r.integer("seq_len", 1);
  j.precision =
      *profiles::parse_precision(r.choice("precision", {"fp32", "tf32", "fp16", "bf16", "fp8"}));
  j.optimizer = r.optional_string("optimizer").value_or("adamw");
  if (j.optimizer != "adamw") r.fail("optimizer", "expected \"adamw\" (the only optimizer so far)");
  if (r.has("optimizer_kernels")) {
    j.optimizer_kernels =
        *parse_optimizer_kernels(r.choice("optimizer_kernels", {"fused", "foreach", "per_tensor"}));
  }
  if (r.has("runtime")) {
    j.runtime = *parse_runtime(r.choice("runtime", runtime_names()));
  }
  if (r.has("loss")) j.loss = *parse_loss(r.choice("loss", {"eager", "fused"}));
  j.compile = r.optional_boolean("compile").value_or(false);
  j.half_model = r.optional_boolean("half_model").value_or(false);
  j.tp_comm_overlap = r.optional_boolean("tp_comm_overlap").value_or(false);
  if (r.has("reduce_dtype")) {
    j.reduce_precision =
        profiles::parse_precision(r.choice("reduce_dtype", {"fp32", "bf16", "fp16"}));
  }
  if (r.has("optimizer_dtype")) {
    j.optimizer_precision =
        profiles::parse_precision(r.choice("optimizer_dtype", {"fp32", "bf16"}));
  }
  r.finish();
  return j;
}

}  // namespace loom::costmodel
