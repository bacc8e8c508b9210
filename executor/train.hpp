// Training of a sequence classifier: the library function behind `loom train`, on one rank or as
// one rank of a dp x tp x pp plan. No LibTorch types in this header.
//
// One optimizer step consumes global_batch = micro_batch * num_micro_batches examples: the
// gradients of num_micro_batches micro-batches are accumulated, each micro-batch's mean loss
// divided by num_micro_batches, so the step's gradient is that of the mean loss over the global
// batch. Then gradients are clipped to a total L2 norm of max_grad_norm, the learning rate is set
// by Hugging Face's linear schedule with warm-up (lr * s / warmup for s < warmup, then
// lr * (total - s) / (total - warmup), never below 0; s = 0-based step), and AdamW (betas 0.9 /
// 0.999, eps 1e-8, decoupled weight decay, none on biases and LayerNorm weights) updates.
//
// Data order is a pure function of (seed, epoch): each epoch is a seeded permutation of the
// training examples, cut into ⌊N / global_batch⌋ steps (the incomplete rest is dropped), so step s
// reads epoch s / steps_per_epoch at offset (s % steps_per_epoch) * global_batch. With the
// checkpointed weights, optimizer state, dropout RNG state and step, a resumed run reproduces the
// losses of an uninterrupted one exactly.
//
// Device: fp32 master weights; the forward pass runs under autocast for bf16 / fp16 (fp16 with
// dynamic loss scaling, skipping steps whose gradients overflow), TF32 matmuls for tf32, plain
// fp32 for fp32. cuda runs all four; cpu runs fp32 and bf16 and refuses fp16 and tf32
// (InputError, executor/device_batch.hpp's device_runs): a precision is never silently changed.
//
// Metrics (docs/formats.md), one JSON object per line:
//   {"step", "epoch", "loss", "lr", "samples_per_s", "step_time_s", "peak_memory_bytes", "rank",
//    "time"} after every log_every-th step; "step" counts completed optimizer steps (1-based),
//   "lr" is the rate the step used, "loss" the mean training loss over the step's global batch,
//   "peak_memory_bytes" the CUDA caching allocator's peak on cuda and the peak of the tensor
//   bytes LibTorch's CPU allocator holds for this rank on cpu, "time" ISO-8601 UTC (the
//   extension "peak_rss_bytes" is the process's maximum resident set size);
//   {"eval": true, "step", "accuracy", "loss", "split"} after each evaluation (every eval_every
//   steps and after the last step) on the whole evaluation set, "split" its eval_split_name.
// Log lines (world rank 0, stderr, every print_every steps and after every evaluation, whether
// or not stderr is a terminal; metrics_writer.hpp's format_step_line and format_eval_line):
//   step 10/40, epoch 0.25: loss 0.6931, lr 7.50e-04, 512.3 samples/s, ETA 0:00:03
//   step 40/40, epoch 1.00: validation accuracy 91.20 %, loss 0.2300
// A resumed run appends to the metrics file; a fresh run truncates it.
//
// Many ranks (TrainOptions::dp * tp * pp > 1, train_classifier with ParallelGroups): one step
// consumes global_batch = dp * micro_batch * num_micro_batches examples of the same data order;
// data-parallel rank d takes the contiguous block [d * M * b, (d + 1) * M * b) of the step's
// examples (M = num_micro_batches, b = micro_batch), so a run equals the single-rank run with
// micro_batch b and num_micro_batches dp * M up to floating-point summation order. Every rank
// builds its stage (plan.stages[pp rank]) and tp shard from the same seeded full tensors.
// Parameters and gradients live in one flat fp32 buffer per rank (executor/flat_parameters.hpp
// says what each ZeRO stage holds between steps and the order of its collectives): gradients are
// summed over the dp group (ZeRO-0/1: all-reduced in buckets overlapping the last backward pass;
// ZeRO-2/3: reduce-scattered bucket by bucket after every backward pass, each rank keeping its
// shard; Gloo, which has no reduce-scatter here, all-reduces and each rank keeps its chunk)
// and divided by dp; the global gradient norm (tp shards and pp stages summed, replicated tp
// parameters counted once) clips; AdamW (the same arithmetic as torch::optim::AdamW) updates the
// whole buffer (ZeRO-0) or this rank's 1/dp shard (ZeRO-1/2/3: optimizer states sharded, updated
// parameters all-gathered; ZeRO-3 keeps only the shard between steps and gathers the stage's
// parameters for the step). Pipeline stages exchange activations and gradients with send/recv in
// the plan's schedule (costmodel/schedule.hpp's pipeline_order: gpipe, 1f1b, or interleaved with
// virtual_stages model chunks per pipeline rank, chunk g of the plan's pp * virtual_stages stages
// on rank g % pp). The loss is computed on the last stage and reported on every rank. Only world
// rank 0 writes metrics (every rank with metrics_every_rank). Many ranks checkpoint and resume
// (in any layout: executor/reshard.hpp); they refuse fp16 on cuda (no loss scaling) and
// --dump-batches.
//
// Checkpoints: `checkpoint_dir/step-NNNNNNNN/` (executor/checkpoint.hpp lists the files of one
// rank and of many). Each is written into a temporary folder in checkpoint_dir and renamed into
// place; only after that rename are older step folders removed, beyond the newest
// keep_checkpoints (0: every step folder stays).
//
// Output: a run that completes (not one stopped early) with output_dir set ends, after its final
// evaluation, with world rank 0 writing output_dir as a Hugging Face model folder (config.json,
// model.safetensors, the tokenizer files), whatever the layout (executor/hf_export.hpp).
//
// The code: train.cpp (these entry points), train_loop.hpp (the one loop and its one-rank and
// many-rank engines), batch_order.hpp, metrics_writer.hpp, checkpoint.hpp, flat_adamw.hpp,
// flat_parameters.hpp.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "costmodel/strategy.hpp"
#include "executor/examples.hpp"
#include "planner/plan.hpp"
#include "profiles/cluster.hpp"
#include "profiles/model_spec.hpp"

namespace loom::executor {

enum class Device { kCpu, kCuda };

const char* to_string(Device device);
// "cpu" or "cuda"; nullopt otherwise.
std::optional<Device> parse_device(const std::string& text);

struct TrainOptions {
  profiles::ModelSpec model;  // BERT or RoBERTa; num_labels defaults to 2
  std::string init_weights;   // safetensors file to start from; "" = seeded initialisation
  double dropout = 0.1;

  std::int64_t micro_batch = 8;        // examples per micro-batch
  std::int64_t num_micro_batches = 1;  // micro-batches accumulated per optimizer step
  std::int64_t steps = 0;              // exactly one of steps and epochs is positive
  std::int64_t epochs = 0;

  double lr = 2e-5;
  std::int64_t warmup_steps = 0;
  // With warmup_steps 0: warm up over this share of the run's steps (rounded), as Google's BERT
  // fine-tuning scripts do with warmup_proportion 0.1 (run_classifier.py). 0: no warm-up.
  double warmup_share = 0.0;
  double weight_decay = 0.01;
  double max_grad_norm = 1.0;  // 0 = no clipping

  std::int64_t eval_every = 0;  // steps between evaluations; 0 = only after the last step
  std::int64_t eval_batch = 0;  // examples per evaluation batch; 0 = micro_batch
  std::uint64_t seed = 42;      // initialisation, data order and dropout

  // "" = none. One rank only: every micro-batch of training as a JSONL line {"step", "micro_batch",
  // "input_ids", "attention_mask", "token_type_ids", "labels"}, so another implementation can be
  // fed exactly what Loom trained on (bench/gpu.sh's comparison with transformers).
  std::string batches_path;
  std::string metrics_path;         // "" = no metrics file (many ranks: world rank 0 writes it)
  bool metrics_every_rank = false;  // many ranks: every rank writes metrics_path (its own file)
  std::int64_t log_every = 1;       // steps between metrics lines
  // Steps between log lines on stderr (world rank 0): 0 = none; kAutoPrintEvery = about 20 per
  // run (max(1, total_steps / 20)).
  std::int64_t print_every = 0;
  static constexpr std::int64_t kAutoPrintEvery = -1;
  // A line world rank 0 writes on stderr before its first log line, once the model is built and
  // loaded ("" = none; loom train: the learning rate it chose). Only with log lines.
  std::string first_log_line;
  // The name of the evaluation set, in log lines and metrics ("validation", "test", ...).
  std::string eval_split_name = "validation";

  std::string checkpoint_dir;         // "" = no checkpoints
  std::int64_t checkpoint_every = 0;  // steps between checkpoints; 0 = only after the last step
  bool resume = false;  // continue from the latest checkpoint in checkpoint_dir (fresh if none)
  std::int64_t keep_checkpoints = 0;  // step folders kept, the newest; 0 = all
  // A Hugging Face model folder written at the end of a completed run; "" = none.
  std::string output_dir;
  // Copied into output_dir and into every step folder (vocab.txt, vocab.json, merges.txt, ...).
  std::vector<std::string> tokenizer_files;
  // The head's label names in config.json (num_labels of them); empty = "LABEL_0", "LABEL_1", ...
  std::vector<std::string> label_names;
  // Stop after this many completed steps, as if interrupted (the checkpoint is still written,
  // no final evaluation); 0 = run to the end.
  std::int64_t stop_after_step = 0;

  Device device = Device::kCpu;
  int device_index = 0;  // the CUDA device (LOCAL_RANK in multi-rank runs)
  profiles::Precision precision = profiles::Precision::kFp32;  // cpu: fp32 or bf16
  int rank = 0;                                                // the "rank" field of metrics
  bool progress = true;  // a progress bar on stderr when stdout and stderr are terminals

  // The parallel layout (from the plan). micro_batch and num_micro_batches are per dp rank.
  int dp = 1;
  int tp = 1;
  int pp = 1;
  int zero = 0;  // ZeRO stage 0..3 over the dp group
  costmodel::Schedule schedule = costmodel::Schedule::k1F1B;
  int virtual_stages = 1;
  std::vector<costmodel::StageRange> stages;  // pp * virtual_stages ranges; empty = even split
  costmodel::Recompute recompute = costmodel::Recompute::kNone;  // activation recomputation
  int recompute_layers = 0;  // full recomputation of each chunk's first N layers; 0 = all
  // Megatron sequence parallelism over the tp group (executor/model.hpp); needs tp > 1 and a
  // sequence length divisible by tp.
  bool sequence_parallel = false;
  // The attention kernel; kFlash needs LibTorch 2 or later (executor/executor.hpp's
  // runs_attention).
  costmodel::Attention attention = costmodel::Attention::kMath;

  // Graceful stop: when this points at a non-zero value (a signal number that a SIGINT/SIGTERM
  // handler stored), training stops at the next step boundary (all ranks at the same one),
  // writes a checkpoint when checkpoint_dir is set, skips the final evaluation and reports the
  // signal in TrainSummary::stopped_by_signal.
  const std::atomic<int>* stop_signal = nullptr;
  // Fault injection for tests (`LOOM_FAULT` in loom train): SIGKILL this process in the middle
  // of step N (after its first micro-batch's backward pass), or in the middle of writing the
  // checkpoint of step N (after the model file, before the rest and the rename); 0 = never.
  std::int64_t fault_kill_in_step = 0;
  std::int64_t fault_kill_in_checkpoint = 0;
  // DP and ZeRO-1: gradients are all-reduced in buckets of about this size, each started by a
  // gradient hook as soon as the last micro-batch's backward pass has finished its gradients.
  // ZeRO-2/3: gradients are reduced in buckets of this size after every backward pass.
  std::int64_t bucket_bytes = 25 << 20;
  // Ranks that share this process as threads (train_local_ranks): CPU memory is then counted per
  // thread (TrainSummary::peak_memory_bytes), else for the whole process.
  int ranks_in_process = 1;
};

struct TrainSummary {
  std::int64_t steps = 0;        // completed optimizer steps, counting resumed ones
  std::int64_t total_steps = 0;  // the schedule's length
  std::optional<std::int64_t> resumed_from_step;
  std::vector<double> losses;                 // training loss of each step run by this call
  double final_loss = 0.0;                    // the last of them (0 when none ran)
  std::optional<double> validation_accuracy;  // from the last evaluation
  std::optional<double> validation_loss;
  double median_step_time_s = 0.0;
  double samples_per_s = 0.0;  // global_batch / median_step_time_s
  // Peak bytes of this rank's tensors (CUDA: the caching allocator's peak; CPU: tensors allocated
  // by the rank's thread, counted through LibTorch's allocator reports; see
  // TrainOptions::ranks_in_process).
  std::int64_t peak_memory_bytes = 0;
  std::string precision;      // what actually ran: "fp32", "bf16", ...
  int stopped_by_signal = 0;  // the signal that stopped training early (TrainOptions::stop_signal)
};

class ParallelGroups;  // executor/distributed.hpp

// Options that a plan fixes: the model, micro_batch, num_micro_batches, precision, the
// parallel layout (dp, tp, pp, zero, schedule, virtual stages, stages, sequence parallelism),
// recomputation and the attention kernel.
TrainOptions train_options_from_plan(const planner::Plan& plan);

// Trains and evaluates. Throws InputError for bad options (source the option's flag, e.g.
// "--steps"; source "plan" for sequence parallelism with tp 1 or a sequence length tp does not
// divide, and for an attention kernel this build lacks, naming --attention math), data that do not
// fit the model (source "training data" / "validation data": unequal or too long sequences, token
// ids outside the vocabulary, labels outside [0, num_labels)), fewer training examples than one
// global batch, an unreadable init or resume checkpoint, a checkpoint made for another model, seed
// or batch, or cuda without a GPU. Throws InputError (source "plan") when options.dp * tp * pp > 1:
// those need the groups.
TrainSummary train_classifier(const TrainOptions& options,
                              const std::vector<EncodedExample>& train_data,
                              const std::vector<EncodedExample>& validation_data);

// As one rank of `groups` (whose dp, tp and pp sizes must equal the options'). Collective: every
// rank calls it with the same options and data. Besides the refusals above, throws InputError
// for what many ranks cannot do (fp16 on cuda, --dump-batches), a checkpoint whose layout cannot
// be read (executor/reshard.hpp), ZeRO outside 0..3, stages that are not pp * virtual_stages, or an
// impossible schedule (virtual stages without interleaving, interleaving with pp < 2 or
// micro-batches not a multiple of pp), and CollectiveError when a peer is lost or a collective
// times out.
TrainSummary train_classifier(const TrainOptions& options,
                              const std::vector<EncodedExample>& train_data,
                              const std::vector<EncodedExample>& validation_data,
                              ParallelGroups& groups);

// All dp * tp * pp ranks of `options` as threads of this process, over Gloo on an in-process store
// (`loom demo`, tests): returns world rank 0's summary; the first rank's failure is rethrown.
TrainSummary train_local_ranks(const TrainOptions& options,
                               const std::vector<EncodedExample>& train_data,
                               const std::vector<EncodedExample>& validation_data);

// Logits of a sequence classifier for given token ids, as `loom logits` prints them: the model
// in eval mode (no dropout), fp32 weights, `precision`'s autocast on CUDA (fp32 on the CPU).
struct LogitsRequest {
  profiles::ModelSpec model;
  std::string weights;  // safetensors file (Hugging Face names); "" = the seeded initialisation
  std::uint64_t seed = 42;
  std::string source;                                     // the file the ids came from, for errors
  std::vector<std::vector<std::int64_t>> input_ids;       // rows of equal length
  std::vector<std::vector<std::int64_t>> attention_mask;  // the same shape, or empty: all ones
  std::vector<std::vector<std::int64_t>> token_type_ids;  // the same shape, or empty: all zeros
  Device device = Device::kCpu;
  int device_index = 0;
  profiles::Precision precision = profiles::Precision::kFp32;
};

// [rows][num_labels]. Throws InputError (source: request.source) for no rows, mask or type lists
// with another number of rows ("$.attention_mask"), and, naming the row ("example 2"), rows of
// unequal length or longer than the model's positions, ids outside the vocabulary, masks other
// than 0/1 or starting with padding, types outside the model's type vocabulary; InputError for an
// unreadable weights file or cuda without a GPU.
std::vector<std::vector<double>> classifier_logits(const LogitsRequest& request);

// The newest complete checkpoint folder (`step-NNNNNNNN` holding trainer_state.json) in
// `checkpoint_dir`, or nullopt when there is none (defined in checkpoint.cpp).
std::optional<std::string> latest_checkpoint(const std::string& checkpoint_dir);

}  // namespace loom::executor
