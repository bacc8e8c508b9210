// BERT's WordPiece tokenizer, compatible with a BERT vocab.txt (one token per line, id = line
// number from 0), no LibTorch.
//
// tokenize() follows google-research/bert's BasicTokenizer + WordpieceTokenizer (the behaviour of
// Hugging Face's BertTokenizer with tokenize_chinese_chars=True, strip_accents following
// lower_case, max_input_chars_per_word=100):
//   1. clean: drop U+0000, U+FFFD, bytes that are not valid UTF-8 and control characters (Unicode
//      Cc/Cf except \t \n \r); every white space (space, \t, \n, \r, Unicode Zs) becomes a space;
//   2. CJK ideographs (the BERT ranges; not Hangul or kana) become words of their own;
//   3. split on white space; when lower_case, lower-case each word and strip its accents (NFD,
//      then drop the nonspacing marks, Unicode Mn);
//   4. every punctuation character (ASCII 33-47, 58-64, 91-96, 123-126 or Unicode P*) becomes a
//      word of its own;
//   5. each word becomes word pieces, greedy longest match first from the left, continuation
//      pieces prefixed "##"; a word with no full match, or longer than 100 code points, becomes
//      the single token [UNK].
// Differences from Python, both rare: lower-casing is per code point (utf8proc), so the few
// characters whose Python lower() is longer than one code point (U+0130) differ; special tokens
// written in the text ("[SEP]") are tokenized as ordinary text.
//
// Unicode properties (NFD, categories, lower case) come from libutf8proc. A tokenizer is an
// immutable value: every method is const and thread-safe.
//
// Tokenizer is what training needs of any tokenizer (WordPiece here, RoBERTa's byte-level BPE in
// executor/bpe_tokenizer.hpp); executor/tokenizer_files.hpp picks one from the files present.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "executor/examples.hpp"

namespace loom::executor {

// A text encoder for sequence classification. Implementations are immutable values: every method
// is const and thread-safe.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // <start> tokens <end>, the tokens truncated to seq_len - 2 so <end> is always last, then the
  // padding id up to seq_len; attention_mask 1 on real tokens, 0 on padding; token_type_ids all
  // 0. InputError (source "--seq-len") when seq_len < 2.
  virtual EncodedExample encode(std::string_view text, std::int64_t seq_len,
                                std::int64_t label) const = 0;
  // Number of ids, so the embedding needs this many rows.
  virtual std::int64_t vocab_size() const = 0;
  // The padding id (the model's embedding must pad with the same id).
  virtual std::int64_t pad_id() const = 0;
  // A few words for messages: "WordPiece vocab.txt (30522 ids, lower case)".
  virtual std::string description() const = 0;
  // The files it was read from (empty for one built in memory), so that an exported model
  // folder can hold copies of them.
  virtual const std::vector<std::string>& files() const = 0;
  // The id words outside the vocabulary become, or -1 for a tokenizer that has none (byte-level
  // BPE spells every word in bytes).
  virtual std::int64_t unknown_id() const { return -1; }

 protected:
  Tokenizer() = default;
  Tokenizer(const Tokenizer&) = default;
  Tokenizer(Tokenizer&&) = default;
  Tokenizer& operator=(const Tokenizer&) = default;
  Tokenizer& operator=(Tokenizer&&) = default;
};

// `first` ids `last`, the ids truncated to seq_len - 2, then `pad` up to seq_len, with the mask
// and types Tokenizer::encode describes. InputError (source "--seq-len") when seq_len < 2.
EncodedExample framed_example(const std::vector<std::int64_t>& ids, std::int64_t first,
                              std::int64_t last, std::int64_t pad, std::int64_t seq_len,
                              std::int64_t label);

class WordPieceTokenizer : public Tokenizer {
 public:
  // Longest word (in code points) that is split into pieces; longer words become [UNK].
  static constexpr std::size_t kMaxWordChars = 100;

  // Reads vocab.txt: one token per line ("\n" or "\r\n"), the id is the 0-based line number; a
  // token listed twice keeps its last id (as in Hugging Face). InputError naming the file when
  // it cannot be read, is empty, or lacks one of [PAD] [UNK] [CLS] [SEP].
  static WordPieceTokenizer from_file(const std::string& vocab_path, bool lower_case = true);
  // The same from tokens in id order; `source` names them in errors.
  static WordPieceTokenizer from_tokens(std::vector<std::string> tokens, bool lower_case = true,
                                        const std::string& source = "vocabulary");

  // Word pieces of `text` (UTF-8), without [CLS]/[SEP].
  std::vector<std::string> tokenize(std::string_view text) const;
  // Ids of `tokens`; a token not in the vocabulary maps to unk_id().
  std::vector<std::int64_t> to_ids(const std::vector<std::string>& tokens) const;
  // [CLS] pieces [SEP], the pieces truncated to seq_len - 2 so [SEP] is always last, then [PAD]
  // up to seq_len; attention_mask 1 on real tokens (including [CLS] and [SEP]) and 0 on padding;
  // token_type_ids all 0. InputError (source "--seq-len") when seq_len < 2.
  EncodedExample encode(std::string_view text, std::int64_t seq_len,
                        std::int64_t label) const override;

  // Number of ids (lines of vocab.txt, so the embedding has this many rows).
  std::int64_t vocab_size() const override { return static_cast<std::int64_t>(tokens_.size()); }
  std::string description() const override;
  // vocab.txt for from_file; set_files() replaces them (a tokenizer.json, a tokenizer_config.json).
  const std::vector<std::string>& files() const override { return files_; }
  void set_files(std::vector<std::string> files) { files_ = std::move(files); }
  // The id of `token`, or -1 when it is not in the vocabulary.
  std::int64_t find_id(std::string_view token) const;
  // The token of an id in [0, vocab_size()); std::out_of_range otherwise.
  const std::string& token(std::int64_t id) const;
  bool lower_case() const { return lower_case_; }

  std::int64_t pad_id() const override { return pad_id_; }
  std::int64_t unknown_id() const override { return unk_id_; }
  std::int64_t unk_id() const { return unk_id_; }
  std::int64_t cls_id() const { return cls_id_; }
  std::int64_t sep_id() const { return sep_id_; }

 private:
  WordPieceTokenizer(std::vector<std::string> tokens, bool lower_case, const std::string& source);

  // Appends the word pieces of one basic-tokenized word.
  void word_pieces(const std::string& word, std::size_t chars, std::vector<std::string>& out) const;

  // Lets the id map be searched with a std::string_view.
  struct StringHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };

  std::vector<std::string> tokens_;
  std::vector<std::string> files_;
  std::unordered_map<std::string, std::int64_t, StringHash, std::equal_to<>> ids_;
  bool lower_case_ = true;
  std::int64_t pad_id_ = 0;
  std::int64_t unk_id_ = 0;
  std::int64_t cls_id_ = 0;
  std::int64_t sep_id_ = 0;
};

}  // namespace loom::executor
