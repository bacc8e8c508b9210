// Sentiment-classification reviews for fine-tuning: loading, a synthetic set, and deterministic
// shuffling and splitting. No LibTorch.
//
// Sources, chosen by the spec string:
//   "synthetic" or "synthetic:N"  N generated reviews (default kDefaultSyntheticReviews) whose
//        label is learnable from their words; the train and test splits are generated from
//        different seeds. synthetic_vocabulary() is a vocab.txt that covers every word.
//   a folder                      the Stanford aclImdb layout: <folder>/<split>/pos/*.txt
//        (label 1) and <folder>/<split>/neg/*.txt (label 0), one review per file; negative
//        reviews first, each folder in sorted file-name order.
//   a file                        CSV (RFC 4180) with the header "review,sentiment" and sentiment
//        "positive" (1) or "negative" (0), as the Kaggle "IMDB Dataset.csv". It has no test
//        split: load it as "train" and divide it with split_train_validation().
// The text is returned as stored (UTF-8, HTML such as "<br />" kept); the tokenizer cleans it.
//
// Every order is a pure function of the inputs and the seed: the generator is splitmix64 and the
// shuffle is Fisher-Yates over it, implemented here, so results are the same on every platform
// and standard library.
//
// Errors the user can fix (missing folder or file, no reviews, bad CSV header, field count or
// sentiment, unterminated quote, bad spec or split) throw loom::InputError naming the file, the
// line or folder and what was expected.
#pragma once

#include <cstdint>
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

// The reviews of a Kaggle-style CSV text (header review,sentiment; RFC 4180 quoting); `path`
// names it in errors. What load_reviews does with a CSV file, without the file.
std::vector<Review> parse_reviews_csv(const std::string& text, const std::string& path);

// Checks a --data spec without reading it: a valid synthetic[:N], or an existing folder or file;
// throws the InputError load_reviews would.
void check_data_spec(const std::string& spec);

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
