// Sentiment-classification reviews for fine-tuning: loading, a synthetic set, and deterministic
// shuffling and splitting. No LibTorch.
//
// Sources, chosen by the spec string:
//   "synthetic" or "synthetic:N"  N generated reviews (default kDefaultSyntheticReviews) whose
//        label is learnable from their words; the train and test splits are generated from
//        different seeds. synthetic_vocabulary() is a vocab.txt that covers every word.
//   a folder                      the Stanford aclImdb layout: <folder>/<split>/pos/*.txt
//        (label 1) and <folder>/<split>/neg/*.txt (label 0), one review per file; negative
//        reviews first, each folder in sorted file-name order. A folder with pos/ and neg/ but
//        no train/ (aclImdb/train itself) is its own "train" split.
//   a file                        CSV (RFC 4180) with a header naming the text column (review,
//        text or sentence) and the label column (sentiment or label), in any case and order;
//        other columns are ignored. Labels are positive/negative, pos/neg or 1/0, any case; line
//        ends "\n" or "\r\n"; a UTF-8 byte order mark is skipped. The Kaggle "IMDB Dataset.csv"
//        (review,sentiment) and SST-2 style files (sentence,label) read as they are. A CSV has
//        no test split: load it as "train" and divide it with split_train_validation().
// The text is returned as stored (UTF-8, HTML such as "<br />" kept); the tokenizer cleans it.
//
// Every order is a pure function of the inputs and the seed: the generator is splitmix64 and the
// shuffle is Fisher-Yates over it, implemented here, so results are the same on every platform
// and standard library.
//
// The evaluation split of a training run, load_evaluation_split(DATA, --eval-data): the given
// evaluation data, else aclImdb's test/ when DATA has one, else none (the caller holds out a
// validation fraction of the training data).
//
// Errors the user can fix (missing folder or file, no reviews, bad CSV header, field count or
// label, unterminated quote, bad spec or split) throw loom::InputError naming the file, the
// line, the field or folder and what was expected.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace loom::executor {

struct Review {
  std::string text;
  std::int64_t label = 0;  // 0 = negative, 1 = positive
  bool operator==(const Review&) const = default;
};

constexpr std::int64_t kDefaultSyntheticReviews = 2000;

// Reviews of `split` ("train" or "test") from `spec` (see above).
std::vector<Review> load_reviews(const std::string& spec, const std::string& split);

// The reviews of a CSV text (the header and labels above; RFC 4180 quoting); `path` names it in
// errors. What load_reviews does with a CSV file, without the file.
std::vector<Review> parse_reviews_csv(const std::string& text, const std::string& path);

// Checks a --data spec without reading it: a valid synthetic[:N], or an existing folder or file;
// throws the InputError load_reviews would.
void check_data_spec(const std::string& spec);

// Reviews to evaluate on and the split's name, for the output and the metrics.
struct EvaluationSplit {
  std::vector<Review> reviews;
  std::string name;    // "test" for aclImdb's test/, else the folder's name or the file's stem
  std::string source;  // the folder or file read
};

// The evaluation split of a run on `data`:
//   - `eval_data` not empty: an aclImdb root (its test/, named "test"), a folder with pos/ and
//     neg/ (named after the folder: aclImdb/test is "test"), a CSV file (named after its stem:
//     "imdb_test.csv" is "imdb_test") or a synthetic spec (its test split, "test");
//   - else aclImdb's test/ (named "test") when `data` is a folder that has one;
//   - else nullopt: hold out a validation fraction of the training reviews.
std::optional<EvaluationSplit> load_evaluation_split(const std::string& data,
                                                     const std::string& eval_data);

// False for a CSV file, whose only split is "train"; true for synthetic and aclImdb specs. Does
// not check that the files exist.
bool has_test_split(const std::string& spec);

// `count` synthetic reviews: 8-20 neutral words (film, plot, the, ...) with two to four words of
// the label's sentiment and at most one of the other's mixed in, ending with "."; labels are
// balanced in expectation. A pure function of (count, seed).
std::vector<Review> synthetic_reviews(std::int64_t count, std::uint64_t seed);

// A vocab.txt for the synthetic reviews, in id order: [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4
// (not BERT's ids: this vocabulary is small and only for models trained from scratch), then the
// punctuation and every word, lower case.
std::vector<std::string> synthetic_vocabulary();

// Sebastiano Vigna's splitmix64: a 64-bit generator whose sequence is fixed by its seed.
class SplitMix64 {
 public:
  explicit SplitMix64(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next();
  // Uniform in [0, bound) without modulo bias; bound > 0.
  std::uint64_t below(std::uint64_t bound);

 private:
  std::uint64_t state_;
};

// A permutation of 0..count-1: Fisher-Yates from the last position down, swapping position i
// with SplitMix64(seed).below(i + 1).
std::vector<std::size_t> shuffled_indices(std::size_t count, std::uint64_t seed);

// `reviews` reordered by shuffled_indices(reviews.size(), seed).
std::vector<Review> shuffle_reviews(std::vector<Review> reviews, std::uint64_t seed);

struct TrainValidation {
  std::vector<Review> train;
  std::vector<Review> validation;
};

// Shuffles with `seed`, then the first round(size * validation_fraction) reviews are the
// validation set and the rest the training set. validation_fraction in [0, 1), else InputError.
TrainValidation split_train_validation(std::vector<Review> reviews, double validation_fraction,
                                       std::uint64_t seed);

}  // namespace loom::executor
