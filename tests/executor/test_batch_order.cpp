// The training data order, the run's size and the data checks (executor/batch_order.hpp).
#include <algorithm>
#include <catch2/catch.hpp>
#include <numeric>
#include <set>

#include "executor/batch_order.hpp"
#include "profiles/errors.hpp"

using loom::InputError;
using loom::executor::EncodedExample;

TEST_CASE("epoch_order is a seeded permutation fixed by seed and epoch", "[batch_order]") {
  using loom::executor::epoch_order;
  const std::vector<std::int64_t> a = epoch_order(42, 0, 50);
  std::vector<std::int64_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::int64_t> identity(50);
  std::iota(identity.begin(), identity.end(), 0);
  CHECK(sorted == identity);
  CHECK(a != identity);
  CHECK(epoch_order(42, 0, 50) == a);
  CHECK(epoch_order(42, 1, 50) != a);
  CHECK(epoch_order(43, 0, 50) != a);
  CHECK(epoch_order(42, 0, 1) == std::vector<std::int64_t>{0});
  CHECK(epoch_order(42, 0, 0).empty());
  // Pinned: the order that the training tests' gold losses were recorded with.
  CHECK(epoch_order(42, 0, 8) == std::vector<std::int64_t>{0, 4, 7, 5, 6, 2, 3, 1});
  CHECK(epoch_order(7, 3, 8) == std::vector<std::int64_t>{4, 0, 1, 5, 6, 2, 7, 3});
}

TEST_CASE("run_size: global batch, steps per epoch and in all", "[batch_order]") {
  using loom::executor::run_size;
  const auto by_steps = run_size(2, 4, 3, 10, 0, 100);
  CHECK(by_steps.global_batch == 24);
  CHECK(by_steps.steps_per_epoch == 4);  // 100 / 24, the rest dropped
  CHECK(by_steps.total_steps == 10);
  const auto by_epochs = run_size(1, 8, 1, 0, 3, 20);
  CHECK(by_epochs.steps_per_epoch == 2);
  CHECK(by_epochs.total_steps == 6);
  CHECK_THROWS_AS(run_size(2, 4, 3, 10, 0, 23), InputError);
}

TEST_CASE("check_examples refuses data that do not fit the model", "[batch_order]") {
  loom::profiles::ModelSpec spec;
  spec.vocab = 10;
  spec.type_vocab = 2;
  spec.max_positions = 8;
  spec.num_labels = 3;
  const EncodedExample good{{1, 2, 3}, {1, 1, 0}, {0, 1, 1}, 2};
  std::size_t seq_len = 0;
  loom::executor::check_examples({good, good}, "data", spec, seq_len);
  CHECK(seq_len == 3);
  auto refused = [&](EncodedExample e) {
    std::size_t length = 0;
    CHECK_THROWS_AS(loom::executor::check_examples({good, e}, "data", spec, length), InputError);
  };
  EncodedExample e = good;
  e.input_ids = {1, 2};
  refused(e);
  e = good;
  e.input_ids[1] = 10;
  refused(e);
  e = good;
  e.token_type_ids[0] = 2;
  refused(e);
  e = good;
  e.attention_mask = {0, 1, 1};
  refused(e);
  e = good;
  e.attention_mask[1] = 2;
  refused(e);
  e = good;
  e.label = 3;
  refused(e);
  std::size_t fixed = 4;  // another data set's length
  CHECK_THROWS_AS(loom::executor::check_examples({good}, "data", spec, fixed), InputError);
}

TEST_CASE("batch_json writes the micro-batch as dumped", "[batch_order]") {
  const std::vector<EncodedExample> data = {{{1, 2}, {1, 1}, {0, 0}, 0},
                                            {{3, 4}, {1, 0}, {0, 1}, 1}};
  const auto line = loom::executor::batch_json(5, 1, data, {1, 0}, 0, 1);
  CHECK(line.dump() == R"({"step":5,"micro_batch":1,"input_ids":[[3,4]],"attention_mask":[[1,0]],)"
                       R"("token_type_ids":[[0,1]],"labels":[1]})");
}
