// Byte-level BPE (RoBERTa, GPT-2): the bytes-to-unicode table, GPT-2's pre-tokenization, merges
// by rank, hand-checked ids on a small vocabulary and merges written here (spaces, newlines,
// unicode, a word without merges, truncation and padding), the same ids from tokenizer.json, and
// the errors of bad files.
#include <catch2/catch.hpp>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "executor/bpe_tokenizer.hpp"
#include "executor/tokenizer_files.hpp"
#include "profiles/errors.hpp"

using loom::executor::byte_level_text;
using loom::executor::ByteLevelBpeTokenizer;
using loom::executor::EncodedExample;
using Pieces = std::vector<std::string>;
using Ids = std::vector<std::int64_t>;
namespace fs = std::filesystem;

namespace {

// The vocabulary, id = index. Byte-level characters: "Ġ" is the space, "Ċ" the newline, "Ã©" the
// two bytes of "é" (C3 A9), "ä¸Ń" the three of "中" (E4 B8 AD), "ðŁĺĢ" the four of "😀"
// (F0 9F 98 80).
std::vector<std::string> vocab_tokens() {
  return {"<s>",  "<pad>", "</s>",  "<unk>", "H",  "e",    "l",     "o",       // 0-7
          "Ġ",    "w",     "r",     "d",     "a",  "b",    "Ċ",     "x",       // 8-15
          "y",    "z",     "Ġw",    "or",    "lo", "Ġwor", "Ġworl", "Ġworld",  // 16-23
          "He",   "llo",   "Hello", "ll",    "Ã",  "©",    "Ã©",    "ä",       // 24-31
          "¸",    "Ń",     "ð",     "Ł",     "ĺ",  "Ģ",    "ðŁ",    "ĺĢ",      // 32-39
          "ðŁĺĢ", "Ġb",    "'",     "t",     "n",  "'t",   "2",     "0",       // 40-47
          "4",    "!",     "Ġ2",    "<mask>"};                                 // 48-51
}

// Rank = index.
std::vector<std::string> merge_lines() {
  return {"Ġ w", "o r", "l o", "Ġw or", "Ġwor l", "Ġworl d", "H e", "l lo", "He llo",
          "l l", "Ã ©", "ð Ł", "ĺ Ģ",   "ðŁ ĺĢ",  "Ġ b",     "' t", "Ġ 2"};
}

std::string vocab_json_text() {
  nlohmann::json vocab = nlohmann::json::object();
  const std::vector<std::string> tokens = vocab_tokens();
  for (std::size_t i = 0; i < tokens.size(); ++i) vocab[tokens[i]] = i;
  return vocab.dump(-1, ' ', /*ensure_ascii=*/true);  // "\u0120" escapes, as Python writes them
}

std::string merges_txt_text() {
  std::string text = "#version: 0.2\n";
  for (const std::string& line : merge_lines()) text += line + "\n";
  return text;
}

// A tokenizer.json of the same vocabulary; merges alternate between "a b" and ["a", "b"].
nlohmann::json tokenizer_json(bool add_prefix_space = false) {
  nlohmann::json merges = nlohmann::json::array();
  const std::vector<std::string> lines = merge_lines();
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const std::size_t space = lines[i].find(' ');
    if (i % 2 == 0) {
      merges.push_back(lines[i]);
    } else {
      merges.push_back({lines[i].substr(0, space), lines[i].substr(space + 1)});
    }
  }
  nlohmann::json vocab = nlohmann::json::parse(vocab_json_text());
  vocab.erase("<mask>");  // given as an added token instead
  return {{"version", "1.0"},
          {"added_tokens", {{{"id", 51}, {"content", "<mask>"}, {"special", true}}}},
          {"normalizer", nullptr},
          {"pre_tokenizer",
           {{"type", "ByteLevel"}, {"add_prefix_space", add_prefix_space}, {"use_regex", true}}},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"continuing_subword_prefix", ""},
            {"end_of_word_suffix", ""},
            {"vocab", vocab},
            {"merges", merges}}}};
}

struct TempDir {
  fs::path path;
  TempDir() {
    std::random_device random;
    path = fs::temp_directory_path() /
           ("loom-test-bpe-" + std::to_string(random()) + std::to_string(random()));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string write(const fs::path& name, const std::string& text) const {
    fs::create_directories((path / name).parent_path());
    std::ofstream out(path / name, std::ios::binary);
    out << text;
    return (path / name).string();
  }
};

ByteLevelBpeTokenizer small(const TempDir& dir) {
  return ByteLevelBpeTokenizer::from_files(dir.write("vocab.json", vocab_json_text()),
                                           dir.write("merges.txt", merges_txt_text()));
}

// `read` must throw an InputError with this source and path whose expectation contains `word`.
template <typename Read>
void require_input_error(Read read, const std::string& source, const std::string& path,
                         const std::string& word) {
  try {
    read();
  } catch (const loom::InputError& e) {
    INFO("message: " << e.what());
    CHECK(e.source() == source);
    CHECK(e.path() == path);
    CHECK_THAT(e.expectation(), Catch::Contains(word));
    return;
  }
  FAIL("no InputError");
}

}  // namespace

TEST_CASE("bytes to unicode: GPT-2's table", "[tokenizer][bpe]") {
  CHECK(byte_level_text(" ") == "Ġ");                        // 0x20 -> U+0120
  CHECK(byte_level_text("\n") == "Ċ");                       // 0x0A -> U+010A
  CHECK(byte_level_text("Az!~") == "Az!~");                  // printable ASCII stands for itself
  CHECK(byte_level_text(std::string(1, '\0')) == "\u0100");  // the first unprintable byte
  CHECK(byte_level_text("\x7F") == "\u0121");  // 0-32 took U+0100..U+0120; 127 is next
  CHECK(byte_level_text("\xA0") == "\u0142");  // 127-160: U+0121..U+0142
  CHECK(byte_level_text("\xAD") == "\u0143");  // the soft hyphen, the last unprintable byte
  CHECK(byte_level_text("\xA1\xAC\xAE\xFF") == "\u00A1\u00AC\u00AE\u00FF");  // printable Latin-1
  CHECK(byte_level_text("é") == "Ã©");
  CHECK(byte_level_text("中") == "ä¸Ń");
  CHECK(byte_level_text("😀") == "ðŁĺĢ");
}

TEST_CASE("pre-tokenization follows GPT-2's pattern", "[tokenizer][bpe]") {
  TempDir dir;
  const ByteLevelBpeTokenizer t = small(dir);
  CHECK(t.pre_tokenize("Hello world") == Pieces{"Hello", " world"});
  // Of a run of spaces before a word, the last one joins the word.
  CHECK(t.pre_tokenize("a  b") == Pieces{"a", " ", " b"});
  CHECK(t.pre_tokenize("  Hi") == Pieces{" ", " Hi"});
  CHECK(t.pre_tokenize("a   ") == Pieces{"a", "   "});  // at the end, the whole run
  // A newline is white space but not the " ?" of a word.
  CHECK(t.pre_tokenize("a\nb") == Pieces{"a", "\n", "b"});
  CHECK(t.pre_tokenize("a\n\nb") == Pieces{"a", "\n", "\n", "b"});
  CHECK(t.pre_tokenize("a \nb") == Pieces{"a", " ", "\n", "b"});
  CHECK(t.pre_tokenize("a\tb\u00A0c") == Pieces{"a", "\t", "b", "\u00A0", "c"});
  CHECK(t.pre_tokenize("I'm don't we'll it's") ==
        Pieces{"I", "'m", " don", "'t", " we", "'ll", " it", "'s"});
  CHECK(t.pre_tokenize("'x 's") == Pieces{"'", "x", " '", "s"});
  CHECK(t.pre_tokenize("x 2024!...") == Pieces{"x", " 2024", "!..."});
  CHECK(t.pre_tokenize("abc123def") == Pieces{"abc", "123", "def"});
  CHECK(t.pre_tokenize("café 中国 😀!") == Pieces{"café", " 中国", " 😀!"});
  CHECK(t.pre_tokenize("<br /><br />") == Pieces{"<", "br", " /><", "br", " />"});
  CHECK(t.pre_tokenize("a\xFF"
                       "b") == Pieces{"a", "\xFF", "b"});  // not UTF-8: kept
  CHECK(t.pre_tokenize("").empty());
}

TEST_CASE("Hugging Face's own RoBERTa example: lower newer", "[tokenizer][bpe]") {
  // The vocabulary and merges of Hugging Face's RoBERTa tokenizer test, with the special tokens
  // Loom requires after them.
  const std::vector<std::string> tokens = {"l",      "o",     "w",    "e",     "r",       "s",
                                           "t",      "i",     "d",    "n",     "Ġ",       "Ġl",
                                           "Ġn",     "Ġlo",   "Ġlow", "er",    "Ġlowest", "Ġnewer",
                                           "Ġwider", "<unk>", "<s>",  "<pad>", "</s>"};
  std::vector<std::pair<std::string, std::int64_t>> vocab;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    vocab.emplace_back(tokens[i], static_cast<std::int64_t>(i));
  }
  const auto t = ByteLevelBpeTokenizer::from_parts(
      vocab, loom::executor::parse_bpe_merges("#version: 0.2\nĠ l\nĠl o\nĠlo w\ne r\n\n", "m"), "v",
      "m");
  // "lower": only "e r" applies; " newer": "Ġ n" is no merge, so Ġ n e w er.
  CHECK(t.tokenize("lower newer") == Pieces{"l", "o", "w", "er", "Ġ", "n", "e", "w", "er"});
  CHECK(t.token_ids("lower newer") == Ids{0, 1, 2, 15, 10, 9, 3, 2, 15});
  // " lower": Ġ l -> Ġl o -> Ġlo w -> Ġlow, then "e r".
  CHECK(t.tokenize(" lower") == Pieces{"Ġlow", "er"});
}

TEST_CASE("BPE: hand-checked ids on a small vocabulary and merges", "[tokenizer][bpe]") {
  TempDir dir;
  const ByteLevelBpeTokenizer t = small(dir);
  CHECK(t.vocab_size() == 52);
  CHECK(t.merge_count() == 17);
  CHECK(t.bos_id() == 0);
  CHECK(t.pad_id() == 1);
  CHECK(t.eos_id() == 2);
  CHECK(t.unk_id() == 3);
  CHECK(t.mask_id() == 51);
  CHECK(t.files() == std::vector<std::string>{(dir.path / "vocab.json").string(),
                                              (dir.path / "merges.txt").string()});

  // "Hello": H e l l o; the lowest ranked pair is "l o" (2) although "l l" (9) comes first:
  // H e l lo -> "H e" (6): He l lo -> "l lo" (7): He llo -> "He llo" (8): Hello (26).
  // " world": Ġ w o r l d -> "Ġ w" (0), "o r" (1), "Ġw or" (3), "Ġwor l" (4), "Ġworl d" (5):
  // Ġworld (23).
  CHECK(t.tokenize("Hello world") == Pieces{"Hello", "Ġworld"});
  CHECK(t.token_ids("Hello world") == Ids{26, 23});
  // Two spaces: "a", " ", " b" -> a (12), Ġ (8), "Ġ b" (14): Ġb (41).
  CHECK(t.token_ids("a  b") == Ids{12, 8, 41});
  // Newlines: Ċ (14) each, never merged across pieces.
  CHECK(t.token_ids("a\nb") == Ids{12, 14, 13});
  CHECK(t.token_ids("a\n\nb") == Ids{12, 14, 14, 13});
  // A word with no merges: one token a byte.
  CHECK(t.tokenize("xyz") == Pieces{"x", "y", "z"});
  CHECK(t.token_ids("xyz") == Ids{15, 16, 17});
  // "don't": "don" has no merges (d 11, o 7, n 44); "'t" by "' t" (15): 45.
  CHECK(t.token_ids("don't") == Ids{11, 7, 44, 45});
  // " 2024": Ġ 2 0 2 4, only the first "Ġ 2" pair merges (16): Ġ2 (50) 0 (47) 2 (46) 4 (48).
  CHECK(t.token_ids("x 2024!") == Ids{15, 50, 47, 46, 48, 49});
  // é = C3 A9 = Ã © -> "Ã ©" (10): Ã© (30).
  CHECK(t.tokenize("é") == Pieces{"Ã©"});
  CHECK(t.token_ids("é") == Ids{30});
  // 中 = E4 B8 AD = ä ¸ Ń, no merges: 31 32 33.
  CHECK(t.token_ids("中") == Ids{31, 32, 33});
  // 😀 = F0 9F 98 80 = ð Ł ĺ Ģ -> "ð Ł" (11), "ĺ Ģ" (12), "ðŁ ĺĢ" (13): ðŁĺĢ (40); with a
  // space before it the piece is " 😀" and "Ġ" stays alone (no "Ġ ð" merge): 8 40.
  CHECK(t.token_ids("😀") == Ids{40});
  CHECK(t.token_ids(" 😀") == Ids{8, 40});
  // A byte whose character is not in the vocabulary ("Q", "\xFF" = ÿ) is <unk> (3).
  CHECK(t.token_ids("Qx") == Ids{3, 15});
  CHECK(t.token_ids("a\xFF") == Ids{12, 3});
  CHECK(t.find_id("Ġworld") == 23);
  CHECK(t.find_id("world") == -1);
}

TEST_CASE("BPE encode: <s> tokens </s>, truncation and padding", "[tokenizer][bpe]") {
  TempDir dir;
  const ByteLevelBpeTokenizer t = small(dir);
  EncodedExample e = t.encode("Hello world", 8, 1);
  CHECK(e.input_ids == Ids{0, 26, 23, 2, 1, 1, 1, 1});
  CHECK(e.attention_mask == Ids{1, 1, 1, 1, 0, 0, 0, 0});
  CHECK(e.token_type_ids == Ids(8, 0));
  CHECK(e.label == 1);
  // Exactly full, then truncated so that </s> stays last.
  CHECK(t.encode("Hello world", 4, 0).input_ids == Ids{0, 26, 23, 2});
  CHECK(t.encode("Hello world", 4, 0).attention_mask == Ids{1, 1, 1, 1});
  CHECK(t.encode("Hello world", 3, 0).input_ids == Ids{0, 26, 2});
  CHECK(t.encode("x 2024!", 5, 0).input_ids == Ids{0, 15, 50, 47, 2});
  CHECK(t.encode("", 2, 0).input_ids == Ids{0, 2});
  CHECK(t.encode("", 3, 0).input_ids == Ids{0, 2, 1});
  require_input_error([&] { (void)t.encode("x", 1, 0); }, "--seq-len", "", "at least 2");
  // Through the Tokenizer interface.
  const loom::executor::Tokenizer& base = t;
  CHECK(base.encode("é 中", 8, 0).input_ids == Ids{0, 30, 8, 31, 32, 33, 2, 1});
  CHECK_THAT(base.description(), Catch::Contains("52 ids") && Catch::Contains("17 merges"));
}

TEST_CASE("tokenizer.json gives the ids of vocab.json + merges.txt", "[tokenizer][bpe]") {
  TempDir two;
  const ByteLevelBpeTokenizer files = small(two);
  TempDir one;
  const std::string json_path = one.write("tokenizer.json", tokenizer_json().dump(2));
  const auto fast = loom::executor::load_tokenizer(one.path.string());
  CHECK(fast->files() == std::vector<std::string>{json_path});
  CHECK(fast->vocab_size() == 52);
  CHECK(fast->pad_id() == 1);
  for (const std::string text :
       {"Hello world", "a  b", "a\n\nb", "xyz", "don't", "x 2024!", "é 中 😀", "Qx", ""}) {
    INFO(text);
    CHECK(fast->encode(text, 12, 1) == files.encode(text, 12, 1));
  }
  const auto* bpe = dynamic_cast<const ByteLevelBpeTokenizer*>(fast.get());
  REQUIRE(bpe != nullptr);
  CHECK(bpe->mask_id() == 51);  // from added_tokens
  CHECK(bpe->merge_count() == 17);

  // add_prefix_space: "Hello" is read as " Hello": Ġ H e l lo -> He l lo ... -> Ġ Hello (8 26).
  TempDir prefixed;
  prefixed.write("tokenizer.json", tokenizer_json(true).dump());
  CHECK(loom::executor::load_tokenizer(prefixed.path.string())->encode("Hello", 4, 0).input_ids ==
        Ids{0, 8, 26, 2});
}

TEST_CASE("load_tokenizer picks the tokenizer from the files present", "[tokenizer][bpe]") {
  TempDir dir;
  const std::string vocab = dir.write("roberta/vocab.json", vocab_json_text());
  const std::string merges = dir.write("roberta/merges.txt", merges_txt_text());
  const std::string fast = dir.write("roberta/tokenizer.json", tokenizer_json().dump());
  const std::string config =
      dir.write("roberta/tokenizer_config.json", R"({"model_max_length": 512})");
  // Both forms: the two files, with the folder's tokenizer_config.json for an export.
  const auto folder = loom::executor::load_tokenizer((dir.path / "roberta").string());
  CHECK(folder->files() == std::vector<std::string>{vocab, merges, config});
  CHECK(dynamic_cast<const ByteLevelBpeTokenizer*>(folder.get()) != nullptr);
  // A file: vocab.json (merges.txt beside it), merges.txt (vocab.json beside it), tokenizer.json.
  CHECK(loom::executor::load_tokenizer(vocab)->files() ==
        std::vector<std::string>{vocab, merges, config});
  CHECK(loom::executor::load_tokenizer(merges)->files() ==
        std::vector<std::string>{vocab, merges, config});
  CHECK(loom::executor::load_tokenizer(fast)->files() == std::vector<std::string>{fast, config});
  CHECK(loom::executor::holds_tokenizer((dir.path / "roberta").string()));
  CHECK_FALSE(loom::executor::holds_tokenizer(dir.path.string()));
}

TEST_CASE("bad BPE files name the file, the field and the expectation", "[tokenizer][bpe]") {
  TempDir dir;
  const std::string merges = dir.write("merges.txt", merges_txt_text());
  SECTION("vocab.json without merges.txt") {
    TempDir lone;
    lone.write("vocab.json", vocab_json_text());
    require_input_error([&] { (void)loom::executor::load_tokenizer(lone.path.string()); },
                        (lone.path / "merges.txt").string(), "", "merges.txt beside it");
  }
  SECTION("malformed vocab.json") {
    const std::string vocab = dir.write("vocab.json", "{\"<s>\": 0,");
    require_input_error([&] { (void)ByteLevelBpeTokenizer::from_files(vocab, merges); }, vocab, "",
                        "not valid JSON");
  }
  SECTION("an id that is not a whole number") {
    const std::string vocab = dir.write("vocab.json", R"({"<s>": 0, "<pad>": -1})");
    require_input_error([&] { (void)ByteLevelBpeTokenizer::from_files(vocab, merges); }, vocab,
                        "$[\"<pad>\"]", "whole number");
  }
  SECTION("an id past the number of tokens") {
    const std::string vocab =
        dir.write("vocab.json", R"({"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 333333333})");
    require_input_error([&] { (void)ByteLevelBpeTokenizer::from_files(vocab, merges); }, vocab, "",
                        "ids from 0 to 3 numbering its 4 tokens; \"<unk>\" has id 333333333");
  }
  SECTION("a vocabulary that is not an object") {
    const std::string vocab = dir.write("vocab.json", R"(["<s>", "<pad>"])");
    require_input_error([&] { (void)ByteLevelBpeTokenizer::from_files(vocab, merges); }, vocab, "$",
                        "JSON object of token -> id");
  }
  SECTION("a missing special token") {
    nlohmann::json vocab = nlohmann::json::parse(vocab_json_text());
    vocab.erase("<pad>");
    vocab["[PAD]"] = 1;
    const std::string path = dir.write("vocab.json", vocab.dump());
    require_input_error([&] { (void)ByteLevelBpeTokenizer::from_files(path, merges); }, path, "",
                        "found no <pad>");
  }
  SECTION("a merge of tokens the vocabulary lacks, or whose result it lacks") {
    const std::string vocab = dir.write("vocab.json", vocab_json_text());
    const std::string missing = dir.write("missing.txt", "#version: 0.2\nH e\nq r\n");
    require_input_error([&] { (void)ByteLevelBpeTokenizer::from_files(vocab, missing); }, missing,
                        "line 3", "\"q\" is not in it");
    const std::string result = dir.write("result.txt", "#version: 0.2\nx y\n");
    require_input_error([&] { (void)ByteLevelBpeTokenizer::from_files(vocab, result); }, result,
                        "line 2", "\"xy\" is not in it");
  }
  SECTION("a merge line that is not two tokens") {
    const std::string vocab = dir.write("vocab.json", vocab_json_text());
    const std::string bad = dir.write("bad.txt", "#version: 0.2\r\nH e\r\nl l o\r\n");
    require_input_error([&] { (void)ByteLevelBpeTokenizer::from_files(vocab, bad); }, bad, "line 3",
                        "two tokens separated by one space");
  }
}

TEST_CASE("tokenizer.json that Loom cannot run asks for the two-file form", "[tokenizer][bpe]") {
  TempDir dir;
  nlohmann::json unigram = tokenizer_json();
  unigram["model"]["type"] = "Unigram";
  const std::string u = dir.write("unigram.json", unigram.dump());
  require_input_error([&] { (void)loom::executor::load_tokenizer(u); }, u, "$.model.type",
                      "vocab.json + merges.txt, or vocab.txt");
  nlohmann::json metaspace = tokenizer_json();
  metaspace["pre_tokenizer"] = {{"type", "Metaspace"}};
  const std::string m = dir.write("metaspace.json", metaspace.dump());
  require_input_error([&] { (void)loom::executor::load_tokenizer(m); }, m, "$.pre_tokenizer.type",
                      "vocab.json + merges.txt");
  nlohmann::json bad_merge = tokenizer_json();
  bad_merge["model"]["merges"][1] = nlohmann::json::array({"o"});
  const std::string b = dir.write("bad-merge.json", bad_merge.dump());
  require_input_error([&] { (void)loom::executor::load_tokenizer(b); }, b, "$.model.merges[1]",
                      "a merge");
  const std::string broken = dir.write("tokenizer.json", "{\"model\": ");
  require_input_error([&] { (void)loom::executor::load_tokenizer(broken); }, broken, "",
                      "not valid JSON");
  TempDir empty;
  require_input_error([&] { (void)loom::executor::load_tokenizer(empty.path.string()); },
                      empty.path.string(), "", "holds none of vocab.txt, vocab.json");
  const std::string nowhere = (dir.path / "nowhere").string();
  require_input_error([&] { (void)loom::executor::load_tokenizer(nowhere); }, nowhere, "",
                      "no such file or folder");
  TempDir both;
  both.write("vocab.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n");
  both.write("vocab.json", vocab_json_text());
  require_input_error([&] { (void)loom::executor::load_tokenizer(both.path.string()); },
                      both.path.string(), "", "found both vocab.txt");
}

TEST_CASE("WordPiece from vocab.txt or tokenizer.json, lower case as the folder says",
          "[tokenizer]") {
  using loom::executor::load_tokenizer;
  TempDir dir;
  // [PAD] 0, [UNK] 1, [CLS] 2, [SEP] 3, hello 4, Hello 5.
  const std::string vocab = "[PAD]\n[UNK]\n[CLS]\n[SEP]\nhello\nHello\n";
  const std::string uncased_txt = dir.write("uncased/vocab.txt", vocab);
  const auto uncased = load_tokenizer((dir.path / "uncased").string());
  CHECK(uncased->encode("Hello", 4, 0).input_ids == Ids{2, 4, 3, 0});  // lower case by default
  CHECK(uncased->files() == std::vector<std::string>{uncased_txt});
  CHECK(load_tokenizer(uncased_txt)->encode("Hello", 4, 0).input_ids == Ids{2, 4, 3, 0});

  // bert-base-cased ships tokenizer_config.json with "do_lower_case": false.
  const std::string cased_txt = dir.write("cased/vocab.txt", vocab);
  const std::string config =
      dir.write("cased/tokenizer_config.json", R"({"do_lower_case": false})");
  const auto cased = load_tokenizer((dir.path / "cased").string());
  CHECK(cased->encode("Hello", 4, 0).input_ids == Ids{2, 5, 3, 0});
  CHECK(cased->files() == std::vector<std::string>{cased_txt, config});
  CHECK_THAT(cased->description(), Catch::Contains("cased") && Catch::Contains("6 ids"));

  // tokenizer.json: the BertNormalizer's "lowercase".
  auto wordpiece_json = [](bool lowercase) {
    return nlohmann::json{
        {"normalizer", {{"type", "BertNormalizer"}, {"lowercase", lowercase}}},
        {"pre_tokenizer", {{"type", "BertPreTokenizer"}}},
        {"model",
         {{"type", "WordPiece"},
          {"unk_token", "[UNK]"},
          {"continuing_subword_prefix", "##"},
          {"max_input_chars_per_word", 100},
          {"vocab",
           {{"[PAD]", 0}, {"[UNK]", 1}, {"[CLS]", 2}, {"[SEP]", 3}, {"hello", 4}, {"Hello", 5}}}}}};
  };
  const std::string fast_cased =
      dir.write("fast-cased/tokenizer.json", wordpiece_json(false).dump());
  CHECK(load_tokenizer(fast_cased)->encode("Hello", 4, 0).input_ids == Ids{2, 5, 3, 0});
  dir.write("fast-uncased/tokenizer.json", wordpiece_json(true).dump());
  const auto fast_uncased = load_tokenizer((dir.path / "fast-uncased").string());
  CHECK(fast_uncased->encode("Hello", 4, 0).input_ids == Ids{2, 4, 3, 0});
  CHECK(fast_uncased->vocab_size() == 6);
  // vocab.txt beside that tokenizer.json and no tokenizer_config.json: its normalizer decides.
  dir.write("fast-cased/vocab.txt", vocab);
  CHECK(load_tokenizer((dir.path / "fast-cased").string())->encode("Hello", 4, 0).input_ids ==
        Ids{2, 5, 3, 0});

  nlohmann::json prefix = wordpiece_json(true);
  prefix["model"]["continuing_subword_prefix"] = "@@";
  const std::string bad = dir.write("prefix.json", prefix.dump());
  require_input_error([&] { (void)load_tokenizer(bad); }, bad, "$.model.continuing_subword_prefix",
                      "\"##\"");
}
