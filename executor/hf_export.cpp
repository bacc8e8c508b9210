#include "executor/hf_export.hpp"

#include <unistd.h>

#include <algorithm>
#include <exception>
#include <functional>
#include <set>
#include <stdexcept>
#include <system_error>

#include "executor/checkpoint.hpp"
#include "executor/reshard.hpp"
#include "executor/safetensors.hpp"
#include "executor/tokenizer_files.hpp"
#include "profiles/errors.hpp"
#include "profiles/loader.hpp"

namespace loom::executor {

namespace fs = std::filesystem;

namespace {

nlohmann::ordered_json read_config_object(const fs::path& path) {
  const std::string text = profiles::read_text_file(path.string());
  nlohmann::ordered_json value;
  try {
    value = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw InputError(path.string(), "", std::string("valid JSON (") + e.what() + ")");
  }
  if (!value.is_object()) throw InputError(path.string(), "$", "a JSON object");
  return value;
}

// The folder `dir` names, absolute ("out/" and "out" alike).
fs::path folder_path(const fs::path& dir) {
  fs::path p = fs::absolute(dir).lexically_normal();
  if (!p.has_filename()) p = p.parent_path();
  return p;
}

// A model folder may replace an older model folder, never a file or a folder of other files.
void check_output_folder(const fs::path& dir, const std::string& source) {
  std::error_code error;
  const fs::path p = folder_path(dir);
  // The new folder is made next to `p`: its nearest existing folder must take it (found now, not
  // after the run).
  fs::path existing = p.parent_path();
  while (existing.has_relative_path() && !fs::exists(existing, error)) {
    existing = existing.parent_path();
  }
  if (fs::is_directory(existing, error) && ::access(existing.c_str(), W_OK) != 0) {
    throw InputError(source, "",
                     "a folder Loom can write in: " + existing.string() + " is not writable");
  }
  if (!fs::exists(p, error)) return;
  if (!fs::is_directory(p, error)) {
    throw InputError(source, "",
                     "a folder to write the model into; " + dir.string() + " is a file");
  }
  // Replacing a folder replaces it whole: only one holding nothing but what Loom writes there, so
  // that --output cannot take a checkpoint, a Hub clone or any other folder with it.
  for (const fs::directory_entry& entry : fs::directory_iterator(p, error)) {
    const std::string name = entry.path().filename().string();
    const bool ours = name == "config.json" || name == "model.safetensors" ||
                      std::find(kTokenizerFileNames.begin(), kTokenizerFileNames.end(), name) !=
                          kTokenizerFileNames.end();
    if (!ours) {
      throw InputError(source, "",
                       "a new or empty folder, or a model folder Loom wrote (config.json, "
                       "model.safetensors, tokenizer files) to replace; " +
                           dir.string() + " holds " + name);
    }
  }
}

void check_tokenizer_files(const std::vector<std::string>& files, const std::string& source) {
  std::error_code error;
  for (const std::string& file : files) {
    if (!fs::is_regular_file(file, error)) {
      throw InputError(source, "", "readable tokenizer files; " + file + " is not a file");
    }
  }
}

// The head's label names: the folder's own, the base config's id2label when it names `count`
// labels "0".."count-1", else transformers' LABEL_i.
std::vector<std::string> label_names_of(const HfFolder& f, std::int64_t count) {
  if (!f.label_names.empty()) return f.label_names;
  std::vector<std::string> names;
  const nlohmann::ordered_json& base = f.base_config;
  if (base.is_object() && base.contains("id2label") && base["id2label"].is_object() &&
      static_cast<std::int64_t>(base["id2label"].size()) == count) {
    for (std::int64_t i = 0; i < count; ++i) {
      const auto it = base["id2label"].find(std::to_string(i));
      if (it == base["id2label"].end() || !it->is_string()) break;
      names.push_back(it->get<std::string>());
    }
  }
  if (static_cast<std::int64_t>(names.size()) == count) return names;
  names.clear();
  for (std::int64_t i = 0; i < count; ++i) names.push_back("LABEL_" + std::to_string(i));
  return names;
}

// model.safetensors from full tensors, as fp32 (the form EncoderClassifier::save_safetensors
// writes an fp32 model in).
void write_model_file(const fs::path& path,
                      const std::vector<std::pair<std::string, torch::Tensor>>& state) {
  std::vector<torch::Tensor> keep_alive;
  std::vector<TensorView> views;
  for (const auto& [name, tensor] : state) {
    const torch::Tensor t = tensor.to(torch::kCPU).to(torch::kFloat).contiguous();
    keep_alive.push_back(t);
    TensorView view;
    view.name = name;
    view.dtype = DType::kF32;
    view.shape = t.sizes().vec();
    view.data = static_cast<const std::byte*>(t.data_ptr());
    view.size_bytes = static_cast<std::size_t>(t.nbytes());
    views.push_back(std::move(view));
  }
  write_safetensors(path.string(), views, {{"format", "pt"}});
}

// Fills a temporary folder next to `dir` with `fill`, then renames it to `dir` (an old `dir`
// moved aside first and removed after). A failure removes the temporary folder: InputError
// passes as it is, anything else becomes std::runtime_error naming `dir`.
void write_folder_atomically(const fs::path& dir,
                             const std::function<void(const fs::path&)>& fill) {
  const fs::path target = folder_path(dir);
  const std::string pid = std::to_string(static_cast<long long>(::getpid()));
  const fs::path tmp = target.parent_path() / (".tmp-" + target.filename().string() + "-" + pid);
  auto failed = [&](const std::string& what) {
    std::error_code ignored;
    fs::remove_all(tmp, ignored);
    throw std::runtime_error("cannot write model folder " + dir.string() + ": " + what);
  };
  try {
    fs::create_directories(target.parent_path());
    fs::remove_all(tmp);
    fs::create_directory(tmp);
    fill(tmp);
    profiles::replace_folder(tmp, target);
  } catch (const InputError&) {
    std::error_code ignored;
    fs::remove_all(tmp, ignored);
    throw;
  } catch (const c10::Error& e) {
    failed(e.what_without_backtrace());
  } catch (const std::exception& e) {
    failed(e.what());
  }
}

// The ranks of a many-rank checkpoint as threads: each loads its rank-R.pt into the engine
// training used and joins the export.
void export_rank_checkpoint(const fs::path& step, const nlohmann::json& state,
                            const HfFolder& folder, const fs::path& dir) {
  const CheckpointLayout l = read_layout(state, (step / kTrainerStateFile).string());
  check_rank_files(step, l);
  const auto seed = state.value("seed", std::uint64_t{42});
  run_layout_ranks(l, [&](ParallelGroups& groups) {
    LayoutRank r = build_layout_rank(folder.model, l, l.zero, seed, groups);
    const int rank = groups.world_rank();
    const bool loaded = loaded_everywhere(groups, [&] {
      const std::vector<torch::Tensor> saved = read_rank_state(step, rank, 4);
      r.flat->load_state({saved.begin(), saved.begin() + 4},
                         (step / ("rank-" + std::to_string(rank) + ".pt")).string());
    });
    if (loaded) export_rank_model(dir, folder, r.chunks, l.stages, *r.flat, groups);
  });
}

}  // namespace

HfFolder hf_folder_of(const TrainOptions& o, bool writes) {
  HfFolder f;
  f.model = o.model;
  f.dropout = o.dropout;
  f.label_names = o.label_names;
  f.tokenizer_files = o.tokenizer_files;
  if (!o.init_weights.empty()) {
    const fs::path config = fs::path(o.init_weights).parent_path() / "config.json";
    std::error_code error;
    if (fs::exists(config, error)) f.base_config = read_config_object(config);
  }
  if (!writes) return f;
  const std::int64_t count = o.model.num_labels.value_or(2);
  const std::set<std::string> distinct(f.label_names.begin(), f.label_names.end());
  if (!f.label_names.empty() && (static_cast<std::int64_t>(f.label_names.size()) != count ||
                                 distinct.size() != f.label_names.size())) {
    throw InputError("labels", "",
                     std::to_string(count) +
                         " distinct label names (the model's num_labels), found " +
                         std::to_string(f.label_names.size()));
  }
  check_tokenizer_files(f.tokenizer_files, "--tokenizer");
  if (!o.output_dir.empty()) check_output_folder(o.output_dir, "--output");
  return f;
}

nlohmann::ordered_json hf_config(const HfFolder& f) {
  using Json = nlohmann::ordered_json;
  const profiles::ModelSpec& m = f.model;
  const bool roberta = m.model_type == profiles::ModelType::kRoberta;
  Json c = f.base_config.is_object() ? f.base_config : Json::object();
  auto set_default = [&c](const char* key, const Json& value) {
    if (!c.contains(key)) c[key] = value;
  };
  c["_name_or_path"] = m.name;
  c["architectures"] =
      Json::array({roberta ? "RobertaForSequenceClassification" : "BertForSequenceClassification"});
  c["model_type"] = roberta ? "roberta" : "bert";
  c["vocab_size"] = m.vocab;
  c["hidden_size"] = m.hidden;
  c["num_hidden_layers"] = m.layers;
  c["num_attention_heads"] = m.heads;
  c["intermediate_size"] = m.ffn_hidden;
  c["max_position_embeddings"] = m.max_positions;
  c["type_vocab_size"] = m.type_vocab;
  c["layer_norm_eps"] = layer_norm_eps(m.model_type);
  c["pad_token_id"] = pad_token_id(m.model_type);
  c["tie_word_embeddings"] = m.tied_embeddings;
  c["hidden_act"] = profiles::to_string(m.activation);  // what the weights were trained with
  set_default("hidden_dropout_prob", f.dropout);
  set_default("attention_probs_dropout_prob", f.dropout);
  set_default("classifier_dropout", nullptr);
  set_default("initializer_range", 0.02);
  set_default("position_embedding_type", "absolute");
  if (roberta) {
    set_default("bos_token_id", 0);
    set_default("eos_token_id", 2);
  }
  // transformers derives num_labels from id2label; both present and different is an error there.
  c.erase("num_labels");
  const std::vector<std::string> names = label_names_of(f, m.num_labels.value_or(2));
  Json id2label = Json::object();
  Json label2id = Json::object();
  for (std::size_t i = 0; i < names.size(); ++i) {
    id2label[std::to_string(i)] = names[i];
    label2id[names[i]] = i;
  }
  c["id2label"] = id2label;
  c["label2id"] = label2id;
  set_default("problem_type", "single_label_classification");
  c["torch_dtype"] = "float32";
  return c;
}

void write_hf_files(const fs::path& dir, const HfFolder& folder) {
  profiles::write_file_atomically((dir / "config.json").string(), hf_config(folder).dump(2) + "\n");
  for (const std::string& file : folder.tokenizer_files) {
    fs::copy_file(file, dir / fs::path(file).filename(), fs::copy_options::overwrite_existing);
  }
}

void write_hf_folder(const fs::path& dir, const HfFolder& folder,
                     const std::vector<std::pair<std::string, torch::Tensor>>& state) {
  write_folder_atomically(dir, [&](const fs::path& tmp) {
    write_model_file(tmp / "model.safetensors", state);
    write_hf_files(tmp, folder);
  });
}

void export_rank_model(const fs::path& dir, const HfFolder& folder,
                       const std::vector<std::unique_ptr<EncoderClassifier>>& chunks,
                       const std::vector<costmodel::StageRange>& stages, FlatParameters& flat,
                       ParallelGroups& groups) {
  const std::vector<std::pair<std::string, torch::Tensor>> state =
      gather_full_state(chunks, stages, flat, groups);
  std::string error;
  if (groups.world_rank() == 0) {
    try {
      write_hf_folder(dir, folder, state);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  // Every rank learns whether rank 0 wrote the folder.
  torch::Tensor failed = torch::tensor({error.empty() ? 0.0 : 1.0}, torch::kDouble);
  groups.world().allreduce_sum(failed);
  if (failed.item<double>() != 0) {
    throw std::runtime_error(error.empty() ? "cannot write model folder " + dir.string() +
                                                 ": world rank 0 failed to write it"
                                           : error);
  }
}

void export_checkpoint(const std::string& checkpoint, const fs::path& dir,
                       const std::vector<std::string>& tokenizer_files) {
  fs::path step(checkpoint);
  std::error_code error;
  if (!fs::exists(step / kTrainerStateFile, error)) {
    const std::optional<std::string> latest = latest_checkpoint(checkpoint);
    if (!latest) {
      throw InputError(checkpoint, "",
                       "a checkpoint of loom train: a step folder holding " +
                           std::string(kTrainerStateFile) +
                           ", or a --checkpoint folder holding step-NNNNNNNN folders");
    }
    step = *latest;
  }
  const nlohmann::json state = read_trainer_state(step);
  const std::string source = (step / kTrainerStateFile).string();
  HfFolder folder;
  if (!state.contains("model")) throw InputError(source, "$.model", "the model (loom-model/1)");
  folder.model = profiles::model_from_json(state.at("model"), source);
  check_encoder(folder.model);
  if (fs::exists(step / "config.json", error)) {
    folder.base_config = read_config_object(step / "config.json");
  }
  folder.tokenizer_files = tokenizer_files;
  if (tokenizer_files.empty() && holds_tokenizer(step.string())) {
    folder.tokenizer_files = load_tokenizer(step.string())->files();
  }
  check_tokenizer_files(folder.tokenizer_files, "--tokenizer");
  check_output_folder(dir, "-o");
  if (!state.contains("layout")) {  // one rank: the step folder holds the full model
    const fs::path weights = step / "model.safetensors";
    if (!fs::is_regular_file(weights, error)) {
      throw InputError(weights.string(), "", "the checkpoint's weights (model.safetensors)");
    }
    write_folder_atomically(dir, [&](const fs::path& tmp) {
      fs::copy_file(weights, tmp / "model.safetensors");
      write_hf_files(tmp, folder);
    });
    return;
  }
  export_rank_checkpoint(step, state, folder, dir);
}

}  // namespace loom::executor
