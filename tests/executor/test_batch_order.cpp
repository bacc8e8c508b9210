// The training data order, the run's size and the data checks (executor/batch_order.hpp), and
// the pipeline schedule's order of passes (executor/pipeline_schedule.hpp).
#include <algorithm>
#include <catch2/catch.hpp>
#include <numeric>
#include <set>

#include "executor/batch_order.hpp"
#include "executor/pipeline_schedule.hpp"
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

TEST_CASE("pipeline_order: pinned orders of every schedule", "[batch_order][pipeline]") {
  using loom::executor::pipeline_order;
  using loom::executor::to_string;
  using Schedule = loom::costmodel::Schedule;
  CHECK(to_string(pipeline_order(Schedule::k1F1B, 3, 0, 4, 1)) == "F0 F1 F2 B0 F3 B1 B2 B3");
  CHECK(to_string(pipeline_order(Schedule::k1F1B, 3, 1, 4, 1)) == "F0 F1 B0 F2 B1 F3 B2 B3");
  CHECK(to_string(pipeline_order(Schedule::k1F1B, 3, 2, 4, 1)) == "F0 B0 F1 B1 F2 B2 F3 B3");
  CHECK(to_string(pipeline_order(Schedule::k1F1B, 4, 0, 2, 1)) == "F0 F1 B0 B1");
  CHECK(to_string(pipeline_order(Schedule::kGpipe, 2, 1, 3, 1)) == "F0 F1 F2 B0 B1 B2");
  CHECK(to_string(pipeline_order(Schedule::kInterleaved, 2, 0, 4, 2), true) ==
        "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0");
  CHECK(to_string(pipeline_order(Schedule::kInterleaved, 2, 1, 2, 2), true) ==
        "F0.0 F1.0 F0.1 F1.1 B0.1 B1.1 B0.0 B1.0");
  // Every pass once, each backward after its forward.
  for (const auto& [schedule, pp, m, v] :
       std::vector<std::tuple<Schedule, int, int, int>>{{Schedule::kGpipe, 4, 6, 1},
                                                        {Schedule::k1F1B, 4, 6, 1},
                                                        {Schedule::k1F1B, 4, 2, 1},
                                                        {Schedule::kInterleaved, 4, 8, 3},
                                                        {Schedule::kInterleaved, 2, 6, 2}}) {
    for (int rank = 0; rank < pp; ++rank) {
      const auto tasks = pipeline_order(schedule, pp, rank, m, v);
      CHECK(tasks.size() == static_cast<std::size_t>(2 * m * v));
      std::set<std::pair<int, std::int64_t>> forwards;
      std::set<std::pair<int, std::int64_t>> backwards;
      for (const auto& t : tasks) {
        const std::pair<int, std::int64_t> key{t.chunk, t.micro_batch};
        if (t.forward) {
          CHECK(forwards.insert(key).second);
        } else {
          CHECK(forwards.count(key) == 1);
          CHECK(backwards.insert(key).second);
        }
      }
    }
  }
}
