// Resharding: a checkpoint of one parallel layout resumed in another (dp, tp, pp, ZeRO stage,
// virtual stages, stage partition; one rank <-> many ranks).
//
// The training state is first rebuilt as full tensors by Hugging Face name (TrainingState): the
// parameters, AdamW's exp_avg and exp_avg_sq, AdamW's step count and the RNG states.
//   One-rank checkpoint: model.safetensors, optimizer.pt (torch::optim::AdamW's state, mapped to
//   names through the parameter order of its two groups) and rng.pt.
//   Many-rank checkpoint: the checkpoint's ranks run as threads of this process over Gloo (as
//   `loom export` runs them, executor/hf_export.hpp); each loads its rank-R.pt into the flat
//   engine training used, and gather_full_state gathers the dp shards (ZeRO-3), the tp shards
//   and the pipeline stages to rank 0. The moments go through the same gather in the parameters'
//   place: an engine with ZeRO-3 for a ZeRO >= 1 checkpoint (its moments cover the ZeRO-3
//   parameter shard), with ZeRO-0 otherwise (they cover the whole flat buffer).
// Then every rank of the new layout takes its part: its tp slices of the parameters of its
// stages, flattened by an engine of its own layout (ZeRO-3's for the moments when the new ZeRO
// stage is >= 1), loaded into its FlatParameters with load_state; one rank copies them into its
// model and creates torch::optim::AdamW's per-parameter state.
//
// What is carried: the parameters and both moments exactly (copies, no arithmetic), AdamW's step
// count, the step (so the learning-rate schedule, the epoch and the sample offset, which are
// functions of the step and the global batch, which must be the same), and the RNG streams: every
// rank of the new layout takes the generator states of the old layout's world rank 0 (one rank:
// rng.pt), as a fresh run seeds every rank alike, so the ranks of a tp group stay in step. A
// model without dropout draws nothing, and its losses continue exactly as those of a run of the
// new layout started from the same state; with dropout the masks differ from the old layout's
// (they depend on which rank draws them) but are reproducible. A CUDA generator state is restored
// only when both runs are on CUDA (a CPU checkpoint resumed on a GPU keeps the GPU's seeded
// generator, and the reverse drops it).
//
// Memory: each rank of the new run rebuilds the whole model once at resume, on the CPU: three
// full fp32 copies (parameters and two moments, 12 bytes per parameter) plus, for a many-rank
// checkpoint, the old layout's engines (their parameters, moments and gradient buffers, 16 to 20
// bytes per parameter over all its ranks) while they run; all of it is freed before training.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "executor/checkpoint.hpp"
#include "executor/distributed.hpp"
#include "executor/flat_parameters.hpp"
#include "executor/model.hpp"
#include "executor/train.hpp"
#include "planner/plan.hpp"

namespace loom::executor {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// A checkpoint's training state as full tensors (fp32, CPU, Hugging Face names and order).
struct TrainingState {
  NamedTensors parameters;
  NamedTensors exp_avg;
  NamedTensors exp_avg_sq;
  std::int64_t optimizer_step = 0;  // AdamW's step count (its bias corrections)
  std::vector<torch::Tensor> rng;   // capture_rng's states of world rank 0 (one rank: rng.pt)
};

// Whether a run with `options` resuming from `state` (a trainer_state.json) must reshard: a
// many-rank checkpoint of another layout, or one rank <-> many ranks.
bool needs_reshard(const nlohmann::json& state, const TrainOptions& options);

// Reads the training state of the step folder `step` (its trainer_state.json `state`, already
// checked against the run's model). InputError for missing or unreadable files, and rank states
// that do not fit the layout trainer_state.json names.
TrainingState read_training_state(const std::filesystem::path& step, const nlohmann::json& state);

// Many ranks: loads `full` into this rank's `flat` (ZeRO stage `zero`) over `chunks` (this
// rank's model chunks, whose parameters `flat` holds). Collective-free.
void load_training_state(const TrainingState& full,
                         const std::vector<std::unique_ptr<EncoderClassifier>>& chunks,
                         FlatParameters& flat, int zero, ParallelGroups& groups,
                         const std::string& source);
// One rank: copies `full` into `model` (the whole model) and sets `optimizer`'s state for each
// of its parameters (on `device`).
void load_training_state(const TrainingState& full, EncoderClassifier& model,
                         torch::optim::AdamW& optimizer, const torch::Device& device);
// Sets this process's generators from `full.rng` (see the top of this file).
void restore_resharded_rng(const TrainingState& full, Device device, int device_index);

// The memory check of a layout a checkpoint is resumed in: InputError (source `source`, path
// "$.strategy") naming the first pipeline stage whose predicted peak memory exceeds the memory of
// the plan's device (planner::evaluate_strategy with the plan's cost model).
void check_plan_memory(const planner::Plan& plan, const std::string& source);
// Before a run of `plan` with `options` (loom train): when options.resume finds a checkpoint that
// must be resharded into the plan's layout, check_plan_memory(plan, source).
void check_resume_memory(const TrainOptions& options, const planner::Plan& plan,
                         const std::string& source);

// The machinery shared with `loom export`: one rank of a checkpoint's layout as training built
// it, with dropout 0 on the CPU: its model chunks (global chunk k * pp + pp rank) and a
// flat-parameter engine over them with ZeRO stage `zero` (the layout's, or another for the
// moments).
struct LayoutRank {
  std::vector<std::unique_ptr<EncoderClassifier>> chunks;
  std::unique_ptr<FlatParameters> flat;
};
LayoutRank build_layout_rank(const profiles::ModelSpec& model, const CheckpointLayout& layout,
                             int zero, std::uint64_t seed, ParallelGroups& groups);

// Runs body(groups) for every rank of `layout` as a thread of this process, over Gloo on an
// in-process store; rethrows the failure of the lowest failing rank after all have stopped.
void run_layout_ranks(const CheckpointLayout& layout,
                      const std::function<void(ParallelGroups& groups)>& body);

// Runs `load` on every rank of `groups` and tells every rank whether all succeeded: a rank whose
// `load` threw InputError rethrows it; the others return false (true when every rank loaded).
bool loaded_everywhere(ParallelGroups& groups, const std::function<void()>& load);

// InputError naming the first rank-R.pt of `layout` missing from `step`.
void check_rank_files(const std::filesystem::path& step, const CheckpointLayout& layout);

// Many ranks, collective over `groups`: every parameter as a full tensor (fp32, CPU, Hugging
// Face names and order) on world rank 0, from every rank's `chunks` (this rank's model chunks;
// global chunk g = k * pp + pp rank holds stages[g]) and `flat` (their flat parameters; ZeRO-3
// gathers them first and releases them after); empty on the other ranks.
std::vector<std::pair<std::string, torch::Tensor>> gather_full_state(
    const std::vector<std::unique_ptr<EncoderClassifier>>& chunks,
    const std::vector<costmodel::StageRange>& stages, FlatParameters& flat, ParallelGroups& groups);

// The parameters of `chunks` as FlatParameters takes them: decay by name, and tp-replicated
// parameters counted in the global norm on tp rank 0 only (`first_tp`).
std::vector<std::vector<FlatParameter>> flat_parameters_of(
    const std::vector<std::unique_ptr<EncoderClassifier>>& chunks, bool first_tp);

}  // namespace loom::executor
