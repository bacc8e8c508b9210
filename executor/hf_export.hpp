// Hugging Face model folders from loom train: what `--output DIR` writes at the end of a run and
// what `loom export` writes from a saved checkpoint, through one function whatever the layout.
//
// A Hugging Face folder (what transformers' AutoModelForSequenceClassification.from_pretrained
// and `loom logits --init` load):
//   config.json        the model's config: model_type bert / roberta, architectures
//                      ["BertForSequenceClassification"] / ["RobertaForSequenceClassification"],
//                      the sizes, layer_norm_eps, pad_token_id, id2label / label2id (the head's
//                      labels: TrainOptions::label_names, else the --init config's id2label when
//                      it names num_labels labels, else "LABEL_0", "LABEL_1", ... as
//                      transformers names them), _name_or_path (the ModelSpec's name), so that
//                      profiles::load_model reads back the same ModelSpec. With --init, the
//                      checkpoint's config.json is the starting point: its other fields stay.
//   model.safetensors  every parameter as a full fp32 tensor with its Hugging Face name, in
//                      Hugging Face order (as EncoderClassifier::save_safetensors writes them).
//   tokenizer files    copies of TrainOptions::tokenizer_files (vocab.txt, vocab.json,
//                      merges.txt, tokenizer.json, ...), under their own names.
// The folder is written into a temporary folder next to it and renamed into place (an existing
// model folder at DIR is replaced only then), by world rank 0 only.
//
// Many ranks: tp shards are gathered over the tp group (EncoderClassifier::full_state), ZeRO-3
// parameters are all-gathered from the dp shards first (FlatParameters::materialize), and the
// stages of pipeline ranks 1.. are sent over the pp group (point to point, on the rank's device)
// to world rank 0, which writes. No file system is shared between ranks.
//
// Checkpoint step folders (executor/checkpoint.hpp) hold config.json and the tokenizer files too
// (written by world rank 0), and a one-rank step folder holds model.safetensors: it is a Hugging
// Face folder as it stands. A many-rank step folder holds each rank's flat state instead
// (rank-R.pt); export_checkpoint builds the full tensors from them: the layout's ranks run as
// threads of this process over Gloo (executor/reshard.hpp's run_layout_ranks, which resuming in
// another layout uses too), each loads its rank's state into the training engine's
// FlatParameters, and they call the same export as the end of training.
#pragma once

#include <array>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "costmodel/strategy.hpp"
#include "executor/distributed.hpp"
#include "executor/flat_parameters.hpp"
#include "executor/model.hpp"
#include "executor/train.hpp"
#include "profiles/model_spec.hpp"

namespace loom::executor {

// The tokenizer files a Hugging Face folder may hold, by name.
inline constexpr std::array<const char*, 7> kTokenizerFileNames{"vocab.txt",
                                                                "vocab.json",
                                                                "merges.txt",
                                                                "tokenizer.json",
                                                                "tokenizer_config.json",
                                                                "special_tokens_map.json",
                                                                "added_tokens.json"};

// What a Hugging Face folder says besides the weights.
struct HfFolder {
  profiles::ModelSpec model;
  nlohmann::ordered_json base_config;    // the config.json to start from, or null
  std::vector<std::string> label_names;  // empty: base_config's id2label, else LABEL_i
  std::vector<std::string> tokenizer_files;
  double dropout = 0.1;  // written as the dropout rates when base_config has none
};

// The HfFolder of a run: the model, the --init folder's config.json (next to init_weights) when
// there is one, the labels and the tokenizer files. When `writes` (world rank 0), also checks
// what it will write: InputError for label names that are not num_labels distinct names
// (source "labels"), a tokenizer file that cannot be read, or an output_dir that is a file or a
// folder holding other files than a model's (source "--output").
HfFolder hf_folder_of(const TrainOptions& options, bool writes);

// config.json's object for `folder` (see the top of this file).
nlohmann::ordered_json hf_config(const HfFolder& folder);

// Writes config.json and copies the tokenizer files into the existing folder `dir`.
void write_hf_files(const std::filesystem::path& dir, const HfFolder& folder);

// Writes `dir` as a Hugging Face folder from full tensors (Hugging Face names and order): into a
// temporary folder next to it, then renamed into place. Throws std::runtime_error naming `dir`
// when a write fails (the temporary folder removed, an old `dir` left as it was).
void write_hf_folder(const std::filesystem::path& dir, const HfFolder& folder,
                     const std::vector<std::pair<std::string, torch::Tensor>>& state);

// Many ranks, collective over `groups`: the full model (gather_full_state) written to `dir` by
// world rank 0. Throws std::runtime_error on every rank when rank 0's write failed.
void export_rank_model(const std::filesystem::path& dir, const HfFolder& folder,
                       const std::vector<std::unique_ptr<EncoderClassifier>>& chunks,
                       const std::vector<costmodel::StageRange>& stages, FlatParameters& flat,
                       ParallelGroups& groups);

// `loom export`: writes `dir` as a Hugging Face folder from `checkpoint`, a step folder
// (holding trainer_state.json) or a --checkpoint folder (its latest step). `tokenizer_files`:
// the files to copy; empty = the step folder's own tokenizer files. One-rank checkpoints copy
// model.safetensors; many-rank ones are rebuilt (see the top of this file). Throws InputError for
// a path that is no checkpoint, an unreadable trainer_state.json, a missing or wrong rank file,
// or a `dir` that is a file or a folder holding other files (nothing is written then).
void export_checkpoint(const std::string& checkpoint, const std::filesystem::path& dir,
                       const std::vector<std::string>& tokenizer_files);

}  // namespace loom::executor
