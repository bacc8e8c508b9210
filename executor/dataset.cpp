#include "executor/dataset.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <optional>
#include <string_view>
#include <utility>

#include "profiles/errors.hpp"
#include "profiles/loader.hpp"

namespace loom::executor {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kSyntheticPrefix = "synthetic";
// At most a million reviews: about 1 GB of tokens at seq 128 (ten million took 12 GB and minutes).
constexpr std::int64_t kMaxSyntheticReviews = 1'000'000;
// The synthetic train and test splits come from these seeds.
constexpr std::uint64_t kSyntheticTrainSeed = 1;
constexpr std::uint64_t kSyntheticTestSeed = 2;

constexpr std::array<std::string_view, 12> kPositiveWords = {
    "good",      "great",   "excellent", "wonderful", "brilliant", "superb",
    "enjoyable", "amazing", "moving",    "loved",     "beautiful", "fun"};
constexpr std::array<std::string_view, 12> kNegativeWords = {
    "bad",  "awful", "terrible", "boring", "dull",  "poor",
    "weak", "waste", "hated",    "ugly",   "messy", "tedious"};
constexpr std::array<std::string_view, 32> kNeutralWords = {
    "the",   "a",       "this",     "that",  "film",      "movie",    "plot", "story",
    "actor", "actress", "director", "scene", "music",     "ending",   "cast", "script",
    "was",   "is",      "and",      "of",    "with",      "it",       "very", "really",
    "quite", "camera",  "time",     "hour",  "character", "dialogue", "some", "at"};
constexpr std::array<std::string_view, 2> kSyntheticPunctuation = {".", ","};

// The first 5 tokens of synthetic_vocabulary(), in id order.
constexpr std::array<std::string_view, 5> kSyntheticSpecials = {"[PAD]", "[UNK]", "[CLS]", "[SEP]",
                                                                "[MASK]"};

constexpr const char* kSpecExpectation =
    "\"synthetic\", \"synthetic:N\", an aclImdb folder (train/pos, train/neg, test/pos, "
    "test/neg) or a CSV file with the header review,sentiment";

template <std::size_t N>
std::string_view pick(const std::array<std::string_view, N>& words, SplitMix64& rng) {
  return words[static_cast<std::size_t>(rng.below(N))];
}

std::int64_t parse_synthetic_count(const std::string& spec) {
  if (spec.size() == kSyntheticPrefix.size()) return kDefaultSyntheticReviews;
  std::string_view digits = std::string_view(spec).substr(kSyntheticPrefix.size() + 1);
  std::int64_t count = 0;
  bool ok = !digits.empty() && digits.size() <= 9;
  for (char c : digits) {
    if (c < '0' || c > '9') {
      ok = false;
      break;
    }
    count = count * 10 + (c - '0');
  }
  if (!ok || count < 1 || count > kMaxSyntheticReviews) {
    throw InputError(
        spec, "",
        "synthetic:N with N a whole number from 1 to " + std::to_string(kMaxSyntheticReviews));
  }
  return count;
}

bool is_synthetic(const std::string& spec) {
  return spec == kSyntheticPrefix ||
         (spec.rfind(kSyntheticPrefix, 0) == 0 && spec.size() > kSyntheticPrefix.size() &&
          spec[kSyntheticPrefix.size()] == ':');
}

// Appends the reviews of one aclImdb label folder, in sorted file-name order.
void read_imdb_folder(const fs::path& folder, std::int64_t label, std::vector<Review>& out) {
  std::error_code ec;
  if (!fs::is_directory(folder, ec)) {
    throw InputError(folder.string(), "",
                     "a folder of reviews, one .txt file each (aclImdb layout: train/pos, "
                     "train/neg, test/pos, test/neg)");
  }
  std::vector<fs::path> files;
  for (const fs::directory_entry& entry : fs::directory_iterator(folder)) {
    if (entry.is_regular_file() && entry.path().extension() == ".txt") {
      files.push_back(entry.path());
    }
  }
  std::sort(files.begin(), files.end(), [](const fs::path& a, const fs::path& b) {
    return a.filename().string() < b.filename().string();
  });
  for (const fs::path& file : files) {
    out.push_back(Review{profiles::read_text_file(file.string()), label});
  }
}

// True for a folder with pos/ or neg/ inside: one split of the aclImdb layout.
bool is_split_folder(const fs::path& folder) {
  std::error_code ec;
  return fs::is_directory(folder / "pos", ec) || fs::is_directory(folder / "neg", ec);
}

// The reviews of one split folder: neg/ (label 0), then pos/ (label 1).
std::vector<Review> load_split_folder(const fs::path& folder) {
  std::vector<Review> reviews;
  read_imdb_folder(folder / "neg", 0, reviews);
  read_imdb_folder(folder / "pos", 1, reviews);
  if (reviews.empty()) {
    throw InputError(folder.string(), "", "at least one review: a .txt file in pos/ or neg/");
  }
  return reviews;
}

std::vector<Review> load_imdb(const std::string& folder, const std::string& split) {
  std::error_code ec;
  // A split folder given as the data itself is the training split.
  if (split == "train" && !fs::is_directory(fs::path(folder) / split, ec) &&
      is_split_folder(folder)) {
    return load_split_folder(folder);
  }
  return load_split_folder(fs::path(folder) / split);
}

struct CsvRecord {
  std::size_t line = 0;  // 1-based line where the record starts
  std::vector<std::string> fields;
};

// RFC 4180 records: fields separated by commas, records by "\n" or "\r\n"; a field that starts
// with a double quote runs to the matching quote, may hold commas and line breaks, and writes a
// quote as two. Blank lines are skipped.
std::vector<CsvRecord> parse_csv(const std::string& text, const std::string& source) {
  std::vector<CsvRecord> records;
  const std::size_t n = text.size();
  std::size_t i = text.rfind("\xEF\xBB\xBF", 0) == 0 ? 3 : 0;  // UTF-8 byte order mark
  std::size_t line = 1;
  while (i < n) {
    CsvRecord record;
    record.line = line;
    bool any_quoted = false;
    for (;;) {
      std::string field;
      if (i < n && text[i] == '"') {
        any_quoted = true;
        const std::size_t quote_line = line;
        ++i;
        for (;;) {
          if (i >= n) {
            throw InputError(source, "line " + std::to_string(quote_line),
                             "a closing double quote for the field opened on this line (write a "
                             "quote inside a field as \"\")");
          }
          if (text[i] == '"') {
            if (i + 1 < n && text[i + 1] == '"') {
              field += '"';
              i += 2;
              continue;
            }
            ++i;
            break;
          }
          if (text[i] == '\n') ++line;
          field += text[i++];
        }
        const bool at_end = i >= n || text[i] == ',' || text[i] == '\n' ||
                            (text[i] == '\r' && (i + 1 == n || text[i + 1] == '\n'));
        if (!at_end) {
          throw InputError(source, "line " + std::to_string(line),
                           "a comma or the end of the line after a closing double quote");
        }
      } else {
        while (i < n && text[i] != ',' && text[i] != '\n') field += text[i++];
        if ((i >= n || text[i] == '\n') && !field.empty() && field.back() == '\r') {
          field.pop_back();  // the \r of a \r\n line end
        }
      }
      record.fields.push_back(std::move(field));
      if (i < n && text[i] == ',') {
        ++i;
        continue;
      }
      // End of the record.
      if (i < n && text[i] == '\r') ++i;
      if (i < n && text[i] == '\n') {
        ++i;
        ++line;
      }
      break;
    }
    const bool blank = record.fields.size() == 1 && record.fields[0].empty() && !any_quoted;
    if (!blank) records.push_back(std::move(record));
  }
  return records;
}

}  // namespace

namespace {

constexpr std::array<std::string_view, 3> kTextColumns = {"review", "text", "sentence"};
constexpr std::array<std::string_view, 2> kLabelColumns = {"sentiment", "label"};

// `field` without the spaces and tabs around it.
std::string_view trimmed(std::string_view field) {
  const std::size_t first = field.find_first_not_of(" \t");
  if (first == std::string_view::npos) return {};
  return field.substr(first, field.find_last_not_of(" \t") - first + 1);
}

std::string lower_ascii(std::string_view text) {
  std::string out(text);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

// The index of the first header field named one of `names` (any case), in the order of `names`.
template <std::size_t N>
std::optional<std::size_t> find_column(const std::vector<std::string>& header,
                                       const std::array<std::string_view, N>& names) {
  for (std::string_view name : names) {
    for (std::size_t i = 0; i < header.size(); ++i) {
      if (lower_ascii(trimmed(header[i])) == name) return i;
    }
  }
  return std::nullopt;
}

// 1 for positive, pos, 1; 0 for negative, neg, 0 (any case, spaces around ignored).
std::optional<std::int64_t> parse_label(std::string_view field) {
  const std::string label = lower_ascii(trimmed(field));
  if (label == "positive" || label == "pos" || label == "1") return 1;
  if (label == "negative" || label == "neg" || label == "0") return 0;
  return std::nullopt;
}

}  // namespace

std::vector<Review> parse_reviews_csv(const std::string& text, const std::string& path) {
  std::vector<CsvRecord> records = parse_csv(text, path);
  const std::vector<std::string> header =
      records.empty() ? std::vector<std::string>{} : records.front().fields;
  const std::optional<std::size_t> text_column = find_column(header, kTextColumns);
  const std::optional<std::size_t> label_column = find_column(header, kLabelColumns);
  if (!text_column || !label_column) {
    std::string found;
    for (const std::string& field : header) found += (found.empty() ? "" : ",") + field;
    throw InputError(path, "line 1",
                     "a header naming the text column (review, text or sentence) and the label "
                     "column (sentiment or label), as review,sentiment; found \"" +
                         found.substr(0, 80) + "\"");
  }
  std::string header_line;
  for (const std::string& field : header) header_line += (header_line.empty() ? "" : ",") + field;
  const std::string label_name(trimmed(header[*label_column]));
  std::vector<Review> reviews;
  reviews.reserve(records.size() - 1);
  for (std::size_t r = 1; r < records.size(); ++r) {
    CsvRecord& record = records[r];
    const std::string where = "line " + std::to_string(record.line);
    if (record.fields.size() != header.size()) {
      throw InputError(path, where,
                       std::to_string(header.size()) + " fields as the header (" +
                           header_line.substr(0, 80) + "), found " +
                           std::to_string(record.fields.size()) +
                           "; quote a review that holds commas");
    }
    const std::string& field = record.fields[*label_column];
    const std::optional<std::int64_t> label = parse_label(field);
    if (!label) {
      throw InputError(path, where + ", field " + label_name,
                       "positive or negative (or pos/neg, 1/0; any case), found \"" +
                           field.substr(0, 80) + "\"");
    }
    reviews.push_back(Review{std::move(record.fields[*text_column]), *label});
  }
  if (reviews.empty()) throw InputError(path, "", "at least one review after the header");
  return reviews;
}

namespace {

std::vector<Review> load_csv(const std::string& path) {
  return parse_reviews_csv(profiles::read_text_file(path), path);
}

void check_split(const std::string& split) {
  if (split != "train" && split != "test") {
    throw InputError("split", "", "train or test, found \"" + split + "\"");
  }
}

}  // namespace

std::uint64_t SplitMix64::next() {
  state_ += 0x9E3779B97F4A7C15ULL;
  std::uint64_t z = state_;
  z = (z ^ (z >> 30U)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27U)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31U);
}

std::uint64_t SplitMix64::below(std::uint64_t bound) {
  // Values below 2^64 mod bound would make the low residues likelier: draw again.
  const std::uint64_t threshold = (0 - bound) % bound;
  for (;;) {
    std::uint64_t r = next();
    if (r >= threshold) return r % bound;
  }
}

std::vector<std::size_t> shuffled_indices(std::size_t count, std::uint64_t seed) {
  std::vector<std::size_t> indices(count);
  for (std::size_t i = 0; i < count; ++i) indices[i] = i;
  SplitMix64 rng(seed);
  for (std::size_t i = count; i > 1; --i) {
    const auto j = static_cast<std::size_t>(rng.below(i));
    std::swap(indices[i - 1], indices[j]);
  }
  return indices;
}

std::vector<Review> shuffle_reviews(std::vector<Review> reviews, std::uint64_t seed) {
  std::vector<Review> out;
  out.reserve(reviews.size());
  for (std::size_t i : shuffled_indices(reviews.size(), seed)) out.push_back(std::move(reviews[i]));
  return out;
}

TrainValidation split_train_validation(std::vector<Review> reviews, double validation_fraction,
                                       std::uint64_t seed) {
  if (!(validation_fraction >= 0.0 && validation_fraction < 1.0)) {
    throw InputError("validation fraction", "",
                     "a number in [0, 1), found " + std::to_string(validation_fraction));
  }
  std::vector<Review> shuffled = shuffle_reviews(std::move(reviews), seed);
  auto count = static_cast<std::size_t>(
      std::llround(static_cast<double>(shuffled.size()) * validation_fraction));
  if (!shuffled.empty()) count = std::min(count, shuffled.size() - 1);
  TrainValidation out;
  const auto cut = shuffled.begin() + static_cast<std::ptrdiff_t>(count);
  out.validation.assign(std::make_move_iterator(shuffled.begin()), std::make_move_iterator(cut));
  out.train.assign(std::make_move_iterator(cut), std::make_move_iterator(shuffled.end()));
  return out;
}

std::vector<Review> synthetic_reviews(std::int64_t count, std::uint64_t seed) {
  SplitMix64 rng(seed);
  std::vector<Review> reviews;
  reviews.reserve(static_cast<std::size_t>(std::max<std::int64_t>(count, 0)));
  for (std::int64_t r = 0; r < count; ++r) {
    const auto label = static_cast<std::int64_t>(rng.below(2));
    const auto& same = label == 1 ? kPositiveWords : kNegativeWords;
    const auto& other = label == 1 ? kNegativeWords : kPositiveWords;
    std::vector<std::string_view> words;
    const std::uint64_t neutral = 8 + rng.below(13);
    for (std::uint64_t w = 0; w < neutral; ++w) words.push_back(pick(kNeutralWords, rng));
    auto insert = [&](std::string_view word) {
      words.insert(words.begin() + static_cast<std::ptrdiff_t>(rng.below(words.size() + 1)), word);
    };
    const std::uint64_t signal = 2 + rng.below(3);
    for (std::uint64_t w = 0; w < signal; ++w) insert(pick(same, rng));
    if (rng.below(2) == 1) insert(pick(other, rng));
    std::string text;
    for (std::string_view word : words) {
      text += word;
      text += ' ';
    }
    text += '.';
    reviews.push_back(Review{std::move(text), label});
  }
  return reviews;
}

std::vector<std::string> synthetic_vocabulary() {
  std::vector<std::string> vocab;
  vocab.reserve(kSyntheticSpecials.size() + kSyntheticPunctuation.size() + kNeutralWords.size() +
                kPositiveWords.size() + kNegativeWords.size());
  for (std::string_view token : kSyntheticSpecials) vocab.emplace_back(token);
  for (std::string_view token : kSyntheticPunctuation) vocab.emplace_back(token);
  for (std::string_view word : kNeutralWords) vocab.emplace_back(word);
  for (std::string_view word : kPositiveWords) vocab.emplace_back(word);
  for (std::string_view word : kNegativeWords) vocab.emplace_back(word);
  return vocab;
}

bool has_test_split(const std::string& spec) {
  if (is_synthetic(spec)) return true;
  std::error_code ec;
  return !fs::is_regular_file(spec, ec);
}

[[noreturn]] void no_such_data(const std::string& spec) {
  throw InputError(spec, "", std::string(kSpecExpectation) + "; no such file or folder");
}

void check_data_spec(const std::string& spec) {
  if (is_synthetic(spec)) {
    parse_synthetic_count(spec);
    return;
  }
  std::error_code ec;
  if (!fs::is_directory(spec, ec) && !fs::is_regular_file(spec, ec)) no_such_data(spec);
}

std::vector<Review> load_reviews(const std::string& spec, const std::string& split) {
  if (is_synthetic(spec)) {
    check_split(split);
    return synthetic_reviews(parse_synthetic_count(spec),
                             split == "train" ? kSyntheticTrainSeed : kSyntheticTestSeed);
  }
  std::error_code ec;
  if (fs::is_directory(spec, ec)) {
    check_split(split);
    return load_imdb(spec, split);
  }
  if (fs::is_regular_file(spec, ec)) {
    if (split != "train") {
      throw InputError(spec, "",
                       "a CSV file has only a train split (divide it with a validation "
                       "fraction), asked for \"" +
                           split + "\"");
    }
    return load_csv(spec);
  }
  no_such_data(spec);
}

std::optional<EvaluationSplit> load_evaluation_split(const std::string& data,
                                                     const std::string& eval_data) {
  std::error_code ec;
  if (eval_data.empty()) {
    if (is_synthetic(data) || !fs::is_directory(fs::path(data) / "test", ec)) return std::nullopt;
    const fs::path test = fs::path(data) / "test";
    return EvaluationSplit{load_split_folder(test), "test", test.string()};
  }
  if (is_synthetic(eval_data)) {
    return EvaluationSplit{load_reviews(eval_data, "test"), "test", eval_data};
  }
  const fs::path path = fs::path(eval_data).lexically_normal();
  if (fs::is_directory(path, ec)) {
    if (is_split_folder(path)) {
      const fs::path named = path.has_filename() ? path : path.parent_path();
      return EvaluationSplit{load_split_folder(path), named.filename().string(), eval_data};
    }
    if (fs::is_directory(path / "test", ec)) {
      return EvaluationSplit{load_split_folder(path / "test"), "test", (path / "test").string()};
    }
    throw InputError(eval_data, "",
                     "evaluation data: an aclImdb folder (test/pos, test/neg), a folder with pos/ "
                     "and neg/, or a CSV file; this folder has none of test/, pos/, neg/");
  }
  if (fs::is_regular_file(path, ec)) {
    return EvaluationSplit{load_csv(eval_data), path.stem().string(), eval_data};
  }
  throw InputError(eval_data, "",
                   "evaluation data: an aclImdb folder, a folder with pos/ and neg/, or a CSV "
                   "file; no such file or folder");
}

}  // namespace loom::executor
