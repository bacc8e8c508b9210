#include "executor/tokenizer_files.hpp"

#include <algorithm>
#include <filesystem>
#include <optional>
#include <utility>
#include <vector>

#include "executor/bpe_tokenizer.hpp"
#include "profiles/errors.hpp"
#include "profiles/json_reader.hpp"
#include "profiles/loader.hpp"

namespace loom::executor {
namespace {

namespace fs = std::filesystem;

constexpr const char* kTwoFileForm =
    "Loom reads byte-level BPE (model \"BPE\", pre-tokenizer \"ByteLevel\") and WordPiece "
    "tokenizer.json files; for another tokenizer give its two-file form: vocab.json + merges.txt, "
    "or vocab.txt";
constexpr const char* kForms =
    "a tokenizer: vocab.txt, vocab.json + merges.txt, tokenizer.json, or a folder holding them";

bool is_file(const fs::path& path) {
  std::error_code ec;
  return fs::is_regular_file(path, ec);
}

// The folder's tokenizer_config.json and special_tokens_map.json, when present.
std::vector<std::string> companion_files(const fs::path& folder) {
  std::vector<std::string> out;
  for (const char* name : {"tokenizer_config.json", "special_tokens_map.json"}) {
    if (is_file(folder / name)) out.push_back((folder / name).string());
  }
  return out;
}

std::vector<std::string> with_companions(std::vector<std::string> files, const fs::path& folder) {
  for (std::string& file : companion_files(folder)) files.push_back(std::move(file));
  return files;
}

// tokenizer_config.json's "do_lower_case", when the file has it.
std::optional<bool> config_lower_case(const fs::path& folder) {
  const fs::path config = folder / "tokenizer_config.json";
  if (!is_file(config)) return std::nullopt;
  const nlohmann::json json =
      profiles::parse_json_text(profiles::read_text_file(config.string()), config.string());
  profiles::ObjectReader reader(json, config.string());
  return reader.optional_boolean("do_lower_case");
}

// The BertNormalizer's "lowercase" of a tokenizer.json (true when absent, as in Hugging Face).
bool normalizer_lower_case(const nlohmann::json& json, const std::string& source) {
  profiles::ObjectReader root(json, source);
  if (!root.has("normalizer")) return true;
  profiles::ObjectReader normalizer = root.object("normalizer");
  const std::string type = normalizer.optional_string("type").value_or("");
  if (type != "BertNormalizer") {
    normalizer.fail("type", std::string("\"BertNormalizer\" for a WordPiece tokenizer, found \"") +
                                type + "\"; " + kTwoFileForm);
  }
  return normalizer.optional_boolean("lowercase").value_or(true);
}

// The tokenizer.json's "added_tokens" that model.vocab lacks, appended to `vocab`.
void add_added_tokens(const nlohmann::json& json, const std::string& source,
                      std::vector<std::pair<std::string, std::int64_t>>& vocab) {
  profiles::ObjectReader root(json, source);
  if (!root.has("added_tokens")) return;
  const nlohmann::json& added = root.array("added_tokens");
  for (std::size_t i = 0; i < added.size(); ++i) {
    profiles::ObjectReader token(added[i], source, root.element_path("added_tokens", i));
    const std::string content = token.string("content");
    const std::int64_t id = token.integer("id", 0, profiles::ObjectReader::kIntMax);
    const bool known = std::any_of(vocab.begin(), vocab.end(),
                                   [&](const auto& entry) { return entry.first == content; });
    if (!known) vocab.emplace_back(content, id);
  }
}

std::vector<BpeMerge> json_merges(const nlohmann::json& merges, const std::string& source,
                                  const std::string& path) {
  if (!merges.is_array()) {
    throw InputError(source, path, "an array of merges (\"a b\" or [\"a\", \"b\"])");
  }
  std::vector<BpeMerge> out;
  out.reserve(merges.size());
  for (std::size_t i = 0; i < merges.size(); ++i) {
    const std::string where = path + "[" + std::to_string(i) + "]";
    const nlohmann::json& m = merges[i];
    if (m.is_string()) {
      out.push_back(parse_bpe_merge(m.get<std::string>(), source, where));
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      out.push_back(BpeMerge{m[0].get<std::string>(), m[1].get<std::string>(), where});
    } else {
      throw InputError(source, where,
                       "a merge: \"a b\" or [\"a\", \"b\"], found " + m.dump().substr(0, 60));
    }
  }
  return out;
}

// The ByteLevel pre-tokenizer's add_prefix_space; InputError for another pre-tokenizer.
bool byte_level_prefix_space(const nlohmann::json& json, const std::string& source) {
  profiles::ObjectReader root(json, source);
  if (root.has("normalizer")) {
    root.fail("normalizer", std::string("null for a byte-level BPE tokenizer; ") + kTwoFileForm);
  }
  if (!root.has("pre_tokenizer")) {
    root.fail("pre_tokenizer", std::string("a \"ByteLevel\" pre-tokenizer; ") + kTwoFileForm);
  }
  const nlohmann::json* pre = &json["pre_tokenizer"];
  std::string path = "$.pre_tokenizer";
  // A Sequence of one ByteLevel is the same.
  if (pre->is_object() && pre->value("type", "") == "Sequence" && pre->contains("pretokenizers") &&
      (*pre)["pretokenizers"].is_array() && (*pre)["pretokenizers"].size() == 1) {
    pre = &(*pre)["pretokenizers"][0];
    path += ".pretokenizers[0]";
  }
  profiles::ObjectReader reader(*pre, source, path);
  const std::string type = reader.optional_string("type").value_or("");
  if (type != "ByteLevel") {
    reader.fail("type", "\"ByteLevel\", found \"" + type + "\"; " + kTwoFileForm);
  }
  if (!reader.optional_boolean("use_regex").value_or(true)) {
    reader.fail("use_regex", std::string("true (GPT-2's split); ") + kTwoFileForm);
  }
  return reader.optional_boolean("add_prefix_space").value_or(false);
}

std::unique_ptr<Tokenizer> bpe_from_json(const nlohmann::json& json, const std::string& source) {
  profiles::ObjectReader root(json, source);
  profiles::ObjectReader model = root.object("model");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (!model.optional_string(key).value_or("").empty()) {
      model.fail(key, std::string("empty or null for a byte-level BPE; ") + kTwoFileForm);
    }
  }
  const bool add_prefix_space = byte_level_prefix_space(json, source);
  std::vector<std::pair<std::string, std::int64_t>> vocab = bpe_vocab_from_json(
      json["model"].contains("vocab") ? json["model"]["vocab"] : nlohmann::json(), source,
      "$.model.vocab");
  add_added_tokens(json, source, vocab);
  const std::vector<BpeMerge> merges =
      json_merges(json["model"].contains("merges") ? json["model"]["merges"] : nlohmann::json(),
                  source, "$.model.merges");
  auto tokenizer = std::make_unique<ByteLevelBpeTokenizer>(
      ByteLevelBpeTokenizer::from_parts(vocab, merges, source, source, add_prefix_space));
  tokenizer->set_files(with_companions({source}, fs::path(source).parent_path()));
  return tokenizer;
}

std::unique_ptr<Tokenizer> wordpiece_from_json(const nlohmann::json& json,
                                               const std::string& source) {
  profiles::ObjectReader root(json, source);
  profiles::ObjectReader model = root.object("model");
  const std::string prefix = model.optional_string("continuing_subword_prefix").value_or("##");
  if (prefix != "##") {
    model.fail("continuing_subword_prefix", "\"##\", found \"" + prefix + "\"; " + kTwoFileForm);
  }
  std::vector<std::pair<std::string, std::int64_t>> vocab = bpe_vocab_from_json(
      json["model"].contains("vocab") ? json["model"]["vocab"] : nlohmann::json(), source,
      "$.model.vocab");
  add_added_tokens(json, source, vocab);
  std::vector<std::string> tokens(vocab.size());
  for (const auto& [token, id] : vocab) {
    if (id >= static_cast<std::int64_t>(vocab.size())) {
      throw InputError(source, "$.model.vocab",
                       "ids from 0 to " + std::to_string(vocab.size() - 1) + " numbering its " +
                           std::to_string(vocab.size()) + " tokens; \"" + token.substr(0, 60) +
                           "\" has id " + std::to_string(id));
    }
    tokens[static_cast<std::size_t>(id)] = token;
  }
  const fs::path folder = fs::path(source).parent_path();
  const bool lower_case = config_lower_case(folder).value_or(normalizer_lower_case(json, source));
  auto tokenizer = std::make_unique<WordPieceTokenizer>(
      WordPieceTokenizer::from_tokens(std::move(tokens), lower_case, source));
  tokenizer->set_files(with_companions({source}, folder));
  return tokenizer;
}

std::unique_ptr<Tokenizer> tokenizer_from_json(const nlohmann::json& json,
                                               const std::string& source) {
  profiles::ObjectReader root(json, source);
  profiles::ObjectReader model = root.object("model");
  const std::string type = model.optional_string("type").value_or("");
  if (type == "BPE") return bpe_from_json(json, source);
  if (type == "WordPiece") return wordpiece_from_json(json, source);
  model.fail("type", "\"BPE\" or \"WordPiece\", found \"" + type + "\"; " + kTwoFileForm);
}

std::unique_ptr<Tokenizer> wordpiece_files(const fs::path& vocab_txt) {
  const fs::path folder = vocab_txt.parent_path();
  bool lower_case = true;
  if (std::optional<bool> configured = config_lower_case(folder)) {
    lower_case = *configured;
  } else if (is_file(folder / "tokenizer.json")) {
    const std::string json_path = (folder / "tokenizer.json").string();
    const nlohmann::json json =
        profiles::parse_json_text(profiles::read_text_file(json_path), json_path);
    lower_case = normalizer_lower_case(json, json_path);
  }
  auto tokenizer = std::make_unique<WordPieceTokenizer>(
      WordPieceTokenizer::from_file(vocab_txt.string(), lower_case));
  tokenizer->set_files(with_companions({vocab_txt.string()}, folder));
  return tokenizer;
}

std::unique_ptr<Tokenizer> bpe_files(const fs::path& vocab_json, const fs::path& merges_txt) {
  if (!is_file(merges_txt)) {
    throw InputError(merges_txt.string(), "",
                     "the merges of " + vocab_json.string() +
                         " (a byte-level BPE vocabulary needs merges.txt beside it); no such file");
  }
  auto tokenizer = std::make_unique<ByteLevelBpeTokenizer>(
      ByteLevelBpeTokenizer::from_files(vocab_json.string(), merges_txt.string()));
  tokenizer->set_files(
      with_companions({vocab_json.string(), merges_txt.string()}, vocab_json.parent_path()));
  return tokenizer;
}

std::unique_ptr<Tokenizer> folder_tokenizer(const fs::path& folder) {
  const bool vocab_txt = is_file(folder / "vocab.txt");
  const bool vocab_json = is_file(folder / "vocab.json");
  const bool tokenizer_json = is_file(folder / "tokenizer.json");
  if (vocab_txt && vocab_json) {
    throw InputError(folder.string(), "",
                     "one tokenizer, found both vocab.txt (WordPiece) and vocab.json (BPE): name "
                     "the file with --tokenizer");
  }
  if (vocab_json && (is_file(folder / "merges.txt") || !tokenizer_json)) {
    return bpe_files(folder / "vocab.json", folder / "merges.txt");
  }
  if (vocab_txt) return wordpiece_files(folder / "vocab.txt");
  if (tokenizer_json) return load_tokenizer_json((folder / "tokenizer.json").string());
  throw InputError(folder.string(), "",
                   std::string(kForms) +
                       "; this folder holds none of vocab.txt, vocab.json, "
                       "tokenizer.json");
}

}  // namespace

std::unique_ptr<Tokenizer> load_tokenizer_json(const std::string& path) {
  const nlohmann::json json = profiles::parse_json_text(profiles::read_text_file(path), path);
  return tokenizer_from_json(json, path);
}

bool holds_tokenizer(const std::string& folder) {
  const fs::path f(folder);
  return is_file(f / "vocab.txt") || is_file(f / "vocab.json") || is_file(f / "tokenizer.json");
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  const fs::path p(path);
  std::error_code ec;
  if (fs::is_directory(p, ec)) return folder_tokenizer(p);
  if (!is_file(p)) throw InputError(path, "", std::string(kForms) + "; no such file or folder");
  if (p.filename() == "merges.txt") return bpe_files(p.parent_path() / "vocab.json", p);
  if (p.extension() != ".json") return wordpiece_files(p);
  const nlohmann::json json = profiles::parse_json_text(profiles::read_text_file(path), path);
  if (json.is_object() && json.contains("model")) return tokenizer_from_json(json, path);
  return bpe_files(p, p.parent_path() / "merges.txt");
}

}  // namespace loom::executor
