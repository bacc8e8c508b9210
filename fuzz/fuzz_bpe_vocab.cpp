// Fuzz target: a byte-level BPE vocab.json, and the same bytes as merges.txt; the tokenizer built
// from the vocabulary encodes the bytes.
#include "executor/bpe_tokenizer.hpp"
#include "fuzz/fuzz_common.hpp"
#include "profiles/json_reader.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text = loom::fuzz::text_of(data, size);
  loom::fuzz::expect_input_error_only([&] {
    const auto vocab = loom::executor::bpe_vocab_from_json(
        loom::profiles::parse_json_text(text, "fuzz"), "fuzz", "$");
    const std::vector<loom::executor::BpeMerge> merges = {{"Ġ", "t", "line 1"}};
    const auto tokenizer =
        loom::executor::ByteLevelBpeTokenizer::from_parts(vocab, {}, "fuzz", "fuzz");
    (void)tokenizer.encode(text, 64, 0);
    (void)loom::executor::ByteLevelBpeTokenizer::from_parts(vocab, merges, "fuzz", "fuzz", true)
        .encode(text, 64, 0);
  });
  loom::fuzz::expect_input_error_only(
      [&] { (void)loom::executor::parse_bpe_merges(text, "fuzz"); });
  return 0;
}
