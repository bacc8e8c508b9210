// One tokenized training example: what the data layer hands to the model and the training loop.
#pragma once

#include <cstdint>
#include <vector>

namespace loom::executor {

// Token ids, attention mask (1 = real token, 0 = padding) and token types, all of length seq_len;
// label 0 = negative, 1 = positive.
struct EncodedExample {
  std::vector<std::int64_t> input_ids;
  std::vector<std::int64_t> attention_mask;
  std::vector<std::int64_t> token_type_ids;
  std::int64_t label = 0;
  bool operator==(const EncodedExample&) const = default;
};

}  // namespace loom::executor
