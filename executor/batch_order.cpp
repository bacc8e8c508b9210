#include "executor/batch_order.hpp"

#include <algorithm>
#include <numeric>
#include <random>

#include "executor/dataset.hpp"
#include "profiles/errors.hpp"

namespace loom::executor {

std::vector<std::int64_t> epoch_order(std::uint64_t seed, std::int64_t epoch, std::int64_t count) {
  std::vector<std::int64_t> order(static_cast<std::size_t>(count));
  std::iota(order.begin(), order.end(), 0);
  const std::uint64_t epoch_key = SplitMix64(static_cast<std::uint64_t>(epoch) + 1).next();
  std::mt19937_64 rng(SplitMix64(seed ^ epoch_key).next());
  for (std::int64_t i = count - 1; i > 0; --i) {
    const auto j = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(i + 1));
    std::swap(order[static_cast<std::size_t>(i)], order[static_cast<std::size_t>(j)]);
  }
  return order;
}

namespace {

void check_example(const EncodedExample& e, const std::string& source, const std::string& where,
                   const profiles::ModelSpec& spec, std::size_t seq_len) {
  const std::int64_t types = std::max<std::int64_t>(spec.type_vocab, 1);
  const std::int64_t labels = classifier_labels(spec);
  if (e.input_ids.size() != seq_len || e.attention_mask.size() != seq_len ||
      e.token_type_ids.size() != seq_len || seq_len == 0) {
    throw InputError(source, where,
                     "input_ids, attention_mask and token_type_ids of one common length " +
                         std::to_string(seq_len));
  }
  for (std::size_t t = 0; t < seq_len; ++t) {
    if (e.input_ids[t] < 0 || e.input_ids[t] >= spec.vocab) {
      throw InputError(source, where,
                       "token ids in [0, " + std::to_string(spec.vocab) + "), found " +
                           std::to_string(e.input_ids[t]));
    }
    if (e.token_type_ids[t] < 0 || e.token_type_ids[t] >= types) {
      throw InputError(source, where, "token types in [0, " + std::to_string(types) + ")");
    }
    if (e.attention_mask[t] != 0 && e.attention_mask[t] != 1) {
      throw InputError(source, where, "an attention mask of 0 and 1");
    }
  }
  if (e.attention_mask[0] != 1) {
    throw InputError(source, where, "a first token that is not padding (attention_mask[0] = 1)");
  }
  if (e.label < 0 || e.label >= labels) {
    throw InputError(source, where, "a label in [0, " + std::to_string(labels) + ")");
  }
}

}  // namespace

void check_examples(const std::vector<EncodedExample>& data, const std::string& source,
                    const profiles::ModelSpec& spec, std::size_t& seq_len) {
  for (std::size_t i = 0; i < data.size(); ++i) {
    if (seq_len == 0) seq_len = data[i].input_ids.size();
    check_example(data[i], source, "example " + std::to_string(i), spec, seq_len);
  }
  // RoBERTa numbers positions from padding_idx + 1 (profiles::max_sequence_length).
  const std::int64_t longest = profiles::max_sequence_length(spec);
  if (!data.empty() && static_cast<std::int64_t>(seq_len) > longest) {
    throw InputError(source, "sequence length",
                     "at most " + std::to_string(longest) + " tokens (the model's max_positions " +
                         std::to_string(spec.max_positions) + "), found " +
                         std::to_string(seq_len));
  }
}

RunSize run_size(std::int64_t dp, std::int64_t micro_batch, std::int64_t num_micro_batches,
                 std::int64_t steps, std::int64_t epochs, std::size_t train_examples) {
  RunSize r;
  r.global_batch = dp * micro_batch * num_micro_batches;
  const auto train_count = static_cast<std::int64_t>(train_examples);
  if (train_count < r.global_batch) {
    throw InputError("training data", "",
                     "at least one global batch (" + std::to_string(r.global_batch) +
                         " examples), got " + std::to_string(train_count));
  }
  r.steps_per_epoch = train_count / r.global_batch;
  r.total_steps = steps > 0 ? steps : epochs * r.steps_per_epoch;
  return r;
}

nlohmann::ordered_json batch_json(std::int64_t step, std::int64_t micro_batch,
                                  const std::vector<EncodedExample>& data,
                                  const std::vector<std::int64_t>& order, std::int64_t begin,
                                  std::int64_t count) {
  nlohmann::ordered_json line;
  line["step"] = step;
  line["micro_batch"] = micro_batch;
  for (const char* key : {"input_ids", "attention_mask", "token_type_ids"}) {
    line[key] = nlohmann::ordered_json::array();
  }
  std::vector<std::int64_t> labels;
  for (std::int64_t r = 0; r < count; ++r) {
    const EncodedExample& e =
        data[static_cast<std::size_t>(order[static_cast<std::size_t>(begin + r)])];
    line["input_ids"].push_back(e.input_ids);
    line["attention_mask"].push_back(e.attention_mask);
    line["token_type_ids"].push_back(e.token_type_ids);
    labels.push_back(e.label);
  }
  line["labels"] = labels;
  return line;
}

}  // namespace loom::executor
