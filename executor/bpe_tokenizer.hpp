// RoBERTa's byte-level BPE tokenizer (GPT-2's scheme), compatible with a vocab.json + merges.txt
// pair as RoBERTa checkpoints ship them, no LibTorch.
//
// tokenize() follows GPT-2's encoder.py (Hugging Face's RobertaTokenizer, add_prefix_space false):
//   1. pre-tokenize: split the text with GPT-2's pattern, applied by hand over code points,
//        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//      (letters L*, numbers N*, white space = the Unicode White_Space characters); so a word
//      keeps the one space before it ("Hello world" -> "Hello", " world"), and of a run of white
//      space before a word all but the last character stay apart;
//   2. byte-level: every UTF-8 byte of a piece becomes one printable character of GPT-2's
//      bytes-to-unicode table (printable Latin-1 bytes stand for themselves, the others map to
//      U+0100 and up in byte order: space -> "Ġ" U+0120, newline -> "Ċ" U+010A), so any text has
//      tokens and no byte is lost;
//   3. BPE: the piece starts as one symbol per byte; repeatedly the adjacent pair with the lowest
//      merge rank (its line in merges.txt) is merged, every occurrence left to right, until no
//      pair has a rank; each symbol is a token of vocab.json (<unk> if, unusually, it is not).
// Bytes that are not valid UTF-8 are kept as characters of their own (neither letter, number
// nor space). Special tokens written in the text ("<s>") are tokenized as ordinary text.
//
// vocab.json is a JSON object token -> id; the embedding needs max id + 1 rows. merges.txt holds
// one merge "left right" a line, the rank is the line order; a first "#version" line and blank
// lines are skipped. As Hugging Face's tokenizers library requires, both tokens of a merge and
// their concatenation must be in the vocabulary. Special tokens are found by name: <s> (start,
// RoBERTa's cls), </s> (end, sep), <pad>, <unk> are required, <mask> is optional. RoBERTa's
// positions (padding id + 1 onwards) are the model's business, not the tokenizer's.
//
// Unicode categories come from libutf8proc. A tokenizer is an immutable value: every method is
// const and thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "executor/tokenizer.hpp"

namespace loom::executor {

// One merge rule and where it was read, for errors ("line 3", "$.model.merges[2]").
struct BpeMerge {
  std::string left;
  std::string right;
  std::string where;
};

// The tokens of a vocab.json object (token -> id, ids whole numbers in [0, 2^31)), in the
// object's order. InputError naming `source` and the JSON path otherwise.
std::vector<std::pair<std::string, std::int64_t>> bpe_vocab_from_json(const nlohmann::json& vocab,
                                                                      const std::string& source,
                                                                      const std::string& path);

// One merge written "left right" (two tokens, one space), read at `where` of `source`; InputError
// for anything else.
BpeMerge parse_bpe_merge(const std::string& text, const std::string& source,
                         const std::string& where);
// The merges of a merges.txt text (see above); `source` names it in errors, each merge is
// "line N".
std::vector<BpeMerge> parse_bpe_merges(const std::string& text, const std::string& source);

// The characters (UTF-8) that stand for the bytes of `bytes` in the byte-level alphabet.
std::string byte_level_text(std::string_view bytes);

class ByteLevelBpeTokenizer : public Tokenizer {
 public:
  // Reads vocab.json and merges.txt. InputError naming the file (and JSON path or line) when one
  // cannot be read, is malformed, a merge uses a token the vocabulary lacks, or a special token
  // is missing.
  static ByteLevelBpeTokenizer from_files(const std::string& vocab_json_path,
                                          const std::string& merges_txt_path);
  // The same from parsed parts. `vocab_source` names the vocabulary, `merges_source` the merges
  // in errors. add_prefix_space: a space is put before text that does not start with one (the
  // ByteLevel option of a tokenizer.json; RoBERTa's is false).
  static ByteLevelBpeTokenizer from_parts(
      const std::vector<std::pair<std::string, std::int64_t>>& vocab,
      const std::vector<BpeMerge>& merges, const std::string& vocab_source,
      const std::string& merges_source, bool add_prefix_space = false);

  // The pre-tokenized pieces of `text` (step 1, the original bytes).
  std::vector<std::string> pre_tokenize(std::string_view text) const;
  // The tokens of `text` in the byte-level alphabet ("Ġworld"), without <s>/</s>.
  std::vector<std::string> tokenize(std::string_view text) const;
  // The ids of `text`, without <s>/</s>.
  std::vector<std::int64_t> token_ids(std::string_view text) const;
  EncodedExample encode(std::string_view text, std::int64_t seq_len,
                        std::int64_t label) const override;

  // Max id + 1.
  std::int64_t vocab_size() const override { return vocab_size_; }
  std::string description() const override;
  // vocab.json and merges.txt for from_files; set_files() replaces them (a tokenizer.json).
  const std::vector<std::string>& files() const override { return files_; }
  void set_files(std::vector<std::string> files) { files_ = std::move(files); }

  // The id of `token` (byte-level alphabet), or -1 when it is not in the vocabulary.
  std::int64_t find_id(std::string_view token) const;
  std::size_t merge_count() const { return merges_.size(); }
  bool add_prefix_space() const { return add_prefix_space_; }

  std::int64_t pad_id() const override { return pad_id_; }
  std::int64_t unk_id() const { return unk_id_; }
  std::int64_t bos_id() const { return bos_id_; }    // <s>, RoBERTa's cls
  std::int64_t eos_id() const { return eos_id_; }    // </s>, RoBERTa's sep
  std::int64_t mask_id() const { return mask_id_; }  // -1 without <mask>

 private:
  ByteLevelBpeTokenizer() = default;

  // Appends the ids of one pre-tokenized piece.
  void piece_ids(std::string_view piece, std::vector<std::int64_t>& out) const;

  // Lets the id map be searched with a std::string_view.
  struct StringHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  // A merge: its rank and the id of the merged token.
  struct MergeResult {
    std::int64_t rank = 0;
    std::int64_t id = 0;
  };

  std::unordered_map<std::string, std::int64_t, StringHash, std::equal_to<>> ids_;
  std::vector<std::string> tokens_;  // by id; "" where no token has the id
  // Key: left id << 32 | right id.
  std::unordered_map<std::uint64_t, MergeResult> merges_;
  std::array<std::int64_t, 256> byte_ids_{};  // id of each byte's character, -1 if none
  std::vector<std::string> files_;
  std::int64_t vocab_size_ = 0;
  bool add_prefix_space_ = false;
  std::int64_t pad_id_ = 0;
  std::int64_t unk_id_ = 0;
  std::int64_t bos_id_ = 0;
  std::int64_t eos_id_ = 0;
  std::int64_t mask_id_ = -1;
};

}  // namespace loom::executor
