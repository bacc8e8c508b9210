// One tokenized training example: what the data layer hands to the model and the training loop.
#pragma once

#include <cstdint>
#include <vector>

#include "profiles/model_spec.hpp"

namespace loom::executor {

// Token ids, attention mask (1 = real token, 0 = padding) and token types, all of length seq_len;
// label in [0, classifier_labels(spec)) (sentiment: 0 = negative, 1 = positive).
struct EncodedExample {
  std::vector<std::int64_t> input_ids;
  std::vector<std::int64_t> attention_mask;
  std::vector<std::int64_t> token_type_ids;
  std::int64_t label = 0;
  bool operator==(const EncodedExample&) const = default;
};

// Labels a classifier for `spec` predicts (an example's label is in [0, this)): spec.num_labels,
// or 2 when the spec has none.
inline std::int64_t classifier_labels(const profiles::ModelSpec& spec) {
  return spec.num_labels.value_or(2);
}

}  // namespace loom::executor
