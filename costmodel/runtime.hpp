// Training runtimes: what the engine that runs a plan keeps in memory and how its data-parallel
// communication meets the compute. A plan predicts one runtime (Job::runtime):
//
//   loom       Loom's own executor (zero.hpp says what each ZeRO stage does there)
//   megatron   Megatron-LM: fp32 main-grad buffer, distributed optimizer (ZeRO-1) with
//              overlapped gradient reduce-scatter and parameter all-gather
//   deepspeed  DeepSpeed's ZeRO 0-3: contiguous gradient buckets, stage-3 prefetch and live
//              parameters, fp32 master weights in the optimizer states
//   fsdp       PyTorch FSDP: NO_SHARD (zero 0), SHARD_GRAD_OP (zero 2), FULL_SHARD (zero 3),
//              per-block all-gathers with prefetch and reduce-scatters in backward
//
// Each runtime's rules are one RuntimeRules value built in its own file (runtime_<name>.cpp);
// the estimate and the simulator ask runtime_rules(job.runtime) and never compare runtime names.
// docs/runtimes.md gives every rule with its source.
#pragma once

#include <algorithm>
#include <functional>
#include <optional>
#include <string>

#include "costmodel/comm.hpp"
#include "costmodel/compute.hpp"
#include "costmodel/layers.hpp"
#include "costmodel/memory.hpp"
#include "costmodel/strategy.hpp"
#include "profiles/model_spec.hpp"

namespace loom::costmodel {

// What one pipeline rank's runtime memory depends on besides the strategy and the job.
struct RankMemoryInput {
  double num_parameters = 0;        // parameters on this rank (after tp), all chunks
  double num_layers = 0;            // transformer layers on this rank
  double layer_num_parameters = 0;  // one transformer layer on one rank (after tp)
  // The largest tensor of the model on one rank (the word table or an MLP weight, after tp).
  double largest_tensor_num_parameters = 0;
  // The largest entry of the layer sequence this rank holds (embeddings, a transformer layer or
  // the head, after tp): ZeRO-2/3's staging buffer is at most one.
  double largest_block_num_parameters = 0;
  // The word table on this rank (after tp) when it holds the embedding and keeps activations,
  // else 0: its backward makes a dense gradient of the whole table.
  double embedding_table_num_parameters = 0;
  // The transformer layers' linear weights on this rank (after tp): what fp8 training casts.
  double linear_weight_parameters = 0;
  double activation_bytes = 0;        // kept at the peak: every micro-batch in flight
  double chunk_activation_bytes = 0;  // one micro-batch of one model chunk
  // What one layer's backward pass allocates beyond the activations kept for it: a recomputed
  // layer's activations, and on GPUs the attention core's gradients (Terms' backward_temporary).
  double backward_temporary_bytes = 0;
  // Of num_layers, those that recompute their forward pass (Recompute::kFull, all or part).
  double recomputing_layers = 0;
  double bucket_bytes = 0;  // Loom's gradient bucket (CostOptions::dp_bucket_bytes)
  bool gpu = false;         // the rank runs on a GPU
  // What the language-model loss's backward pass allocates at its start beyond the kept
  // activations (the rank holding the LM head; RuntimeRules::loss_backward_bytes_per_logit).
  double loss_backward_bytes = 0;
  // Working memory of the backward pass while (nearly) every activation is kept: the loss's
  // gradients at its start, or one layer's backward temporaries.
  double backward_working_bytes() const {
    return std::max(num_layers > 0 ? backward_temporary_bytes : 0.0, loss_backward_bytes);
  }
  // The word embedding's backward pass (on the rank holding the table) makes a dense gradient
  // of the whole table (its vocabulary shard under tp), `bytes_per_element` each, before adding
  // it to the parameter's: at the end of a micro-batch's backward, when that micro-batch's chunk
  // has freed its activations and the others in flight keep theirs. What it needs beyond the
  // kept activations; 0 on a rank without the table.
  double dense_embedding_gradient_bytes(double bytes_per_element) const {
    if (embedding_table_num_parameters <= 0) return 0;
    return bytes_per_element * embedding_table_num_parameters -
           std::min(chunk_activation_bytes, activation_bytes);
  }
};

// Model states and working memory of one rank under a runtime.
struct RuntimeMemory {
  ModelStateBytes states;
  // Working memory at the step's peak beyond kept activations: gradient buckets, gathered
  // parameters, one layer's backward temporaries, the optimizer step's temporaries.
  double buffer_bytes = 0;
};

// Collective times over the data-parallel group and the compute windows that can hide them.
struct DataParallelInput {
  std::function<double(Collective, double bytes)> time_s;  // over the dp group
  double num_parameters = 0;                               // on this rank
  // Of them, what the backward pass's ZeRO-3 gathers leave out (the lookup tables, for a runtime
  // with RuntimeRules::skips_lookup_gathers).
  double backward_ungathered_num_parameters = 0;
  // Of them, what the forward pass's ZeRO-3 gathers leave out, and the mask all-reduced first
  // (forward_ungathered_num_parameters, lookup_mask_bytes).
  double forward_ungathered_num_parameters = 0;
  double lookup_mask_bytes = 0;
  double layer_num_parameters = 0;
  double forward_window_s = 0;   // one micro-batch's forward pass on this rank (0: nothing hides)
  double backward_window_s = 0;  // one micro-batch's backward pass (0: nothing hides)
  std::int64_t num_micro_batches = 1;
  int element_bytes = 2;    // the job's precision
  double bucket_bytes = 0;  // Loom's gradient bucket (CostOptions::dp_bucket_bytes)
  // How much compute slows while collectives run beside it (overlap_slowdown(), comm.hpp).
  double overlap_slowdown = 0;
  // The group runs over Gloo (CPU ranks), where Loom's executor reduce-scatters by an all-reduce.
  bool gloo = false;
};

// Exposed (not hidden) communication of one step on one pipeline rank, with dp > 1.
struct DataParallelExposure {
  double gradient_s = 0;   // gradient reduction ("dp")
  double parameter_s = 0;  // parameter gathers ("zero")
};

struct RuntimeRules {
  const char* name = "";    // as in plan JSON ("loom", "megatron", ...)
  const char* engine = "";  // for people ("Megatron-LM")
  // Why the runtime cannot run `strategy` for `job`, or nullopt when it can.
  std::optional<std::string> (*refusal)(const Job&, const Strategy&) = nullptr;
  RuntimeMemory (*memory)(const Job&, const Strategy&, const RankMemoryInput&) = nullptr;
  DataParallelExposure (*exposure)(const Job&, const Strategy&, const DataParallelInput&) = nullptr;
  // Bytes per parameter the gradient reduction sends (the reduce dtype: fp32 main grads in
  // Megatron, fp32 reduce_dtype in FSDP's mixed precision, the job's width elsewhere).
  double (*reduce_bytes_per_parameter)(const Job&) = nullptr;
  // Whether the job's optimizer kernels (Job::optimizer_kernels) may be other than fused: the
  // engine runs the user's torch.optim optimizer (FSDP; DDP's, which runtime loom describes).
  // Megatron-LM and DeepSpeed run their own fused Adam.
  bool chooses_optimizer_kernels = false;
  // Whether the job's reduce_dtype (Job::reduce_precision) sets what the reduction sends (FSDP's
  // MixedPrecision.reduce_dtype, NeMo's optim.grad_sync_dtype); the other runtimes refuse a
  // reduce_dtype other than their own.
  bool sets_reduce_dtype = false;
  // Whether the job's optimizer_dtype (Job::optimizer_precision) sets the optimizer states' width
  // (NeMo's optim.dtype, Apex DistributedFusedAdam's dtype); the other runtimes refuse one other
  // than fp32.
  bool sets_optimizer_dtype = false;
  // The kernels the runtime fuses (Megatron: QKV, bias-GeLU, bias-dropout-add, masked softmax);
  // the default is eager PyTorch's, as Loom's executor runs them.
  KernelFusions fusions = {};
  // Whether the device's host costs (host_launch_us, host_pass_us) bound the runtime's passes
  // (compute.hpp): measured for Loom's executor; the other runtimes' hosts are not modelled yet.
  bool host_floor = false;
  // Whether the runtime trains 16-bit jobs under autocast (PyTorch's automatic mixed precision):
  // fp32 weights, gradients and collectives, matrix products on 16-bit copies of the weights,
  // LayerNorm and softmax in fp32 (their kept inputs and outputs fp32, layers.hpp). The other
  // runtimes keep 16-bit weights and activations throughout.
  bool autocast = false;
  // Bytes per logit the loss's backward pass allocates at its start (the LM head's cross-entropy
  // over the whole vocabulary) for a job whose loss is eager (Job::loss): PyTorch's
  // cross_entropy on fp32 logits makes the fp32 gradient of the log-probabilities and then of
  // the logits (8) beside the kept log-probabilities; Megatron-LM's vocab-parallel cross-entropy
  // writes its gradient into the softmax it kept (0), as a fused loss does.
  double loss_backward_bytes_per_logit = 8;
  // Whether the runtime runs the job's loss (Job::loss): Megatron-LM always runs its own
  // vocab-parallel cross-entropy, which keeps the fp32 softmax.
  bool runs_job_loss = true;
  // What its selective recomputation recomputes (strategy.hpp).
  SelectivePolicy selective = SelectivePolicy::kAttentionCore;
  // Whether it runs PyTorch's Python models, which torch.compile can compile (Job::compile):
  // FSDP (torchtitan, Hugging Face) and DeepSpeed (Hugging Face). Loom's executor runs LibTorch's
  // C++ modules eagerly and Megatron-LM fuses its kernels itself.
  bool compiles = false;
  // Whether it can overlap the tensor-parallel collectives with the linear layers' products
  // (Job::tp_comm_overlap): Megatron-LM and NeMo through TransformerEngine's userbuffers.
  bool overlaps_tp_communication = false;
  // The fused attention kernel it runs (compute.hpp): FlashAttention-2 for the engines that run
  // PyTorch's Python models (flash-attn 2 in llm-foundry, SDPA's flash backend in torchtitan and
  // Hugging Face); the device's own elsewhere (TransformerEngine's cuDNN attention in
  // Megatron-LM and NeMo, LibTorch's SDPA in Loom's executor).
  AttentionKernel attention_kernel = AttentionKernel::kNative;
  // fp8 jobs: whether TransformerEngine casts each linear weight to fp8 (with its transpose) once
  // per step and keeps the copies for the step's other micro-batches: Megatron-Core's TE layers
  // pass is_first_microbatch (TELinear.forward in megatron/core/extensions/transformer_engine.py;
  // --disable-parameter-transpose-cache turns it off), so Megatron-LM and NeMo do. Other engines
  // that call TransformerEngine's layers without it cast on every micro-batch.
  bool caches_fp8_weights = false;
  // Whether it runs context parallelism (Strategy::cp > 1): Megatron-Core's, with
  // TransformerEngine's attention (--context-parallel-size). Loom's executor does not.
  bool context_parallel = false;
  // Whether ZeRO-3 leaves the embedding's lookup tables (ParameterCounts::lookup_tables) out of
  // the backward pass's gathers: Loom's executor knows its model; FSDP and DeepSpeed gather each
  // wrapped block whole.
  bool skips_lookup_gathers = false;
  // Host time per parameter tensor (ParameterCounts' LayerParameters::tensors) in every
  // micro-batch's forward and backward pass, which the GPU waits for: an engine's per-tensor
  // Python hooks and bookkeeping (DeepSpeed's ZeRO-2 and ZeRO-3). The passes of each entry of the
  // layer sequence take that much longer in the estimate, the partition and the simulator alike.
  // nullptr: none.
  LayerTime (*host_per_tensor)(const Job&, const Strategy&) = nullptr;
  // The time a step that overflows the fp16 loss scale does not spend, of the step's
  // `optimizer_s` (the update) and `parameter_s` (the exposed parameter gathers, "zero"): an
  // engine that checks for overflow before updating skips the update and what follows it. Only
  // measurements timed over skipped steps need it (a run's first steps at a large initial loss
  // scale). nullptr: the engine skips nothing.
  double (*overflow_skipped_s)(const Strategy&, double optimizer_s, double parameter_s) = nullptr;
};

RuntimeRules runtime_rules(Runtime runtime);

// `job` as Loom's executor runs it (what `loom validate` measures): runtime loom, 16-bit jobs
// under autocast (no half model), gradients reduced in fp32 (no reduce_dtype), its tensor-parallel
// collectives not overlapped with the products.
Job executor_job(Job job);

// Whether `job` trains under autocast: 16-bit arithmetic on a runtime that keeps fp32 weights
// (RuntimeRules::autocast), unless the job keeps its model in 16 bits (Job::half_model).
bool trains_under_autocast(const Job& job);
// The kernels `job` runs fused: every elementwise chain under torch.compile (Job::compile), else
// its runtime's (RuntimeRules::fusions).
KernelFusions kernel_fusions(const Job& job);
// Bytes per element of the weights and gradients a rank holds and communicates: 4 under
// autocast, else the job's precision's.
int state_element_bytes(const Job& job);
// Bytes per logit a language-model head keeps for the backward pass: the logits and their fp32
// softmax (the job's element bytes + 4: an eager loss, and Megatron-LM's); a fused loss the
// runtime runs (Job::loss, RuntimeRules::runs_job_loss) keeps only the logits, from which its
// backward recomputes the softmax with the per-row log-sum-exp it saved (4 bytes a row, left
// out) and into which it writes the gradient (flash-attn's cross-entropy, which llm-foundry's
// fused_crossentropy runs).
double head_kept_bytes_per_logit(const Job& job);
// Of a chunk's parameters, those ZeRO-3 leaves out of the gather before its backward pass: its
// lookup tables where the runtime knows them (RuntimeRules::skips_lookup_gathers), else none.
double backward_ungathered_num_parameters(const Job& job, double lookup_num_parameters);
// Of a chunk's parameters, those ZeRO-3 leaves out of the gather before a forward pass: where
// the runtime knows its lookup tables (RuntimeRules::skips_lookup_gathers) and the chunk has
// them, the rows no dp rank looks up in the micro-batch (at most dp * micro_batch * seq_len
// tokens read, lookup_rows_read), else none.
double forward_ungathered_num_parameters(const Job& job, const profiles::ModelSpec& model,
                                         const Strategy& s, double lookup_num_parameters);
// What the dp ranks all-reduce before that gather to agree on the rows: a mask of the tables'
// rows in fp32 (0 where the forward gather is whole).
double lookup_mask_bytes(const Job& job, const profiles::ModelSpec& model, const Strategy& s,
                         double lookup_num_parameters);

// What the runtime's per-tensor host work (RuntimeRules::host_per_tensor) adds to one micro-batch's
// passes of an entry of the layer sequence holding `entry`'s tensors; a fully recomputed
// transformer layer (`transformer_layer`) runs its forward hooks again (recompute_s). Zero for
// runtimes without it.
LayerTime runtime_host_time(const Job& job, const Strategy& strategy, const LayerParameters& entry,
                            bool transformer_layer);
// The same summed over one step of a pipeline rank: every micro-batch, the model's entries spread
// evenly over the pipeline stages. It is part of the passes' times (and so of the step); plans
// print it on its own line.
double runtime_host_s_per_step(const profiles::ModelSpec& model, const Job& job,
                               const Strategy& strategy);

// The rules of each runtime, one file each (runtime_<name>.cpp).
RuntimeRules loom_runtime_rules();
RuntimeRules megatron_runtime_rules();
RuntimeRules deepspeed_runtime_rules();
RuntimeRules fsdp_runtime_rules();
RuntimeRules nemo_runtime_rules();

// Why job.runtime cannot run `strategy`, or nullopt (check_strategy() asks it).
std::optional<std::string> runtime_refusal(const Job& job, const Strategy& strategy);

// The exposed time of `comm_s` of communication issued in chunks of `chunk_s` while `window_s` of
// compute runs, the compute slowing by `slowdown` while both run (overlapped_time_s, comm.hpp):
// what the slowed window cannot hide, and at least the last chunk, which follows the compute
// that produces it: max(overlapped_time_s(window, comm, slowdown) - window, chunk); with
// slowdown 0, max(comm - window, chunk). 0 when comm_s is 0.
double exposed_after_window_s(double comm_s, double window_s, double chunk_s, double slowdown);
// The same without a last chunk: overlapped_time_s(window, comm, slowdown) - window.
double exposed_beyond_window_s(double comm_s, double window_s, double slowdown);

}  // namespace loom::costmodel
