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
  std::string header = dir.write("header.csv", "comment,score\nfine,positive\n");
  require_input_error([&] { (void)load_reviews(header, "train"); }, header, "line 1",
                      "review, text or sentence");
  std::string no_label = dir.write("no-label.csv", "review,stars\nfine,5\n");
  require_input_error([&] { (void)load_reviews(no_label, "train"); }, no_label, "line 1",
                      "found \"review,stars\"");
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
  require_input_error([&] { (void)load_reviews(fields, "train"); }, fields, "line 2",
                      "2 fields as the header (review,sentiment), found 4");
  std::string label = dir.write("label.csv", "id,Text,Label\r\n1,good,1\r\n2,bad,2\r\n");
  require_input_error([&] { (void)load_reviews(label, "train"); }, label, "line 3, field Label",
                      "positive or negative (or pos/neg, 1/0; any case), found \"2\"");
  std::string junk = dir.write("junk.csv", "review,sentiment\n\"quoted\"junk,positive\n");
  require_input_error([&] { (void)load_reviews(junk, "train"); }, junk, "line 2",
                      "after a closing double quote");
  std::string empty = dir.write("empty.csv", "review,sentiment\r\n");
  require_input_error([&] { (void)load_reviews(empty, "train"); }, empty, "", "at least one");
  std::string nothing = dir.write("nothing.csv", "");
  require_input_error([&] { (void)load_reviews(nothing, "train"); }, nothing, "line 1",
                      "review,sentiment");
}

TEST_CASE("CSV: the headers and labels people have, in any case and order", "[dataset]") {
  TempDir dir;
  // Hugging Face's imdb / SST-2 exports: text,label and sentence,label with 0/1.
  CHECK(load_reviews(dir.write("a.csv", "text,label\nfine film,1\nawful,0\n"), "train") ==
        Reviews{{"fine film", 1}, {"awful", 0}});
  CHECK(load_reviews(dir.write("b.csv", "sentence,label\nok,0\n"), "train") == Reviews{{"ok", 0}});
  // Any case, either order, extra columns ignored, labels pos/neg in any case, spaces around.
  CHECK(load_reviews(dir.write("c.csv",
                               "Sentiment,ID,Review,Stars\n"
                               "Positive,1,\"great, really\",9\n"
                               "NEG,2,dull,2\n"
                               " pos ,3,fun,8\n"
                               "negative,4,weak,3\n"),
                     "train") ==
        Reviews{{"great, really", 1}, {"dull", 0}, {"fun", 1}, {"weak", 0}});
  // Both a review and a text column: review is the text.
  CHECK(load_reviews(dir.write("d.csv", "text,review,label\nt,r,1\n"), "train") ==
        Reviews{{"r", 1}});
  // A Windows CSV: byte order mark, CRLF line ends, the last field quoted before a final CR.
  CHECK(load_reviews(dir.write("windows.csv",
                               "\xEF\xBB\xBFreview,sentiment\r\n"
                               "Loved it,positive\r\n"
                               "\"Hated it\",negative\r\n"
                               "ok,\"positive\"\r"),
                     "train") == Reviews{{"Loved it", 1}, {"Hated it", 0}, {"ok", 1}});
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

TEST_CASE("aclImdb/train itself is a training split", "[dataset]") {
  TempDir dir;
  dir.write("train/pos/0_9.txt", "Good.");
  dir.write("train/neg/0_1.txt", "Bad.");
  CHECK(load_reviews((dir.path / "train").string(), "train") == Reviews{{"Bad.", 0}, {"Good.", 1}});
}

TEST_CASE("the evaluation split: --eval-data, else aclImdb/test, else none", "[dataset]") {
  using loom::executor::load_evaluation_split;
  TempDir dir;
  dir.write("aclImdb/train/pos/0_9.txt", "Train good.");
  dir.write("aclImdb/train/neg/0_1.txt", "Train bad.");
  dir.write("aclImdb/test/pos/0_10.txt", "Test good.");
  dir.write("aclImdb/test/neg/0_2.txt", "Test bad.");
  dir.write("holdout/pos/1.txt", "Held good.");
  dir.write("holdout/neg/1.txt", "Held bad.");
  dir.write("train-only/train/pos/0_9.txt", "Only train.");
  const std::string csv = dir.write("imdb_test.csv", "review,sentiment\nCSV bad,negative\n");
  const std::string root = (dir.path / "aclImdb").string();
  const std::string test = (dir.path / "aclImdb" / "test").string();
  const Reviews test_reviews{{"Test bad.", 0}, {"Test good.", 1}};

  // No --eval-data: aclImdb's test/ when there is one.
  auto split = load_evaluation_split(root, "");
  REQUIRE(split.has_value());
  CHECK(split->name == "test");
  CHECK(split->source == test);
  CHECK(split->reviews == test_reviews);
  CHECK_FALSE(load_evaluation_split((dir.path / "train-only").string(), "").has_value());
  CHECK_FALSE(load_evaluation_split(csv, "").has_value());
  CHECK_FALSE(load_evaluation_split("synthetic:50", "").has_value());

  // --eval-data: an aclImdb root, its test/ folder (with or without a final slash), a folder
  // with pos/ and neg/, a CSV file, a synthetic spec.
  for (const std::string& eval : {root, test, test + "/"}) {
    INFO(eval);
    auto given = load_evaluation_split(csv, eval);
    REQUIRE(given.has_value());
    CHECK(given->name == "test");
    CHECK(given->reviews == test_reviews);
  }
  auto holdout = load_evaluation_split(root, (dir.path / "holdout").string());
  REQUIRE(holdout.has_value());
  CHECK(holdout->name == "holdout");
  CHECK(holdout->reviews == Reviews{{"Held bad.", 0}, {"Held good.", 1}});
  auto from_csv = load_evaluation_split(root, csv);
  REQUIRE(from_csv.has_value());
  CHECK(from_csv->name == "imdb_test");
  CHECK(from_csv->source == csv);
  CHECK(from_csv->reviews == Reviews{{"CSV bad", 0}});
  auto synthetic = load_evaluation_split("synthetic:40", "synthetic:30");
  REQUIRE(synthetic.has_value());
  CHECK(synthetic->name == "test");
  CHECK(synthetic->reviews == load_reviews("synthetic:30", "test"));

  const std::string other = (dir.path / "train-only" / "train" / "pos").string();
  require_input_error([&] { (void)load_evaluation_split(root, other); }, other, "",
                      "none of test/, pos/, neg/");
  const std::string nowhere = (dir.path / "nowhere.csv").string();
  require_input_error([&] { (void)load_evaluation_split(root, nowhere); }, nowhere, "",
                      "no such file or folder");
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
