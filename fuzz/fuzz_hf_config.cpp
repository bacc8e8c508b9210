// Fuzz target: Hugging Face config.json files (bert, roberta, gpt2), through the same model reader.
#include "fuzz/fuzz_common.hpp"
#include "profiles/json_reader.hpp"
#include "profiles/model_spec.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  loom::fuzz::expect_input_error_only([&] {
    const auto json = loom::profiles::parse_json_text(loom::fuzz::text_of(data, size), "fuzz");
    (void)loom::profiles::model_from_json(json, "fuzz");
  });
  return 0;
}
