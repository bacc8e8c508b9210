// Shared by the executor tests that train on several ranks: a temporary folder and the synthetic
// classification examples the parallel layouts are compared on.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "executor/examples.hpp"

namespace loom::test {

// A temporary folder `loom-PREFIX-PID-N` under the system's temporary directory, removed at the
// end.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix) {
    static int counter = 0;
    path_ = std::filesystem::temp_directory_path() /
            ("loom-" + prefix + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// `count` sequences of 12 tokens ([CLS]=2, 5..11 tokens of 4..31, padding), drawn from `seed`;
// label 1 (every other example) iff token 7 appears.
inline std::vector<executor::EncodedExample> synthetic_examples(std::size_t count,
                                                                std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<executor::EncodedExample> out;
  constexpr std::int64_t kSeq = 12;
  for (std::size_t i = 0; i < count; ++i) {
    executor::EncodedExample e;
    const std::int64_t length = 6 + static_cast<std::int64_t>(rng() % 7);
    e.label = static_cast<std::int64_t>(i % 2);
    e.input_ids.assign(kSeq, 0);
    e.attention_mask.assign(kSeq, 0);
    e.token_type_ids.assign(kSeq, 0);
    e.input_ids[0] = 2;
    for (std::int64_t t = 1; t < length; ++t) {
      std::int64_t id = 4 + static_cast<std::int64_t>(rng() % 28);
      while (id == 7) id = 4 + static_cast<std::int64_t>(rng() % 28);
      e.input_ids[static_cast<std::size_t>(t)] = id;
    }
    if (e.label == 1) e.input_ids[static_cast<std::size_t>(1 + rng() % (length - 1))] = 7;
    for (std::int64_t t = 0; t < length; ++t) e.attention_mask[static_cast<std::size_t>(t)] = 1;
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace loom::test
