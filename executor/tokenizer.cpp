#include "executor/tokenizer.hpp"

#include <utf8proc.h>

#include <algorithm>
#include <stdexcept>
#include <utility>

#include "profiles/errors.hpp"
#include "profiles/loader.hpp"

namespace loom::executor {
namespace {

using CodePoints = std::vector<utf8proc_int32_t>;

constexpr utf8proc_int32_t kReplacementChar = 0xFFFD;
constexpr const char* kSpecialTokens[] = {"[PAD]", "[UNK]", "[CLS]", "[SEP]"};

bool is_control(utf8proc_int32_t cp) {
  if (cp == '\t' || cp == '\n' || cp == '\r') return false;
  utf8proc_category_t category = utf8proc_category(cp);
  return category == UTF8PROC_CATEGORY_CC || category == UTF8PROC_CATEGORY_CF;
}

// BERT's white space, plus the line and paragraph separators that Python's str.split() also
// splits on.
bool is_whitespace(utf8proc_int32_t cp) {
  if (cp == ' ' || cp == '\t' || cp == '\n' || cp == '\r') return true;
  utf8proc_category_t category = utf8proc_category(cp);
  return category == UTF8PROC_CATEGORY_ZS || category == UTF8PROC_CATEGORY_ZL ||
         category == UTF8PROC_CATEGORY_ZP;
}

// The CJK Unified Ideographs blocks BERT isolates (not Hangul, Hiragana or Katakana).
bool is_cjk(utf8proc_int32_t cp) {
  return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) ||
         (cp >= 0x20000 && cp <= 0x2A6DF) || (cp >= 0x2A700 && cp <= 0x2B73F) ||
         (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B820 && cp <= 0x2CEAF) ||
         (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

// ASCII non-alphanumeric printable characters count as punctuation ("$", "^", "`") as in BERT,
// plus every Unicode P* character.
bool is_punctuation(utf8proc_int32_t cp) {
  if ((cp >= 33 && cp <= 47) || (cp >= 58 && cp <= 64) || (cp >= 91 && cp <= 96) ||
      (cp >= 123 && cp <= 126)) {
    return true;
  }
  switch (utf8proc_category(cp)) {
    case UTF8PROC_CATEGORY_PC:
    case UTF8PROC_CATEGORY_PD:
    case UTF8PROC_CATEGORY_PS:
    case UTF8PROC_CATEGORY_PE:
    case UTF8PROC_CATEGORY_PI:
    case UTF8PROC_CATEGORY_PF:
    case UTF8PROC_CATEGORY_PO:
      return true;
    default:
      return false;
  }
}

// Code points of UTF-8 text; a byte that does not start a valid sequence is dropped.
CodePoints decode_utf8(std::string_view text) {
  CodePoints out;
  out.reserve(text.size());
  const auto* bytes = reinterpret_cast<const utf8proc_uint8_t*>(text.data());
  auto remaining = static_cast<utf8proc_ssize_t>(text.size());
  while (remaining > 0) {
    utf8proc_int32_t cp = -1;
    utf8proc_ssize_t used = utf8proc_iterate(bytes, remaining, &cp);
    if (used <= 0) {
      used = 1;  // invalid byte: skip it
    } else {
      out.push_back(cp);
    }
    bytes += used;
    remaining -= used;
  }
  return out;
}

std::string encode_utf8(CodePoints::const_iterator begin, CodePoints::const_iterator end) {
  std::string out;
  utf8proc_uint8_t buffer[4];
  for (auto it = begin; it != end; ++it) {
    utf8proc_ssize_t n = utf8proc_encode_char(*it, buffer);
    out.append(reinterpret_cast<const char*>(buffer), static_cast<std::size_t>(n));
  }
  return out;
}

// Lower case, then canonical decomposition (NFD) without the nonspacing marks: "Résumé" ->
// "resume".
CodePoints lower_and_strip_accents(const CodePoints& word) {
  if (std::all_of(word.begin(), word.end(), [](utf8proc_int32_t cp) { return cp < 0x80; })) {
    CodePoints ascii = word;  // no accents: lower case is enough
    for (utf8proc_int32_t& cp : ascii) {
      if (cp >= 'A' && cp <= 'Z') cp += 'a' - 'A';
    }
    return ascii;
  }
  CodePoints lowered;
  lowered.reserve(word.size());
  for (utf8proc_int32_t cp : word) lowered.push_back(utf8proc_tolower(cp));
  std::string utf8 = encode_utf8(lowered.begin(), lowered.end());
  const auto options = static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE);
  CodePoints decomposed(lowered.size() * 4 + 8);
  for (;;) {
    utf8proc_ssize_t n =
        utf8proc_decompose(reinterpret_cast<const utf8proc_uint8_t*>(utf8.data()),
                           static_cast<utf8proc_ssize_t>(utf8.size()), decomposed.data(),
                           static_cast<utf8proc_ssize_t>(decomposed.size()), options);
    if (n < 0) return lowered;  // cannot happen on valid code points; keep the word as is
    if (static_cast<std::size_t>(n) <= decomposed.size()) {
      decomposed.resize(static_cast<std::size_t>(n));
      break;
    }
    decomposed.resize(static_cast<std::size_t>(n));
  }
  CodePoints out;
  out.reserve(decomposed.size());
  for (utf8proc_int32_t cp : decomposed) {
    if (utf8proc_category(cp) != UTF8PROC_CATEGORY_MN) out.push_back(cp);
  }
  return out;
}

// Byte offsets of the code point boundaries of valid UTF-8 text, both ends included.
std::vector<std::size_t> boundaries(const std::string& utf8) {
  std::vector<std::size_t> out;
  for (std::size_t i = 0; i < utf8.size(); ++i) {
    if ((static_cast<unsigned char>(utf8[i]) & 0xC0U) != 0x80U) out.push_back(i);
  }
  out.push_back(utf8.size());
  return out;
}

}  // namespace

WordPieceTokenizer WordPieceTokenizer::from_file(const std::string& vocab_path, bool lower_case) {
  std::string text = profiles::read_text_file(vocab_path);
  if (text.rfind("\xEF\xBB\xBF", 0) == 0) text.erase(0, 3);  // UTF-8 byte order mark
  std::vector<std::string> tokens;
  std::size_t start = 0;
  while (start < text.size()) {
    std::size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(start, end - start);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    tokens.push_back(std::move(line));
    start = end + 1;
  }
  WordPieceTokenizer tokenizer(std::move(tokens), lower_case, vocab_path);
  tokenizer.files_ = {vocab_path};
  return tokenizer;
}

WordPieceTokenizer WordPieceTokenizer::from_tokens(std::vector<std::string> tokens, bool lower_case,
                                                   const std::string& source) {
  return WordPieceTokenizer(std::move(tokens), lower_case, source);
}

WordPieceTokenizer::WordPieceTokenizer(std::vector<std::string> tokens, bool lower_case,
                                       const std::string& source)
    : tokens_(std::move(tokens)), lower_case_(lower_case) {
  if (tokens_.empty()) {
    throw InputError(source, "", "a BERT vocabulary (one token per line), found no tokens");
  }
  ids_.reserve(tokens_.size());
  for (std::size_t i = 0; i < tokens_.size(); ++i) {
    ids_.insert_or_assign(tokens_[i], static_cast<std::int64_t>(i));
  }
  std::int64_t* special_ids[] = {&pad_id_, &unk_id_, &cls_id_, &sep_id_};
  for (std::size_t i = 0; i < std::size(kSpecialTokens); ++i) {
    *special_ids[i] = find_id(kSpecialTokens[i]);
    if (*special_ids[i] < 0) {
      throw InputError(source, "",
                       std::string("a BERT vocabulary with the special tokens [PAD] [UNK] [CLS] "
                                   "[SEP], found no ") +
                           kSpecialTokens[i]);
    }
  }
}

std::string WordPieceTokenizer::description() const {
  return "WordPiece vocabulary (" + std::to_string(vocab_size()) + " ids, " +
         (lower_case_ ? "lower case" : "cased") + ")";
}

std::int64_t WordPieceTokenizer::find_id(std::string_view token) const {
  auto it = ids_.find(token);
  return it == ids_.end() ? -1 : it->second;
}

const std::string& WordPieceTokenizer::token(std::int64_t id) const {
  if (id < 0 || id >= vocab_size()) {
    throw std::out_of_range("token id " + std::to_string(id) + " outside a vocabulary of " +
                            std::to_string(vocab_size()));
  }
  return tokens_[static_cast<std::size_t>(id)];
}

std::vector<std::string> WordPieceTokenizer::tokenize(std::string_view text) const {
  // Clean, isolate CJK ideographs and split on white space.
  std::vector<CodePoints> words;
  CodePoints current;
  auto flush = [&] {
    if (!current.empty()) words.push_back(std::move(current));
    current.clear();
  };
  for (utf8proc_int32_t cp : decode_utf8(text)) {
    if (cp == 0 || cp == kReplacementChar || is_control(cp)) continue;
    if (is_whitespace(cp)) {
      flush();
    } else if (is_cjk(cp)) {
      flush();
      words.push_back(CodePoints{cp});
    } else {
      current.push_back(cp);
    }
  }
  flush();

  std::vector<std::string> out;
  for (CodePoints& word : words) {
    if (lower_case_) word = lower_and_strip_accents(word);
    // Every punctuation character is a word of its own.
    auto begin = word.cbegin();
    for (auto it = word.cbegin(); it != word.cend(); ++it) {
      if (!is_punctuation(*it)) continue;
      if (begin != it) {
        word_pieces(encode_utf8(begin, it), static_cast<std::size_t>(it - begin), out);
      }
      word_pieces(encode_utf8(it, it + 1), 1, out);
      begin = it + 1;
    }
    if (begin != word.cend()) {
      word_pieces(encode_utf8(begin, word.cend()), static_cast<std::size_t>(word.cend() - begin),
                  out);
    }
  }
  return out;
}

void WordPieceTokenizer::word_pieces(const std::string& word, std::size_t chars,
                                     std::vector<std::string>& out) const {
  const std::string& unk = tokens_[static_cast<std::size_t>(unk_id_)];
  if (chars > kMaxWordChars) {
    out.push_back(unk);
    return;
  }
  std::vector<std::size_t> cuts = boundaries(word);
  std::string continuation = "##";  // reused buffer for the "##" pieces
  const std::size_t first = out.size();
  std::size_t start = 0;  // index into cuts
  while (start + 1 < cuts.size()) {
    bool found = false;
    for (std::size_t end = cuts.size() - 1; end > start; --end) {
      std::string_view piece = std::string_view(word).substr(cuts[start], cuts[end] - cuts[start]);
      if (start > 0) {
        continuation.resize(2);
        continuation.append(piece);
        piece = continuation;
      }
      if (ids_.find(piece) != ids_.end()) {
        out.emplace_back(piece);
        start = end;
        found = true;
        break;
      }
    }
    if (!found) {
      out.resize(first);
      out.push_back(unk);
      return;
    }
  }
}

std::vector<std::int64_t> WordPieceTokenizer::to_ids(const std::vector<std::string>& tokens) const {
  std::vector<std::int64_t> out;
  out.reserve(tokens.size());
  for (const std::string& token : tokens) {
    std::int64_t id = find_id(token);
    out.push_back(id < 0 ? unk_id_ : id);
  }
  return out;
}

EncodedExample framed_example(const std::vector<std::int64_t>& ids, std::int64_t first,
                              std::int64_t last, std::int64_t pad, std::int64_t seq_len,
                              std::int64_t label) {
  if (seq_len < 2) {
    throw InputError("--seq-len", "",
                     "at least 2 (room for the start and end tokens, [CLS] and [SEP] or <s> and "
                     "</s>), got " +
                         std::to_string(seq_len));
  }
  const auto length = static_cast<std::size_t>(seq_len);
  const std::size_t kept = std::min(ids.size(), length - 2);
  EncodedExample example;
  example.label = label;
  example.input_ids.reserve(length);
  example.input_ids.push_back(first);
  example.input_ids.insert(example.input_ids.end(), ids.begin(),
                           ids.begin() + static_cast<std::ptrdiff_t>(kept));
  example.input_ids.push_back(last);
  example.attention_mask.assign(example.input_ids.size(), 1);
  example.input_ids.resize(length, pad);
  example.attention_mask.resize(length, 0);
  example.token_type_ids.assign(length, 0);
  return example;
}

EncodedExample WordPieceTokenizer::encode(std::string_view text, std::int64_t seq_len,
                                          std::int64_t label) const {
  if (seq_len < 2) return framed_example({}, cls_id_, sep_id_, pad_id_, seq_len, label);  // throws
  std::vector<std::string> pieces = tokenize(text);
  const auto keep = static_cast<std::size_t>(seq_len - 2);
  if (pieces.size() > keep) pieces.resize(keep);
  return framed_example(to_ids(pieces), cls_id_, sep_id_, pad_id_, seq_len, label);
}

}  // namespace loom::executor
