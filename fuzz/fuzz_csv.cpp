// Fuzz target: Kaggle-style review CSV (review,sentiment; quoted fields, embedded newlines).
#include "executor/dataset.hpp"
#include "fuzz/fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  loom::fuzz::expect_input_error_only(
      [&] { (void)loom::executor::parse_reviews_csv(loom::fuzz::text_of(data, size), "fuzz"); });
  return 0;
}
