// Checkpoints of loom train: step folders, the RNG state, trainer_state.json and how a run finds
// and checks the one it resumes from.
//
// One rank: `checkpoint_dir/step-NNNNNNNN/` holds model.safetensors (full fp32 weights, Hugging
// Face names; usable as an init checkpoint), optimizer.pt and rng.pt (torch::save), and
// trainer_state.json ({"format": "loom-checkpoint/1", "step", "epoch", "sample_offset", "seed",
// "global_batch", "micro_batch", "num_micro_batches", "total_steps", "train_examples",
// "loss_scale", "loss_scale_good_steps", "model"}).
// Many ranks: the folder holds trainer_state.json ({"format", "step", "epoch", "seed",
// "global_batch", "total_steps", "train_examples", "world_size", "layout", "model"}; "layout" is
// {"dp", "tp", "pp", "zero", "virtual_stages", "stages": [[first_layer, last_layer], ...]}) and
// rank-R.pt per world rank R (FlatParameters::state(), then the RNG states). It holds no
// model.safetensors: gathering the full model at every checkpoint would cost a pipeline-wide
// transfer (and a ZeRO-3 all-gather) and a second copy of the weights on disk each time, while the
// rank files already hold every parameter; `loom export` builds the Hugging Face folder from them
// when it is wanted (executor/hf_export.hpp). Both also hold config.json and the tokenizer files
// (StepFolderExtras, written by world rank 0), as the Hugging Face Trainer's checkpoint-N folders
// do, so a one-rank step folder is a Hugging Face model folder as it stands. Either resumes in any
// layout of the same model, seed and global batch: the same layout loads its own files, another one
// (or one rank <-> many) goes through executor/reshard.hpp. Either is written into a temporary
// folder in checkpoint_dir and renamed into place; only after that rename are older step folders
// removed, and only beyond the newest StepFolderExtras::keep (0 keeps all), so a run killed
// mid-write leaves the previous checkpoint whole.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "executor/distributed.hpp"
#include "executor/model.hpp"
#include "executor/train.hpp"

namespace loom::executor {

inline constexpr const char* kCheckpointFormat = "loom-checkpoint/1";
// A ZeRO-2/3 layout's "zero_shards": each block (the embeddings, each transformer layer, the head)
// padded to a multiple of dp and cut into dp chunks, a rank's shard its chunks in block order
// (flat_parameters.hpp). Layouts of ZeRO-0/1 do not carry it (one block: the whole buffer).
inline constexpr const char* kZeroShardsKey = "zero_shards";
inline constexpr const char* kZeroShardsBlocks = "blocks";
inline constexpr const char* kTrainerStateFile = "trainer_state.json";

// "step-NNNNNNNN" (eight digits at least).
std::string step_folder(std::int64_t step);
// The step of a `step-NNNNNNNN` folder name, or -1.
std::int64_t folder_step(const std::string& name);

// A checkpoint's trainer_state.json (InputError when unreadable or not JSON).
nlohmann::json read_trainer_state(const std::filesystem::path& checkpoint);
// trainer_state.json against this run: the same format, model, seed, global batch and training
// examples, or an InputError naming the field (source `source`). The layout may differ.
void check_trainer_state(const nlohmann::json& state, const std::string& source,
                         const profiles::ModelSpec& spec, std::uint64_t seed,
                         std::int64_t global_batch, std::int64_t train_count);

// A many-rank checkpoint's parallel layout (trainer_state.json's "layout").
struct CheckpointLayout {
  int dp = 1;
  int tp = 1;
  int pp = 1;
  int zero = 0;
  int virtual_stages = 1;
  std::vector<costmodel::StageRange> stages;  // pp * virtual_stages ranges, global chunk order
  int world_size() const { return dp * tp * pp; }
};

// trainer_state.json's "layout" of a run with `options` (stages: the options', else the even
// partition of pp * virtual_stages chunks; "zero_shards": "blocks" with ZeRO-2/3).
nlohmann::json layout_json(const TrainOptions& options);
// The "layout" of a many-rank trainer_state.json; InputError (source `source`, "$.layout") when
// it is missing, malformed, or not world_size = dp * tp * pp ranks of pp * virtual_stages stages,
// and ("$.layout.zero_shards") for a ZeRO-2/3 layout over dp > 1 without "zero_shards": "blocks".
CheckpointLayout read_layout(const nlohmann::json& state, const std::string& source);

// LibTorch's default generators' states: the CPU's, then (cuda) GPU device_index's.
std::vector<torch::Tensor> capture_rng(Device device, int device_index);
// Sets them back; InputError (source `source`) when `states` are not of a `device` run.
void restore_rng(const std::vector<torch::Tensor>& states, Device device, int device_index,
                 const std::string& source);

// What a step folder holds besides the training state, and how many step folders stay.
struct StepFolderExtras {
  // Writes config.json and the tokenizer files into the folder being written; empty = none.
  std::function<void(const std::filesystem::path& folder)> write_files;
  std::int64_t keep = 0;  // step folders kept after a write, the newest; 0 = all
};

// One rank: writes step folder `step` of `dir` (model, optimizer, rng, `state`) and removes older
// ones beyond extras.keep. `kill_midway` raises SIGKILL after the model file (fault injection).
// Throws std::runtime_error naming the folder when a write fails (the temporary folder removed).
void write_checkpoint(const std::filesystem::path& dir, std::int64_t step, EncoderClassifier& model,
                      torch::optim::AdamW& optimizer, const std::vector<torch::Tensor>& rng,
                      const nlohmann::ordered_json& state, const StepFolderExtras& extras,
                      bool kill_midway);

// Many ranks, collective over `world`: every rank writes rank-R.pt (`rank_state`), world rank 0
// `state` as trainer_state.json and the extras' files; once every rank has reported success rank
// 0 renames the folder into place and removes older ones beyond extras.keep. `kill_midway` raises
// SIGKILL after the rank's file. Throws std::runtime_error on every rank when any rank's write
// failed.
void write_rank_checkpoint(const std::filesystem::path& dir, std::int64_t step, ProcessGroup& world,
                           const std::vector<torch::Tensor>& rank_state,
                           const nlohmann::ordered_json& state, const StepFolderExtras& extras,
                           bool kill_midway);
// rank-R.pt of `checkpoint` for world rank R; InputError when unreadable or shorter than
// `min_tensors`.
std::vector<torch::Tensor> read_rank_state(const std::filesystem::path& checkpoint, int world_rank,
                                           std::size_t min_tensors);

}  // namespace loom::executor
