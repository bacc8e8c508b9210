// Which examples each training step reads, and the checks that the data and the run's size fit
// the model, without LibTorch (the io library).
//
// Data order is a pure function of (seed, epoch): each epoch is a seeded permutation of the
// training examples (epoch_order), cut into floor(N / global_batch) steps (the incomplete rest is
// dropped), so step s reads epoch s / steps_per_epoch at offset (s % steps_per_epoch) *
// global_batch. Resumed runs and every rank of a many-rank run therefore see the same order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "executor/examples.hpp"
#include "profiles/model_spec.hpp"

namespace loom::executor {

// The example order of one epoch: a Fisher-Yates shuffle (std::mt19937_64 seeded with
// splitmix64(seed ^ splitmix64(epoch + 1))) of 0..count-1, driven by (seed, epoch) only.
std::vector<std::int64_t> epoch_order(std::uint64_t seed, std::int64_t epoch, std::int64_t count);

// Checks that every example of `data` fits `spec`: input_ids, attention_mask and token_type_ids
// of one common length (seq_len: set by the first example when 0, else checked), token ids in
// [0, vocab), types in [0, type_vocab), a 0/1 mask starting with a real token, a label in
// [0, classifier_labels), and at most the model's positions. Throws InputError (source `source`,
// path "example I" or "sequence length").
void check_examples(const std::vector<EncodedExample>& data, const std::string& source,
                    const profiles::ModelSpec& spec, std::size_t& seq_len);

// The size of a run: global_batch = dp * micro_batch * num_micro_batches examples per step,
// steps per epoch (the incomplete rest dropped) and in all (`steps`, or `epochs` whole epochs).
struct RunSize {
  std::int64_t global_batch = 0;
  std::int64_t steps_per_epoch = 0;
  std::int64_t total_steps = 0;
};

// Throws InputError (source "training data") when fewer than one global batch of examples.
RunSize run_size(std::int64_t dp, std::int64_t micro_batch, std::int64_t num_micro_batches,
                 std::int64_t steps, std::int64_t epochs, std::size_t train_examples);

// One line of TrainOptions::batches_path: the micro-batch of `count` examples from position
// `begin` of `order` as {"step", "micro_batch", "input_ids", "attention_mask", "token_type_ids",
// "labels"}, written from the host's examples.
nlohmann::ordered_json batch_json(std::int64_t step, std::int64_t micro_batch,
                                  const std::vector<EncodedExample>& data,
                                  const std::vector<std::int64_t>& order, std::int64_t begin,
                                  std::int64_t count);

}  // namespace loom::executor
