// The training loop of loom train, written once for one rank and for many: data order, learning
// rate, metrics, progress, evaluations, checkpoints and stopping live here; what one step does
// on this rank lives behind TrainRank, implemented by a one-rank engine (train_single.cpp) and a
// many-rank one (train_parallel.cpp). No LibTorch types in this header.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "executor/batch_order.hpp"
#include "executor/device.hpp"
#include "executor/metrics_writer.hpp"
#include "executor/train.hpp"

namespace loom::executor {

struct Evaluation {
  double accuracy = 0.0;
  double loss = 0.0;
};

// One rank's side of a training run. Every rank of a many-rank run calls the same methods in the
// same order (they may be collective).
class TrainRank {
 public:
  virtual ~TrainRank() = default;
  // The completed steps of the checkpoint this rank resumed from; nullopt for a fresh run.
  virtual std::optional<std::int64_t> resumed_from_step() const = 0;
  virtual const char* precision() const = 0;  // what runs: "fp32", "bf16", ...
  virtual int rank() const = 0;               // the "rank" field of metrics lines
  virtual bool lead() const = 0;              // world rank 0 (writes metrics, shows progress)
  // Called once before the first step: opens the rank's own outputs and starts counting peak
  // memory (the model is built and loaded by then).
  virtual void begin() = 0;
  // One optimizer step (0-based `step`) over the examples at `offset` of the epoch's `order`,
  // with learning rate `lr`; returns the step's mean loss once the step's work is done.
  virtual double train_step(std::int64_t step, const std::vector<std::int64_t>& order,
                            std::int64_t offset, double lr, StepPhases& phases) = 0;
  // The stop signal this rank acts on now (0: none); with many ranks the one they all agreed on
  // in the last step or evaluation.
  virtual int stop_signal() = 0;
  // Scores the validation set; nullopt when a stop signal abandoned it.
  virtual std::optional<Evaluation> evaluate() = 0;
  virtual void save_checkpoint(std::int64_t step_done) = 0;
  // Writes the trained model as a Hugging Face folder `dir` (world rank 0 writes; collective).
  virtual void write_output(const std::string& dir) = 0;
  virtual std::int64_t peak_memory_bytes() const = 0;
  // The device's memory in use now (DeviceMemory::device_used_bytes; 0 on CPUs).
  virtual std::int64_t device_used_bytes() const = 0;
  virtual void finish() = 0;  // after the last step and evaluation
};

// The warm-up steps of a run of `total_steps`: options.warmup_steps when positive, else
// options.warmup_share of the steps, rounded.
std::int64_t warmup_steps(const TrainOptions& options, std::int64_t total_steps);

// Hugging Face's get_linear_schedule_with_warmup for the 0-based `step` of `total_steps`, with
// warmup_steps(options, total_steps) warm-up steps.
double learning_rate(const TrainOptions& options, std::int64_t step, std::int64_t total_steps);

// Runs steps resumed_from_step (or 0) .. total (or stop_after_step), writing metrics of every
// log_every-th step and the last, printing log lines (world rank 0) every print_every-th step,
// the last and after every evaluation, evaluating every eval_every steps and after the last step
// (when `has_validation`), checkpointing every checkpoint_every steps and at the end (when
// options.checkpoint_dir is set), and stopping at a step boundary on a stop signal; a completed
// run then writes options.output_dir (when set).
TrainSummary run_training(const TrainOptions& options, const RunSize& size,
                          std::int64_t train_examples, bool has_validation, TrainRank& rank);

// The engines. Both take the checked options and data; `seq_len` is the data's sequence length
// and `cpu_memory` the counter of this thread's CPU tensors (CpuMemoryScope).
namespace compat {
class CpuMemoryCounter;
}  // namespace compat
class ParallelGroups;
std::unique_ptr<TrainRank> make_single_rank(const TrainOptions& options, const RunSize& size,
                                            const std::vector<EncodedExample>& train_data,
                                            const std::vector<EncodedExample>& validation_data,
                                            CpuMemoryCounter& cpu_memory);
std::unique_ptr<TrainRank> make_parallel_rank(const TrainOptions& options, const RunSize& size,
                                              const std::vector<EncodedExample>& train_data,
                                              const std::vector<EncodedExample>& validation_data,
                                              std::size_t seq_len, ParallelGroups& groups,
                                              CpuMemoryCounter& cpu_memory);

}  // namespace loom::executor
