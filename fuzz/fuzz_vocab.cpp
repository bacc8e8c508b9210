// Fuzz target: a WordPiece vocab.txt (one token per line) and the tokenizer over the same bytes.
#include "executor/tokenizer.hpp"
#include "fuzz/fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text = loom::fuzz::text_of(data, size);
  loom::fuzz::expect_input_error_only([&] {
    std::vector<std::string> tokens;
    std::size_t start = 0;
    while (start <= text.size()) {
      std::size_t end = text.find('\n', start);
      if (end == std::string::npos) end = text.size();
      tokens.push_back(text.substr(start, end - start));
      start = end + 1;
    }
    const auto tokenizer = loom::executor::WordPieceTokenizer::from_tokens(tokens, true, "fuzz");
    (void)tokenizer.encode(text, 64, 0);
  });
  return 0;
}
