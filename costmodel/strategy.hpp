// Strategy and Job: how one training step is parallelised, and what the step trains.
//
// Plain values with JSON forms (the "strategy" and "job" objects of loom-plan/1, docs/formats.md).
// The layer sequence a plan partitions is [embedding, transformer layer 0 .. L-1, head]: L + 2
// entries, so `StageRange` indices run from 0 (embedding) to L + 1 (head), inclusive.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "costmodel/schedule.hpp"
#include "profiles/cluster.hpp"
#include "profiles/model_spec.hpp"

namespace loom::costmodel {

using profiles::Precision;

enum class Recompute { kNone, kSelective, kFull };

const char* to_string(Recompute recompute);
std::optional<Recompute> parse_recompute(const std::string& text);

// What a runtime's selective recomputation recomputes (RuntimeRules::selective):
//   kAttentionCore  Megatron-LM's (Korthikanti et al. 2022, section 5): the attention core
//                   (scores, softmax, dropout, the product with V); everything else is kept
//   kOperators      torchtitan's per-operator policy: the layer keeps its input, the outputs of
//                   every other matrix product (the 1st, 3rd, ... in execution order) and of the
//                   fused attention kernel, and recomputes the rest (the other products and the
//                   elementwise kernels) in its backward pass
enum class SelectivePolicy { kAttentionCore, kOperators };

// The attention kernels a plan runs: `math` is the unfused product, softmax and product that
// keeps the s x s score matrix for backward; `flash` is a fused kernel (FlashAttention, PyTorch's
// scaled_dot_product_attention) that keeps none and recomputes the scores in its backward pass.
enum class Attention { kMath, kFlash };

const char* to_string(Attention attention);
std::optional<Attention> parse_attention(const std::string& text);

// The training runtime a plan's prediction describes: Loom's own executor, or the memory and
// overlap rules of Megatron-LM, DeepSpeed, PyTorch FSDP or NeMo (Megatron-Core with Apex's
// distributed optimizer) running the same strategy.
enum class Runtime { kLoom, kMegatron, kDeepspeed, kFsdp, kNemo };

const char* to_string(Runtime runtime);
std::optional<Runtime> parse_runtime(const std::string& text);
// Every runtime's name, in the enum's order: the one list the CLI and the readers choose from.
std::vector<std::string> runtime_names();

// A language model's loss kernel: `eager` is PyTorch's cross_entropy on fp32 logits (what
// torchtitan and Hugging Face models run: its backward pass allocates fp32 gradients of the
// log-probabilities and of the logits); `fused` writes its gradient in place (llm-foundry's
// fused_crossentropy; Megatron-LM's vocab-parallel loss always does).
enum class Loss { kEager, kFused };

const char* to_string(Loss loss);
std::optional<Loss> parse_loss(const std::string& text);

// How the optimizer step issues AdamW's work (costmodel/optimizer.hpp times each):
//   kFused      one kernel over every tensor (torch.optim.AdamW(fused=True), apex's and
//               DeepSpeed's FusedAdam, Megatron-LM's, Loom's executor on CUDA)
//   kForeach    PyTorch's multi-tensor path: each of AdamW's operations as one launch over
//               lists of tensors (torch.optim.AdamW's default on CUDA since PyTorch 2.0)
//   kPerTensor  a Python loop over the tensors, each operation its own kernel
//               (torch.optim.AdamW(foreach=False), Hugging Face's transformers.AdamW)
enum class OptimizerKernels { kFused, kForeach, kPerTensor };

const char* to_string(OptimizerKernels kernels);
std::optional<OptimizerKernels> parse_optimizer_kernels(const std::string& text);

// The largest global batch Loom plans and reads (samples per step): far above real jobs, and
// small enough that a step of one-sample micro-batches stays within num_micro_batches' bound.
inline constexpr std::int64_t kMaxGlobalBatch = 1'000'000;

struct Job {
  std::int64_t global_batch = 1;  // samples per optimizer step, 1..kMaxGlobalBatch
  std::int64_t seq_len = 128;
  Precision precision = Precision::kBf16;
  std::string optimizer = "adamw";
  // JSON "optimizer_kernels", default "fused" (written when another). Only the runtimes whose
  // engines let the user choose take another (RuntimeRules::refusal); Loom's executor runs
  // fused, and `loom validate` predicts its run so (executor_job).
  OptimizerKernels optimizer_kernels = OptimizerKernels::kFused;
  Runtime runtime = Runtime::kLoom;  // JSON "runtime", default "loom"
  Loss loss = Loss::kEager;          // JSON "loss", default "eager" (written when fused)
  // torch.compile (Inductor) around each block: its elementwise chains run as fused kernels
  // (compute.hpp, KernelFusions::compiled). Only runtimes that run PyTorch's Python models take
  // it (RuntimeRules::compiles). JSON "compile", default false (written when true).
  bool compile = false;
  // A 16-bit job whose engine keeps the model and its activations in 16 bits (apex AMP O2,
  // Keras mixed precision) where the runtime would train under autocast (RuntimeRules::autocast:
  // fp32 residual stream, LayerNorm and softmax in fp32). Describes runs of other engines that
  // Loom's runtime models (plain data parallelism); Loom's executor always uses autocast. JSON
  // "half_model", default false (written when true).
  bool half_model = false;
  // The dtype the data-parallel gradient reduction sends (FSDP's MixedPrecision.reduce_dtype,
  // DeepSpeed's communication_data_type); unset = the runtime's own (RuntimeRules::
  // reduce_bytes_per_parameter). JSON "reduce_dtype": "fp32" | "bf16" | "fp16", absent = unset.
  std::optional<Precision> reduce_precision = std::nullopt;
  // The dtype of the optimizer's states (Apex DistributedFusedAdam's dtype, NeMo's optim.dtype):
  // unset = fp32 master weights and moments. bf16 keeps both moments in bf16 and no master
  // weights (the bf16 weights are updated in place): runtime nemo at zero 2
  // (RuntimeRules::sets_optimizer_dtype). JSON "optimizer_dtype": "fp32" | "bf16", absent = unset.
  std::optional<Precision> optimizer_precision = std::nullopt;
  // TransformerEngine's userbuffers overlap of the tensor-parallel collectives with the linear
  // layers' products (Megatron-LM's --tp-comm-overlap, NeMo's ub_tp_comm_overlap): runtimes that
  // run TransformerEngine (RuntimeRules::overlaps_tp_communication); acts on plans with tp > 1
  // and sequence parallelism (tp_overlap.hpp). JSON "tp_comm_overlap", default false (written
  // when true).
  bool tp_comm_overlap = false;
  bool operator==(const Job&) const = default;
};

struct Strategy {
  int dp = 1;
  int tp = 1;
  int pp = 1;
  int zero = 0;                        // ZeRO stage 0..3 over the data-parallel group
  std::int64_t micro_batch = 1;        // samples per micro-batch per data-parallel rank
  std::int64_t num_micro_batches = 1;  // per step; global_batch = dp * micro_batch * this
  Schedule schedule = Schedule::k1F1B;
  int virtual_stages = 1;  // model chunks per pipeline rank (> 1 only interleaved)
  Recompute recompute = Recompute::kNone;
  // With full recomputation, how many transformer layers of each model chunk recompute: the
  // chunk's first `recompute_layers`, the rest keep their activations (Megatron-LM's
  // --recompute-method block --recompute-num-layers). 0 = every layer. JSON "recompute_layers",
  // written only when set.
  int recompute_layers = 0;
  bool sequence_parallel = false;          // Megatron sequence parallelism with tp (an extension)
  Attention attention = Attention::kMath;  // JSON "attention", default "math"
  // Context parallelism: each sample's sequence split over cp ranks that hold the same weights
  // (context_parallel.hpp). JSON "cp", default 1 (written when > 1).
  int cp = 1;

  int world_size() const { return dp * tp * pp * cp; }
  bool operator==(const Strategy&) const = default;
};

// Ranks are laid out tensor-parallel fastest, then context-parallel, then data-parallel, then
// pipeline (Megatron-Core's default order, tp-cp-ep-dp-pp: megatron/core/parallel_state.py).
// The cp ranks of a sample hold the same weights, so to the gradient reduction, ZeRO's sharding
// and that layout they are data-parallel ranks: Megatron-Core reduces the gradients and shards its
// distributed optimizer over the data-parallel group with context parallelism (dp x cp ranks,
// get_data_parallel_group(with_context_parallel=True)). The strategy as those see it: dp x cp
// data-parallel ranks and cp 1; the same strategy when cp is 1. The batch and the per-rank
// compute stay the strategy's own.
Strategy gradient_view(const Strategy& strategy);

// The tokens of each sample one rank holds: the sequence split over the cp ranks (check_strategy
// requires seq_len to be a multiple of 2 cp).
inline std::int64_t rank_tokens(const Job& job, const Strategy& strategy) {
  return job.seq_len / strategy.cp;
}

// An inclusive range of the layer sequence held by one pipeline stage (model chunk). With the
// interleaved schedule there are pp * virtual_stages ranges; range c runs on pipeline rank c % pp.
// The share of a chunk's transformer layers that recompute: 0 without recomputation, 1 when every
// layer does, else min(recompute_layers, L) / L with L the largest chunk's layer count
// (ceil(layers / (pp * v)), Megatron's even split). Memory and time per layer are that blend of
// the recomputing and the plain layer, exact for the chunk's totals.
double recompute_share(const Strategy& strategy, std::int64_t layers);
// The largest chunk's transformer layer count: ceil(layers / (pp * v)).
std::int64_t largest_chunk_layers(const Strategy& strategy, std::int64_t layers);
// Whether some, but not all, of a chunk's layers recompute (0 < recompute_share() < 1).
bool recomputes_part(const Strategy& strategy, std::int64_t layers);
// The recomputation in a table cell: "none", "selective", "full", or "full(N)" with
// recompute_layers N.
std::string recompute_cell(const Strategy& strategy);

struct StageRange {
  int first_layer = 0;
  int last_layer = 0;
  bool operator==(const StageRange&) const = default;
};

// Number of entries in the layer sequence: model.layers + 2.
int layer_sequence_length(const profiles::ModelSpec& model);

// Megatron's default split: the transformer layers as evenly as possible over pp * v chunks
// (earlier chunks take the remainder), the embedding on the first chunk, the head on the last.
std::vector<StageRange> even_partition(const profiles::ModelSpec& model, int chunks);

// Why `strategy` cannot run `job` on `devices` devices for `model`, or nullopt when it can: tp
// divides heads and ffn, pp * v chunks have at least one transformer layer each, the batch splits,
// the schedule accepts pp, the micro-batches and the virtual stages (check_schedule), and so on.
// Messages name the dimension and the numbers.
std::optional<std::string> check_strategy(const profiles::ModelSpec& model, std::int64_t devices,
                                          const Job& job, const Strategy& strategy);
// The same for a partition: pp * v contiguous ranges covering the whole layer sequence.
std::optional<std::string> check_partition(const profiles::ModelSpec& model,
                                           const Strategy& strategy,
                                           const std::vector<StageRange>& stages);

// One line for people: "dp=4 tp=8 pp=2 zero=1 micro-batch=2 micro-batches=64 schedule=1f1b
// recompute=selective" (plus virtual-stages, sequence-parallel and cp when they apply).
std::string describe(const Strategy& strategy);

nlohmann::json strategy_to_json(const Strategy& strategy);
Strategy strategy_from_json(const nlohmann::json& value, const std::string& source,
                            const std::string& path);
nlohmann::json job_to_json(const Job& job);
Job job_from_json(const nlohmann::json& value, const std::string& source, const std::string& path);

}  // namespace loom::costmodel
