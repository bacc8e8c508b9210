// WordPiece tokenizer: hand-checked pieces and ids on small vocabularies (BERT's own examples),
// text cleaning, accents, punctuation, CJK, [UNK], encoding with truncation and padding, and the
// errors of a bad vocab.txt.
#include <catch2/catch.hpp>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "executor/tokenizer.hpp"
#include "profiles/errors.hpp"

using loom::executor::EncodedExample;
using loom::executor::WordPieceTokenizer;
using Pieces = std::vector<std::string>;
using Ids = std::vector<std::int64_t>;

namespace {

// The vocabulary of Hugging Face's BERT tokenizer test, with [PAD] added (a Loom requirement).
std::vector<std::string> hf_test_vocab() {
  return {"[UNK]", "[CLS]", "[SEP]", "want",  "##want", "##ed",
          "wa",    "un",    "runn",  "##ing", ",",      "[PAD]"};
}

// The id of each token is its index: [PAD] 0, [UNK] 1, [CLS] 2, [SEP] 3, [MASK] 4, un 5, ##aff 6,
// ##able 7, cafe 8, resume 9, hello 10, world 11, ! 12, , 13, . 14, ' 15, s 16, t 17, don 18,
// $ 19, 5 20, 中 21, 国 22, a 23, ##a 24, ひら 25, Café 26, — 27.
std::vector<std::string> small_vocab() {
  return {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "un",   "##aff", "##able", "cafe", "resume",
          "hello", "world", "!",     ",",     ".",      "'",    "s",     "t",      "don",  "$",
          "5",     "中",    "国",    "a",     "##a",    "ひら", "Café",  "—"};
}

WordPieceTokenizer small(bool lower_case = true) {
  return WordPieceTokenizer::from_tokens(small_vocab(), lower_case);
}

// A fresh folder under the system temp folder, removed at the end of the test.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::random_device random;
    path = std::filesystem::temp_directory_path() /
           ("loom-test-tokenizer-" + std::to_string(random()) + std::to_string(random()));
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream out(path / name, std::ios::binary);
    out << text;
    return (path / name).string();
  }
};

}  // namespace

TEST_CASE("Hugging Face's own example: UNwanted with an accent and running", "[tokenizer]") {
  WordPieceTokenizer tokenizer = WordPieceTokenizer::from_tokens(hf_test_vocab());
  Pieces pieces = tokenizer.tokenize("UNwant\u00E9d,running");
  CHECK(pieces == Pieces{"un", "##want", "##ed", ",", "runn", "##ing"});
  CHECK(tokenizer.to_ids(pieces) == Ids{7, 4, 5, 10, 8, 9});
  CHECK(tokenizer.unk_id() == 0);
  CHECK(tokenizer.cls_id() == 1);
  CHECK(tokenizer.sep_id() == 2);
  CHECK(tokenizer.pad_id() == 11);
  CHECK(tokenizer.vocab_size() == 12);
}

TEST_CASE("greedy longest match first: unaffable is un ##aff ##able", "[tokenizer]") {
  WordPieceTokenizer tokenizer = small();
  CHECK(tokenizer.tokenize("unaffable") == Pieces{"un", "##aff", "##able"});
  CHECK(tokenizer.to_ids(tokenizer.tokenize("unaffable")) == Ids{5, 6, 7});
  // Pieces are found, but a tail matches nothing: the whole word is [UNK], not a partial split.
  CHECK(tokenizer.tokenize("unaffablex") == Pieces{"[UNK]"});
  CHECK(tokenizer.tokenize("xyz hello") == Pieces{"[UNK]", "hello"});
  CHECK(tokenizer.to_ids({"hello", "nope"}) == Ids{10, 1});
  CHECK(tokenizer.find_id("nope") == -1);
  CHECK(tokenizer.token(7) == "##able");
  CHECK_THROWS_AS(tokenizer.token(28), std::out_of_range);
}

TEST_CASE("uncased: lower case and accents stripped", "[tokenizer]") {
  WordPieceTokenizer tokenizer = small();
  CHECK(tokenizer.tokenize("Café Résumé") == Pieces{"cafe", "resume"});
  CHECK(tokenizer.to_ids(tokenizer.tokenize("Café Résumé")) == Ids{8, 9});
  // A decomposed accent (e + U+0301) gives the same result as the precomposed one.
  CHECK(tokenizer.tokenize("CAFE\u0301") == Pieces{"cafe"});
  CHECK(tokenizer.tokenize("HeLLo WORLD") == Pieces{"hello", "world"});
}

TEST_CASE("cased: neither lower case nor accent stripping", "[tokenizer]") {
  WordPieceTokenizer tokenizer = small(/*lower_case=*/false);
  CHECK_FALSE(tokenizer.lower_case());
  CHECK(tokenizer.tokenize("Café cafe Hello") == Pieces{"Café", "cafe", "[UNK]"});
}

TEST_CASE("punctuation is split into tokens of its own", "[tokenizer]") {
  WordPieceTokenizer tokenizer = small();
  CHECK(tokenizer.tokenize("hello, world!") == Pieces{"hello", ",", "world", "!"});
  CHECK(tokenizer.tokenize("don't") == Pieces{"don", "'", "t"});
  CHECK(tokenizer.tokenize("$5.") == Pieces{"$", "5", "."});
  // U+2014 EM DASH is Unicode punctuation (Pd), not ASCII.
  CHECK(tokenizer.tokenize("hello\u2014world") == Pieces{"hello", "—", "world"});
  // "^" (ASCII 94) is punctuation even though Unicode calls it a symbol.
  CHECK(tokenizer.tokenize("hello^") == Pieces{"hello", "[UNK]"});
}

TEST_CASE("CJK ideographs are words of their own, kana are not", "[tokenizer]") {
  WordPieceTokenizer tokenizer = small();
  CHECK(tokenizer.tokenize("中国") == Pieces{"中", "国"});
  CHECK(tokenizer.to_ids(tokenizer.tokenize("a中国a")) == Ids{23, 21, 22, 23});
  CHECK(tokenizer.tokenize("ひら中") == Pieces{"ひら", "中"});
  CHECK(tokenizer.tokenize("ひらひら") == Pieces{"[UNK]"});  // no "##ひら" in the vocabulary
}

TEST_CASE("cleaning drops NUL, U+FFFD, control and invalid bytes and white space splits",
          "[tokenizer]") {
  WordPieceTokenizer tokenizer = small();
  CHECK(tokenizer.tokenize(std::string("hel\0lo", 6)) == Pieces{"hello"});
  CHECK(tokenizer.tokenize("hel\uFFFDlo") == Pieces{"hello"});
  CHECK(tokenizer.tokenize("hel\u200Blo") == Pieces{"hello"});  // zero-width space: Cf
  CHECK(tokenizer.tokenize("hel\x01lo\x7F") == Pieces{"hello"});
  CHECK(tokenizer.tokenize("hel\xFFlo") == Pieces{"hello"});  // not UTF-8
  CHECK(tokenizer.tokenize("hello\tworld\r\n\u00A0!\u3000.") == Pieces{"hello", "world", "!", "."});
  CHECK(tokenizer.tokenize("   \t\n").empty());
  CHECK(tokenizer.tokenize("").empty());
}

TEST_CASE("a word longer than 100 characters is [UNK]", "[tokenizer]") {
  WordPieceTokenizer tokenizer = small();
  Pieces hundred = tokenizer.tokenize(std::string(100, 'a'));
  REQUIRE(hundred.size() == 100);
  CHECK(hundred.front() == "a");
  CHECK(hundred.back() == "##a");
  CHECK(tokenizer.tokenize(std::string(101, 'a')) == Pieces{"[UNK]"});
  // The limit counts code points, not bytes: 60 two-byte characters are a 60-character word.
  std::string accents;
  for (int i = 0; i < 60; ++i) accents += "\u00E0";  // à, "a" once stripped
  CHECK(tokenizer.tokenize(accents).size() == 60);
}

TEST_CASE("encode: [CLS] pieces [SEP], padding and attention mask", "[tokenizer]") {
  WordPieceTokenizer tokenizer = small();
  EncodedExample padded = tokenizer.encode("Hello, world!", 8, 1);
  CHECK(padded.input_ids == Ids{2, 10, 13, 11, 12, 3, 0, 0});
  CHECK(padded.attention_mask == Ids{1, 1, 1, 1, 1, 1, 0, 0});
  CHECK(padded.token_type_ids == Ids{0, 0, 0, 0, 0, 0, 0, 0});
  CHECK(padded.label == 1);

  EncodedExample exact = tokenizer.encode("hello world", 4, 0);
  CHECK(exact.input_ids == Ids{2, 10, 11, 3});
  CHECK(exact.attention_mask == Ids{1, 1, 1, 1});
  CHECK(exact.label == 0);

  CHECK(tokenizer.encode("", 4, 0).input_ids == Ids{2, 3, 0, 0});
  CHECK(tokenizer.encode("", 4, 0).attention_mask == Ids{1, 1, 0, 0});
}

TEST_CASE("encode: truncation keeps [SEP] last", "[tokenizer]") {
  WordPieceTokenizer tokenizer = small();
  EncodedExample truncated = tokenizer.encode("unaffable hello world cafe", 5, 1);
  CHECK(truncated.input_ids == Ids{2, 5, 6, 7, 3});
  CHECK(truncated.attention_mask == Ids{1, 1, 1, 1, 1});
  CHECK(truncated.token_type_ids.size() == 5);
  CHECK(tokenizer.encode("hello world", 2, 0).input_ids == Ids{2, 3});
  CHECK_THROWS_AS(tokenizer.encode("hello", 1, 0), loom::InputError);
}

TEST_CASE("vocab.txt: ids are line numbers, CRLF and BOM accepted", "[tokenizer]") {
  TempDir dir;
  std::string path =
      dir.write("vocab.txt", "\xEF\xBB\xBF[PAD]\r\n[UNK]\r\n[CLS]\r\n[SEP]\r\nhi\r\n");
  WordPieceTokenizer tokenizer = WordPieceTokenizer::from_file(path);
  CHECK(tokenizer.vocab_size() == 5);
  CHECK(tokenizer.find_id("hi") == 4);
  CHECK(tokenizer.find_id("[PAD]") == 0);
  CHECK(tokenizer.encode("Hi there", 5, 1).input_ids == Ids{2, 4, 1, 3, 0});

  // A token listed twice keeps its last id, as in Hugging Face; the size counts lines.
  std::string twice = dir.write("twice.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\nhi\nhi");
  WordPieceTokenizer dup = WordPieceTokenizer::from_file(twice);
  CHECK(dup.vocab_size() == 6);
  CHECK(dup.find_id("hi") == 5);
}

TEST_CASE("bad vocabularies are refused, naming the file", "[tokenizer]") {
  TempDir dir;
  auto require_error = [](const std::string& path, const std::string& word) {
    try {
      (void)WordPieceTokenizer::from_file(path);
    } catch (const loom::InputError& e) {
      CHECK(e.source() == path);
      CHECK_THAT(e.what(), Catch::Contains(word));
      return;
    }
    FAIL("no InputError for " << path);
  };
  require_error(dir.write("empty.txt", ""), "no tokens");
  require_error(dir.write("no-cls.txt", "[PAD]\n[UNK]\n[SEP]\nhello\n"), "[CLS]");
  require_error(dir.write("no-pad.txt", "[UNK]\n[CLS]\n[SEP]\n"), "[PAD]");
  require_error((dir.path / "missing.txt").string(), "cannot read");
  require_error(dir.path.string(), "directory");
  CHECK_THROWS_WITH(WordPieceTokenizer::from_tokens({"[PAD]", "[UNK]", "[CLS]"}, true, "tokens"),
                    Catch::Contains("tokens") && Catch::Contains("[SEP]"));
}
