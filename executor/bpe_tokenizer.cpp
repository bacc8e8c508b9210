#include "executor/bpe_tokenizer.hpp"

#include <utf8proc.h>

#include <algorithm>
#include <limits>

#include "profiles/errors.hpp"
#include "profiles/json_reader.hpp"
#include "profiles/loader.hpp"

namespace loom::executor {
namespace {

// Ids are packed two to a 64-bit merge key.
constexpr std::int64_t kMaxId = std::numeric_limits<std::int32_t>::max();

// What GPT-2's pattern distinguishes of a character.
enum class CharKind { kLetter, kNumber, kSpace, kOther };

// One character of the text: its bytes [begin, end), kind and code point.
struct Char {
  std::size_t begin = 0;
  std::size_t end = 0;
  CharKind kind = CharKind::kOther;
  utf8proc_int32_t code = -1;  // -1 for a byte that is not valid UTF-8
};

// Python's \s on str: the Unicode White_Space characters.
bool is_white_space(utf8proc_int32_t cp) {
  if ((cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85) return true;
  const utf8proc_category_t category = utf8proc_category(cp);
  return category == UTF8PROC_CATEGORY_ZS || category == UTF8PROC_CATEGORY_ZL ||
         category == UTF8PROC_CATEGORY_ZP;
}

CharKind kind_of(utf8proc_int32_t cp) {
  if (is_white_space(cp)) return CharKind::kSpace;
  switch (utf8proc_category(cp)) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
      return CharKind::kLetter;
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO:
      return CharKind::kNumber;
    default:
      return CharKind::kOther;
  }
}

std::vector<Char> decode_chars(std::string_view text) {
  std::vector<Char> out;
  out.reserve(text.size());
  const auto* bytes = reinterpret_cast<const utf8proc_uint8_t*>(text.data());
  std::size_t at = 0;
  while (at < text.size()) {
    utf8proc_int32_t cp = -1;
    utf8proc_ssize_t used =
        utf8proc_iterate(bytes + at, static_cast<utf8proc_ssize_t>(text.size() - at), &cp);
    Char c;
    c.begin = at;
    if (used <= 0) {
      used = 1;  // not UTF-8: a character of its own, kind "other"
      cp = -1;
    }
    c.end = at + static_cast<std::size_t>(used);
    c.code = cp;
    c.kind = cp < 0 ? CharKind::kOther : kind_of(cp);
    out.push_back(c);
    at = c.end;
  }
  return out;
}

// The length (in characters) of the contraction at i ('s 't 're 've 'm 'll 'd), or 0.
std::size_t contraction_at(const std::vector<Char>& chars, std::size_t i) {
  auto code = [&](std::size_t k) { return k < chars.size() ? chars[k].code : -1; };
  if (code(i) != '\'') return 0;
  const utf8proc_int32_t a = code(i + 1);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  const utf8proc_int32_t b = code(i + 2);
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

// The length of the piece of GPT-2's pattern that starts at character i (the first alternative
// that matches, as a regex engine takes it).
std::size_t piece_length(const std::vector<Char>& chars, std::size_t i) {
  const std::size_t n = chars.size();
  if (const std::size_t c = contraction_at(chars, i); c > 0) return c;
  // " ?\p{L}+", " ?\p{N}+", " ?[^\s\p{L}\p{N}]+": one optional space, then a run of one kind.
  std::size_t start = i;
  if (chars[i].code == ' ' && i + 1 < n && chars[i + 1].kind != CharKind::kSpace) start = i + 1;
  const CharKind kind = chars[start].kind;
  if (kind != CharKind::kSpace) {
    std::size_t end = start + 1;
    while (end < n && chars[end].kind == kind) ++end;
    return end - i;
  }
  // "\s+(?!\S)" then "\s+": a white-space run; before a non-space character its last
  // character is left for the next piece, unless it is the run's only one.
  std::size_t end = i + 1;
  while (end < n && chars[end].kind == CharKind::kSpace) ++end;
  if (end == n || end - i == 1) return end - i;
  return end - i - 1;
}

// GPT-2's bytes_to_unicode(): the code point that stands for each byte.
std::array<utf8proc_int32_t, 256> byte_code_points() {
  std::array<utf8proc_int32_t, 256> out{};
  utf8proc_int32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    out[static_cast<std::size_t>(b)] = printable ? b : next++;
  }
  return out;
}

std::string utf8_of(utf8proc_int32_t cp) {
  utf8proc_uint8_t buffer[4];
  const utf8proc_ssize_t n = utf8proc_encode_char(cp, buffer);
  return std::string(reinterpret_cast<const char*>(buffer), static_cast<std::size_t>(n));
}

std::uint64_t merge_key(std::int64_t left, std::int64_t right) {
  return (static_cast<std::uint64_t>(left) << 32U) | static_cast<std::uint64_t>(right);
}

std::string quoted_token(std::string_view token) {
  return "\"" + std::string(token.substr(0, 60)) + (token.size() > 60 ? "...\"" : "\"");
}

}  // namespace

std::string byte_level_text(std::string_view bytes) {
  static_assert(sizeof(char) == 1);
  const std::array<utf8proc_int32_t, 256> codes = byte_code_points();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char byte : bytes) out += utf8_of(codes[static_cast<unsigned char>(byte)]);
  return out;
}

std::vector<std::pair<std::string, std::int64_t>> bpe_vocab_from_json(const nlohmann::json& vocab,
                                                                      const std::string& source,
                                                                      const std::string& path) {
  if (!vocab.is_object()) {
    throw InputError(source, path,
                     std::string("a JSON object of token -> id (a byte-level BPE vocabulary), "
                                 "found ") +
                         vocab.type_name());
  }
  std::vector<std::pair<std::string, std::int64_t>> out;
  out.reserve(vocab.size());
  for (const auto& [token, id] : vocab.items()) {
    if (!id.is_number_integer() || id.get<std::int64_t>() < 0 || id.get<std::int64_t>() > kMaxId) {
      throw InputError(source, path + "[" + quoted_token(token) + "]",
                       "an id: a whole number from 0 to " + std::to_string(kMaxId) + ", found " +
                           id.dump().substr(0, 40));
    }
    out.emplace_back(token, id.get<std::int64_t>());
  }
  return out;
}

BpeMerge parse_bpe_merge(const std::string& text, const std::string& source,
                         const std::string& where) {
  const std::size_t space = text.find(' ');
  if (space == 0 || space == std::string::npos || space + 1 == text.size() ||
      text.find(' ', space + 1) != std::string::npos) {
    throw InputError(source, where,
                     "a merge: two tokens separated by one space, found " + quoted_token(text));
  }
  return BpeMerge{text.substr(0, space), text.substr(space + 1), where};
}

std::vector<BpeMerge> parse_bpe_merges(const std::string& text, const std::string& source) {
  std::vector<BpeMerge> merges;
  std::size_t start = text.rfind("\xEF\xBB\xBF", 0) == 0 ? 3 : 0;  // UTF-8 byte order mark
  std::size_t line_number = 0;
  while (start < text.size()) {
    std::size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(start, end - start);
    start = end + 1;
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    merges.push_back(parse_bpe_merge(line, source, "line " + std::to_string(line_number)));
  }
  return merges;
}

ByteLevelBpeTokenizer ByteLevelBpeTokenizer::from_files(const std::string& vocab_json_path,
                                                        const std::string& merges_txt_path) {
  const nlohmann::json vocab =
      profiles::parse_json_text(profiles::read_text_file(vocab_json_path), vocab_json_path);
  const std::vector<BpeMerge> merges =
      parse_bpe_merges(profiles::read_text_file(merges_txt_path), merges_txt_path);
  ByteLevelBpeTokenizer tokenizer = from_parts(bpe_vocab_from_json(vocab, vocab_json_path, "$"),
                                               merges, vocab_json_path, merges_txt_path);
  tokenizer.files_ = {vocab_json_path, merges_txt_path};
  return tokenizer;
}

ByteLevelBpeTokenizer ByteLevelBpeTokenizer::from_parts(
    const std::vector<std::pair<std::string, std::int64_t>>& vocab,
    const std::vector<BpeMerge>& merges, const std::string& vocab_source,
    const std::string& merges_source, bool add_prefix_space) {
  ByteLevelBpeTokenizer t;
  t.add_prefix_space_ = add_prefix_space;
  if (vocab.empty()) {
    throw InputError(vocab_source, "", "a byte-level BPE vocabulary, found no tokens");
  }
  t.ids_.reserve(vocab.size());
  for (const auto& [token, id] : vocab) {
    // Ids number the tokens: a larger id would only make the embedding larger (and this table).
    if (id < 0 || id >= static_cast<std::int64_t>(vocab.size())) {
      throw InputError(vocab_source, "",
                       "ids from 0 to " + std::to_string(vocab.size() - 1) + " numbering its " +
                           std::to_string(vocab.size()) + " tokens; " + quoted_token(token) +
                           " has id " + std::to_string(id));
    }
    t.ids_.insert_or_assign(token, id);
    t.vocab_size_ = std::max(t.vocab_size_, id + 1);
  }
  t.tokens_.assign(static_cast<std::size_t>(t.vocab_size_), std::string());
  for (const auto& [token, id] : t.ids_) t.tokens_[static_cast<std::size_t>(id)] = token;

  const std::array<utf8proc_int32_t, 256> codes = byte_code_points();
  for (std::size_t b = 0; b < 256; ++b) t.byte_ids_[b] = t.find_id(utf8_of(codes[b]));

  t.merges_.reserve(merges.size());
  for (std::size_t rank = 0; rank < merges.size(); ++rank) {
    const BpeMerge& m = merges[rank];
    const std::int64_t left = t.find_id(m.left);
    const std::int64_t right = t.find_id(m.right);
    const std::int64_t merged = t.find_id(m.left + m.right);
    const std::string* missing = left < 0 ? &m.left : right < 0 ? &m.right : nullptr;
    const std::string joined = m.left + m.right;
    if (missing == nullptr && merged < 0) missing = &joined;
    if (missing != nullptr) {
      throw InputError(merges_source, m.where,
                       "a merge of tokens of the vocabulary (" + vocab_source +
                           ") whose result is a token too, as Hugging Face's tokenizers require; " +
                           quoted_token(*missing) + " is not in it");
    }
    t.merges_.insert_or_assign(merge_key(left, right),
                               MergeResult{static_cast<std::int64_t>(rank), merged});
  }

  struct Special {
    const char* name;
    std::int64_t* id;
  };
  const Special specials[] = {
      {"<s>", &t.bos_id_}, {"</s>", &t.eos_id_}, {"<pad>", &t.pad_id_}, {"<unk>", &t.unk_id_}};
  for (const Special& special : specials) {
    *special.id = t.find_id(special.name);
    if (*special.id < 0) {
      throw InputError(vocab_source, "",
                       std::string("a RoBERTa vocabulary with the special tokens <s> </s> <pad> "
                                   "<unk>, found no ") +
                           special.name);
    }
  }
  t.mask_id_ = t.find_id("<mask>");
  return t;
}

std::int64_t ByteLevelBpeTokenizer::find_id(std::string_view token) const {
  auto it = ids_.find(token);
  return it == ids_.end() ? -1 : it->second;
}

std::string ByteLevelBpeTokenizer::description() const {
  return "byte-level BPE vocabulary (" + std::to_string(vocab_size_) + " ids, " +
         std::to_string(merges_.size()) + " merges)";
}

std::vector<std::string> ByteLevelBpeTokenizer::pre_tokenize(std::string_view text) const {
  std::string prefixed;
  if (add_prefix_space_ && (text.empty() || text.front() != ' ')) {
    prefixed = " ";
    prefixed.append(text);
    text = prefixed;
  }
  const std::vector<Char> chars = decode_chars(text);
  std::vector<std::string> pieces;
  for (std::size_t i = 0; i < chars.size();) {
    const std::size_t length = piece_length(chars, i);
    const std::size_t begin = chars[i].begin;
    const std::size_t end = chars[i + length - 1].end;
    pieces.emplace_back(text.substr(begin, end - begin));
    i += length;
  }
  return pieces;
}

void ByteLevelBpeTokenizer::piece_ids(std::string_view piece,
                                      std::vector<std::int64_t>& out) const {
  std::vector<std::int64_t> word;
  word.reserve(piece.size());
  for (char byte : piece) word.push_back(byte_ids_[static_cast<unsigned char>(byte)]);
  std::vector<std::int64_t> next;
  next.reserve(word.size());
  while (word.size() > 1) {
    // The adjacent pair of the lowest rank.
    const MergeResult* best = nullptr;
    std::uint64_t best_key = 0;
    for (std::size_t i = 0; i + 1 < word.size(); ++i) {
      if (word[i] < 0 || word[i + 1] < 0) continue;  // a byte without a token never merges
      const std::uint64_t key = merge_key(word[i], word[i + 1]);
      auto it = merges_.find(key);
      if (it != merges_.end() && (best == nullptr || it->second.rank < best->rank)) {
        best = &it->second;
        best_key = key;
      }
    }
    if (best == nullptr) break;
    // Every occurrence of that pair, left to right.
    next.clear();
    for (std::size_t i = 0; i < word.size();) {
      if (i + 1 < word.size() && word[i] >= 0 && word[i + 1] >= 0 &&
          merge_key(word[i], word[i + 1]) == best_key) {
        next.push_back(best->id);
        i += 2;
      } else {
        next.push_back(word[i]);
        i += 1;
      }
    }
    word.swap(next);
  }
  for (std::int64_t id : word) out.push_back(id < 0 ? unk_id_ : id);
}

std::vector<std::int64_t> ByteLevelBpeTokenizer::token_ids(std::string_view text) const {
  std::vector<std::int64_t> ids;
  for (const std::string& piece : pre_tokenize(text)) piece_ids(piece, ids);
  return ids;
}

std::vector<std::string> ByteLevelBpeTokenizer::tokenize(std::string_view text) const {
  std::vector<std::string> tokens;
  for (std::int64_t id : token_ids(text)) tokens.push_back(tokens_[static_cast<std::size_t>(id)]);
  return tokens;
}

EncodedExample ByteLevelBpeTokenizer::encode(std::string_view text, std::int64_t seq_len,
                                             std::int64_t label) const {
  if (seq_len < 2) return framed_example({}, bos_id_, eos_id_, pad_id_, seq_len, label);  // throws
  // The pieces past the kept length are not merged: BPE works within a piece.
  const auto keep = static_cast<std::size_t>(seq_len - 2);
  std::vector<std::int64_t> ids;
  for (const std::string& piece : pre_tokenize(text)) {
    if (ids.size() >= keep) break;
    piece_ids(piece, ids);
  }
  return framed_example(ids, bos_id_, eos_id_, pad_id_, seq_len, label);
}

}  // namespace loom::executor
