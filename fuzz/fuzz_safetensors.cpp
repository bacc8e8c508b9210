// Fuzz target: safetensors files (header length, JSON header, offsets, shapes, dtypes).
#include "executor/safetensors.hpp"
#include "fuzz/fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  loom::fuzz::expect_input_error_only([&] {
    const auto file =
        loom::executor::SafetensorsFile::parse(loom::fuzz::text_of(data, size), "fuzz");
    for (const auto& t : file.tensors()) {
      // Touch every byte a reader would convert.
      std::uint8_t sum = 0;
      for (std::size_t i = 0; i < t.size_bytes; ++i) sum += static_cast<std::uint8_t>(t.data[i]);
      volatile std::uint8_t sink = sum;
      (void)sink;
    }
  });
  return 0;
}
