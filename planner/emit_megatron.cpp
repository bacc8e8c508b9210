// `loom plan --emit megatron`: Megatron-LM's command line. The rules cited are those of
// Megatron-LM's megatron/training/arguments.py (parse_args, validate_args) and
// megatron/core/transformer/pipeline_parallel_layer_layout.py.
#include <algorithm>
#include <string>
#include <vector>

#include "costmodel/runtime_zero.hpp"
#include "planner/emit_common.hpp"

namespace loom::planner::emit_detail {
namespace {

using costmodel::Recompute;
using profiles::Precision;

// Whether Loom's stages are Megatron-LM's default split: the same transformer layer count on
// every one of the pp * v chunks (Megatron-LM asserts layers divisible by pp, and by the layers
// per virtual stage), the embedding on the first, the head on the last.
bool megatron_even_split(const Plan& plan) {
  const std::int64_t chunks =
      static_cast<std::int64_t>(plan.strategy.pp) * std::max(1, plan.strategy.virtual_stages);
  const std::int64_t layers = plan.model.layers;
  if (chunks == 1) return true;
  if (layers % chunks != 0 || plan.stages.size() != static_cast<std::size_t>(chunks)) {
    return false;
  }
  return std::all_of(plan.stages.begin(), plan.stages.end(), [&](const costmodel::StageRange& r) {
    return layers_in(r, layers) == layers / chunks;
  });
}

// Loom's stages as --pipeline-model-parallel-layout: the pp * v chunks in model order (chunk k on
// pipeline rank k % pp, Megatron-LM's interleaving), separated by '|'; E the embedding, t*N N
// transformer layers, L the output layer and loss.
std::string pipeline_layout(const Plan& plan) {
  const std::int64_t layers = plan.model.layers;
  std::string out;
  for (std::size_t i = 0; i < plan.stages.size(); ++i) {
    const costmodel::StageRange& r = plan.stages[i];
    if (i > 0) out += "|";
    if (r.first_layer == 0) out += "E";
    const std::int64_t n = layers_in(r, layers);
    if (n == 1) out += "t";
    if (n > 1) out.append("t*").append(num(n));
    if (r.last_layer > layers) out += "L";
  }
  return out;
}

// "17/21/22/20": the transformer layers of each chunk.
std::string layer_counts(const Plan& plan) {
  std::string out;
  for (const costmodel::StageRange& r : plan.stages) {
    if (!out.empty()) out += "/";
    out += num(layers_in(r, plan.model.layers));
  }
  return out;
}

std::vector<std::string> model_args(const Plan& plan) {
  const profiles::ModelSpec& m = plan.model;
  std::vector<std::string> args = {
      "--num-layers " + num(m.layers),         "--hidden-size " + num(m.hidden),
      "--num-attention-heads " + num(m.heads), "--ffn-hidden-size " + num(m.ffn_hidden),
      "--seq-length " + num(plan.job.seq_len), "--max-position-embeddings " + num(m.max_positions),
  };
  if (m.key_value_heads() != m.heads) {
    args.emplace_back("--group-query-attention");
    args.push_back("--num-query-groups " + num(m.key_value_heads()));
  }
  if (m.gated_mlp) {
    // The cost model reads a gated MLP as the Llama family: RMSNorm, rotary positions, no
    // biases, an output matrix of its own.
    for (const char* a : {"--swiglu", "--normalization RMSNorm", "--position-embedding-type rope",
                          "--disable-bias-linear", "--untie-embeddings-and-output-weights"}) {
      args.emplace_back(a);
    }
  }
  if (m.family == profiles::Family::kDecoder) {
    // Loom's decoders train without dropout (costmodel/compute.cpp); Megatron-LM's defaults are
    // 0.1 for both. Encoders keep them, as Loom's encoders do.
    args.emplace_back("--attention-dropout 0.0");
    args.emplace_back("--hidden-dropout 0.0");
  } else {
    // examples/bert/pretrain_bert.py without next-sentence prediction's binary head.
    args.emplace_back("--bert-no-binary-head");
  }
  return args;
}

void parallel_args(const Plan& plan, std::vector<std::string>* args) {
  const costmodel::Strategy& s = plan.strategy;
  args->push_back("--tensor-model-parallel-size " + num(s.tp));
  args->push_back("--pipeline-model-parallel-size " + num(s.pp));
  // TransformerEngine's ring of key/value sends (cp_comm_type p2p, the default), as predicted.
  if (s.cp > 1) args->push_back("--context-parallel-size " + num(s.cp));
  if (!megatron_even_split(plan)) {
    // One layout for uneven, interleaved and unevenly interleaved splits alike; it sets the
    // virtual stages too (validate_args: layout stages / pp).
    args->push_back("--pipeline-model-parallel-layout \"" + pipeline_layout(plan) + "\"");
  } else if (s.virtual_stages > 1) {
    args->push_back("--num-layers-per-virtual-pipeline-stage " +
                    num(plan.model.layers / (static_cast<std::int64_t>(s.pp) * s.virtual_stages)));
  }
  if (s.sequence_parallel && s.tp > 1) {
    args->emplace_back("--sequence-parallel");
    // TransformerEngine's overlap of the tp all-gathers and reduce-scatters with the GEMMs, as
    // the plan predicts it (Job::tp_comm_overlap); validate_args allows it only with sequence
    // parallelism.
    if (plan.job.tp_comm_overlap) args->emplace_back("--tp-comm-overlap");
  }
}

void training_args(const Plan& plan, std::vector<std::string>* args) {
  const costmodel::Strategy& s = plan.strategy;
  args->push_back("--micro-batch-size " + num(s.micro_batch));
  args->push_back("--global-batch-size " + num(plan.job.global_batch));
  if (s.recompute == Recompute::kSelective) args->emplace_back("--recompute-granularity selective");
  if (s.recompute == Recompute::kFull) {
    args->emplace_back("--recompute-granularity full");
    // block: the first N layers of each model chunk recompute, the rest keep their activations;
    // uniform with one layer per group recomputes every layer.
    args->emplace_back(s.recompute_layers > 0 ? "--recompute-method block"
                                              : "--recompute-method uniform");
    args->push_back("--recompute-num-layers " + num(std::max(1, s.recompute_layers)));
  }
  const bool distributed =
      costmodel::megatron_optimizer(s.zero) == costmodel::MegatronOptimizer::kDistributed;
  if (distributed) args->emplace_back("--use-distributed-optimizer");
  // Gradients are reduced over the dp x cp ranks that share weights (gradient_view).
  const int data_ranks = costmodel::gradient_view(s).dp;
  if (data_ranks > 1) args->emplace_back("--overlap-grad-reduce");
  if (data_ranks > 1 && distributed) args->emplace_back("--overlap-param-gather");
  // The gradient buffer in bf16, as the plan's reduce_dtype predicts it.
  if (plan.job.reduce_precision == Precision::kBf16) {
    args->emplace_back("--grad-reduce-in-bf16");
  }
  if (plan.job.precision == Precision::kBf16) args->emplace_back("--bf16");
  if (plan.job.precision == Precision::kFp16) args->emplace_back("--fp16");
  if (plan.job.precision == Precision::kFp8) {
    // TransformerEngine's delayed scaling: e4m3 forward, e5m2 gradients, bf16 everywhere else;
    // the scale from the largest amax of the last 1024 steps (TransformerConfig's defaults are
    // one step, the most recent).
    for (const char* a :
         {"--bf16", "--transformer-impl transformer_engine", "--fp8-format hybrid",
          "--fp8-recipe delayed", "--fp8-amax-history-len 1024", "--fp8-amax-compute-algo max"}) {
      args->emplace_back(a);
    }
  }
  // --attention-backend (TransformerConfig.attention_backend, AttnBackend); --use-flash-attn
  // is parsed but no longer read.
  args->emplace_back(s.attention == costmodel::Attention::kFlash ? "--attention-backend flash"
                                                                 : "--attention-backend unfused");
}

// The comments before the command: what the arguments leave out and why the environment is set.
std::string comments(const Plan& plan) {
  const costmodel::Strategy& s = plan.strategy;
  std::string out = "# data, tokenizer, optimizer and schedule arguments are yours to add\n";
  if (plan.model.family == profiles::Family::kEncoder) {
    out +=
        "# encoder: Megatron-LM's BERT script, examples/bert/pretrain_bert.py, pretrains the "
        "masked-LM head (--bert-no-binary-head: without next-sentence prediction); Loom "
        "planned a sequence classifier (" +
        num(plan.model.num_labels.value_or(2)) +
        " labels): the same arguments drive your own classifier script on Megatron-LM's "
        "BertModel\n";
  }
  if (plan.job.precision == Precision::kTf32) {
    out +=
        "# tf32: fp32 training with TF32 matrix products; Megatron-LM does not enable them "
        "and PyTorch's matmul default is off: TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 (cuDNN's "
        "default is on)\n";
  }
  if (s.tp > 1) {
    out +=
        "# tp > 1: validate_args asserts CUDA_DEVICE_MAX_CONNECTIONS=1 before Blackwell (the "
        "tp communication kernels queue ahead of the compute they overlap)\n";
  }
  if (!megatron_even_split(plan)) {
    out += "# Loom's stages (" + layer_counts(plan) +
           " transformer layers) as the layout: E embedding, t layer, L output and loss, | "
           "between stages\n";
  }
  return out + torchrun_nodes_comment(plan);
}

}  // namespace

std::string megatron(const Plan& plan) {
  std::vector<std::string> args = model_args(plan);
  parallel_args(plan, &args);
  training_args(plan, &args);
  std::string env;
  if (plan.job.precision == Precision::kTf32) env += "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 ";
  if (plan.strategy.tp > 1) env += "CUDA_DEVICE_MAX_CONNECTIONS=1 ";
  const char* script = plan.model.family == profiles::Family::kEncoder
                           ? "examples/bert/pretrain_bert.py"
                           : "pretrain_gpt.py";
  std::string out = header(plan, "Megatron-LM") + comments(plan);
  out += env + torchrun(plan) + " " + script;
  for (const std::string& a : args) out += " \\\n    " + a;
  return out + "\n";
}

}  // namespace loom::planner::emit_detail
