// Reviews: CSV edge cases (RFC 4180 quoting, CRLF, accents), an aclImdb folder built in a temp
// folder, the synthetic set, and the exact orders of the deterministic shuffle and split.
#include <catch2/catch.hpp>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "executor/dataset.hpp"
#include "executor/tokenizer.hpp"
#include "profiles/errors.hpp"

using loom::executor::load_reviews;
using loom::executor::Review;
using Reviews = std::vector<Review>;
namespace fs = std::filesystem;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    std::random_device random;
    path = fs::temp_directory_path() /
           ("loom-test-dataset-" + std::to_string(random()) + std::to_string(random()));
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

// `read` must throw an InputError whose source is `source`, whose path is `path` and whose
// expectation contains `word`.
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

std::vector<std::int64_t> labels(const Reviews& reviews) {
  std::vector<std::int64_t> out;
  for (const Review& r : reviews) out.push_back(r.label);
  return out;
}

std::vector<std::string> texts(const Reviews& reviews) {
  std::vector<std::string> out;
  for (const Review& r : reviews) out.push_back(r.text);
  return out;
}

Reviews numbered(int count) {
  Reviews out;
  for (int i = 0; i < count; ++i) out.push_back(Review{std::to_string(i), i % 2});
  return out;
}

}  // namespace

TEST_CASE("CSV: quotes, commas, doubled quotes, line breaks, accents, CRLF", "[dataset]") {
  TempDir dir;
  std::string path = dir.write("imdb.csv",
                               "review,sentiment\r\n"
                               "\"A movie, with commas, and more\",positive\r\n"
                               "\"She said \"\"wow\"\" twice\",negative\r\n"
                               "\"Line one\r\nline two\n\nline four\",positive\r\n"
                               "Café résumé naïve 中国,negative\r\n"
                               "\"\",positive\r\n"
                               "plain <br /><br />text,positive");  // no final line break
  Reviews reviews = load_reviews(path, "train");
  CHECK(reviews == Reviews{{"A movie, with commas, and more", 1},
                           {"She said \"wow\" twice", 0},
                           {"Line one\r\nline two\n\nline four", 1},
                           {"Café résumé naïve 中国", 0},
                           {"", 1},
                           {"plain <br /><br />text", 1}});
  CHECK_FALSE(loom::executor::has_test_split(path));
  require_input_error([&] { (void)load_reviews(path, "test"); }, path, "", "train split");
}

TEST_CASE("CSV: LF line ends, a byte order mark, quoted header and blank lines", "[dataset]") {
  TempDir dir;
  std::string path = dir.write("lf.csv",
                               "\xEF\xBB\xBF\"review\",\"sentiment\"\ngood one,positive\n\nbad one,"
                               "negative\n\n");
  CHECK(load_reviews(path, "train") == Reviews{{"good one", 1}, {"bad one", 0}});
}

TEST_CASE("CSV: errors name the file, the line and the expectation", "[dataset]") {
  TempDir dir;
  std::string header = dir.write("header.csv", "text,label\nfine,positive\n");
  require_input_error([&] { (void)load_reviews(header, "train"); }, header, "line 1",
                      "review,sentiment");
  // The bad row starts on line 4 because the review before it spans lines 2 and 3.
  std::string sentiment =
      dir.write("sentiment.csv", "review,sentiment\n\"two\nlines\",positive\nmeh,neutral\n");
  require_input_error([&] { (void)load_reviews(sentiment, "train"); }, sentiment,
                      "line 4, field sentiment", "neutral");
  std::string unterminated =
      dir.write("quote.csv", "review,sentiment\nok,positive\n\"never closed,negative\nx,y\n");
  require_input_error([&] { (void)load_reviews(unterminated, "train"); }, unterminated, "line 3",
                      "closing double quote");
  std::string fields = dir.write("fields.csv", "review,sentiment\nno, quotes, here,positive\n");
  require_input_error([&] { (void)load_reviews(fields, "train"); }, fields, "line 2", "found 4");
  std::string junk = dir.write("junk.csv", "review,sentiment\n\"quoted\"junk,positive\n");
  require_input_error([&] { (void)load_reviews(junk, "train"); }, junk, "line 2",
                      "after a closing double quote");
  std::string empty = dir.write("empty.csv", "review,sentiment\r\n");
  require_input_error([&] { (void)load_reviews(empty, "train"); }, empty, "", "at least one");
  std::string nothing = dir.write("nothing.csv", "");
  require_input_error([&] { (void)load_reviews(nothing, "train"); }, nothing, "line 1",
                      "review,sentiment");
}

TEST_CASE("aclImdb folder: labels from pos/neg, sorted file names, splits", "[dataset]") {
  TempDir dir;
  dir.write("train/pos/2_7.txt", "Two.");
  dir.write("train/pos/10_8.txt", "Ten, <br />great.");
  dir.write("train/pos/0_9.txt", "Zero: loved it");
  dir.write("train/neg/5_1.txt", "Awful.");
  dir.write("train/neg/notes.md", "not a review");
  dir.write("train/unsup/0_0.txt", "unlabelled, ignored");
  dir.write("test/pos/0_10.txt", "Test positive.");
  dir.write("test/neg/0_2.txt", "Test negative.");
  dir.write("test/neg/1_3.txt", "Test négative 2.");
  const std::string root = dir.path.string();

  Reviews train = load_reviews(root, "train");
  CHECK(train == Reviews{{"Awful.", 0},
                         {"Zero: loved it", 1},
                         {"Ten, <br />great.", 1},  // "10_8.txt" sorts before "2_7.txt"
                         {"Two.", 1}});
  Reviews test = load_reviews(root, "test");
  CHECK(test == Reviews{{"Test negative.", 0}, {"Test négative 2.", 0}, {"Test positive.", 1}});
  CHECK(loom::executor::has_test_split(root));
  require_input_error([&] { (void)load_reviews(root, "validation"); }, "split", "",
                      "train or test");

  fs::remove_all(dir.path / "test" / "neg");
  const std::string missing = (dir.path / "test" / "neg").string();
  require_input_error([&] { (void)load_reviews(root, "test"); }, missing, "", "train/pos");

  TempDir empty;
  fs::create_directories(empty.path / "train" / "pos");
  fs::create_directories(empty.path / "train" / "neg");
  require_input_error([&] { (void)load_reviews(empty.path.string(), "train"); },
                      (empty.path / "train").string(), "", "at least one review");
}

TEST_CASE("unknown specs are refused", "[dataset]") {
  TempDir dir;
  const std::string nowhere = (dir.path / "nowhere").string();
  require_input_error([&] { (void)load_reviews(nowhere, "train"); }, nowhere, "",
                      "no such file or folder");
  for (const std::string spec :
       {"synthetic:0", "synthetic:abc", "synthetic:", "synthetic:-3", "synthetic:1000000000"}) {
    require_input_error([&] { (void)load_reviews(spec, "train"); }, spec, "", "synthetic:N");
  }
  require_input_error([&] { (void)load_reviews("synthetic:5", "dev"); }, "split", "",
                      "train or test");
}

TEST_CASE("synthetic reviews: deterministic, learnable, covered by their vocabulary", "[dataset]") {
  using loom::executor::synthetic_reviews;
  Reviews a = synthetic_reviews(200, 7);
  REQUIRE(a.size() == 200);
  CHECK(a == synthetic_reviews(200, 7));
  CHECK(a != synthetic_reviews(200, 8));
  CHECK(synthetic_reviews(50, 7) == Reviews(a.begin(), a.begin() + 50));  // a prefix

  Reviews train = load_reviews("synthetic:300", "train");
  Reviews test = load_reviews("synthetic:300", "test");
  CHECK(train.size() == 300);
  CHECK(train == load_reviews("synthetic:300", "train"));
  CHECK(train != test);
  CHECK(load_reviews("synthetic", "train").size() == loom::executor::kDefaultSyntheticReviews);
  CHECK(loom::executor::has_test_split("synthetic:300"));

  std::vector<std::string> vocab = loom::executor::synthetic_vocabulary();
  REQUIRE(vocab.size() > 5);
  CHECK(std::vector<std::string>(vocab.begin(), vocab.begin() + 5) ==
        std::vector<std::string>{"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"});
  CHECK(std::set<std::string>(vocab.begin(), vocab.end()).size() == vocab.size());
  auto tokenizer = loom::executor::WordPieceTokenizer::from_tokens(vocab);
  CHECK(tokenizer.pad_id() == 0);
  CHECK(tokenizer.unk_id() == 1);

  // A few words of each side of the documented sentiment lists.
  const std::set<std::string> positive = {"good",      "great",  "excellent", "wonderful",
                                          "brilliant", "superb", "enjoyable", "amazing",
                                          "moving",    "loved",  "beautiful", "fun"};
  const std::set<std::string> negative = {"bad",   "awful", "terrible", "boring",
                                          "dull",  "poor",  "weak",     "waste",
                                          "hated", "ugly",  "messy",    "tedious"};
  int positives = 0;
  for (const Review& review : train) {
    std::vector<std::string> pieces = tokenizer.tokenize(review.text);
    for (const std::string& piece : pieces) CHECK(piece != "[UNK]");
    int score = 0;
    for (const std::string& piece : pieces) {
      score += positive.count(piece) != 0 ? 1 : 0;
      score -= negative.count(piece) != 0 ? 1 : 0;
    }
    // Two to four words of its own side, at most one of the other: the sign gives the label.
    CHECK((review.label == 1 ? score >= 1 : score <= -1));
    CHECK(pieces.size() >= 11);
    CHECK(pieces.back() == ".");
    positives += static_cast<int>(review.label);
  }
  CHECK(positives > 100);  // balanced in expectation: 150 of 300
  CHECK(positives < 200);
}

TEST_CASE("splitmix64 reproduces the reference sequence", "[dataset]") {
  loom::executor::SplitMix64 zero(0);
  CHECK(zero.next() == 0xE220A8397B1DCDAFULL);
  CHECK(zero.next() == 0x6E789E6AA1B965F4ULL);
  CHECK(zero.next() == 0x06C45D188009454FULL);
  loom::executor::SplitMix64 vigna(1234567);
  CHECK(vigna.next() == 6457827717110365317ULL);
  CHECK(vigna.next() == 3203168211198807973ULL);
  CHECK(vigna.next() == 9817491932198370423ULL);
  loom::executor::SplitMix64 dice(3);
  for (int i = 0; i < 1000; ++i) CHECK(dice.below(6) < 6);
}

TEST_CASE("shuffle and split: exact orders for a seed", "[dataset]") {
  using loom::executor::shuffled_indices;
  using Indices = std::vector<std::size_t>;
  // Expected values from an independent implementation of the same algorithm (Python).
  CHECK(shuffled_indices(10, 42) == Indices{0, 9, 5, 8, 6, 4, 7, 2, 1, 3});
  CHECK(shuffled_indices(10, 43) == Indices{4, 2, 5, 6, 1, 3, 9, 8, 7, 0});
  CHECK(shuffled_indices(5, 0) == Indices{2, 3, 1, 4, 0});
  CHECK(shuffled_indices(0, 1).empty());
  CHECK(shuffled_indices(1, 1) == Indices{0});

  Reviews shuffled = loom::executor::shuffle_reviews(numbered(10), 42);
  CHECK(texts(shuffled) ==
        std::vector<std::string>{"0", "9", "5", "8", "6", "4", "7", "2", "1", "3"});
  CHECK(labels(shuffled) == std::vector<std::int64_t>{0, 1, 1, 0, 0, 0, 1, 0, 1, 1});

  auto split = loom::executor::split_train_validation(numbered(10), 0.3, 7);
  CHECK(texts(split.validation) == std::vector<std::string>{"8", "1", "5"});
  CHECK(texts(split.train) == std::vector<std::string>{"9", "0", "4", "3", "2", "6", "7"});
  CHECK(split.validation ==
        loom::executor::split_train_validation(numbered(10), 0.3, 7).validation);
  CHECK(split.validation !=
        loom::executor::split_train_validation(numbered(10), 0.3, 8).validation);

  auto none = loom::executor::split_train_validation(numbered(4), 0.0, 1);
  CHECK(none.validation.empty());
  CHECK(none.train.size() == 4);
  auto one = loom::executor::split_train_validation(numbered(1), 0.9, 1);
  CHECK(one.train.size() == 1);  // the training set is never emptied
  CHECK(one.validation.empty());

  for (double bad : {-0.1, 1.0, 2.0, std::numeric_limits<double>::quiet_NaN()}) {
    require_input_error([&] { (void)loom::executor::split_train_validation(numbered(4), bad, 1); },
                        "validation fraction", "", "[0, 1)");
  }
}
