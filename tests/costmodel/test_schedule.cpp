// Pipeline schedules: the order of passes on every rank, pinned as text worked out by hand from
// each schedule's definition (schedule.hpp), the checks that refuse what a schedule cannot run,
// and the activations in flight that the memory model charges against the order itself.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "costmodel/schedule.hpp"

using namespace loom::costmodel;

namespace {

std::string order(Schedule schedule, int pp, int rank, std::int64_t m, int v = 1) {
  return to_string(pipeline_order(schedule, pp, rank, m, v));
}

// The most micro-batches' activations alive at once in an order, in units of the rank's whole
// model (a chunk's forward holds them from its start to its backward's end).
double peak_in_flight(const std::vector<PipelineOp>& ops, int v) {
  int alive = 0;
  int peak = 0;
  for (const PipelineOp& op : ops) {
    alive += op.pass == PassKind::kForward ? 1 : -1;
    peak = std::max(peak, alive + (op.pass == PassKind::kBackward ? 1 : 0));
  }
  return static_cast<double>(peak) / v;
}

}  // namespace

TEST_CASE("1F1B warms up pp - rank - 1 forwards", "[schedule]") {
  // pp = 3, m = 4: rank 0 warms up 2 forwards, rank 1 one, the last rank none.
  CHECK(order(Schedule::k1F1B, 3, 0, 4) == "F0 F1 F2 B0 F3 B1 B2 B3");
  CHECK(order(Schedule::k1F1B, 3, 1, 4) == "F0 F1 B0 F2 B1 F3 B2 B3");
  CHECK(order(Schedule::k1F1B, 3, 2, 4) == "F0 B0 F1 B1 F2 B2 F3 B3");
  // Fewer micro-batches than the warm-up: every forward first.
  CHECK(order(Schedule::k1F1B, 4, 0, 2) == "F0 F1 B0 B1");
  CHECK(order(Schedule::k1F1B, 1, 0, 3) == "F0 B0 F1 B1 F2 B2");
}

TEST_CASE("GPipe runs every forward, then every backward", "[schedule]") {
  for (int rank : {0, 1, 2}) {
    CHECK(order(Schedule::kGpipe, 3, rank, 4) == "F0 F1 F2 F3 B0 B1 B2 B3");
  }
}

TEST_CASE("interleaved runs Megatron-LM's chunk order", "[schedule]") {
  // pp = 2, v = 2, m = 4: forward i runs chunk (i mod 4) / 2 of micro-batch (i / 4) * 2 + i mod 2,
  // so F0.0 F1.0 F0.1 F1.1 F2.0 F3.0 F2.1 F3.1; backward i the same micro-batch on chunk
  // 1 - that: B0.1 B1.1 B0.0 B1.0 B2.1 B3.1 B2.0 B3.0. Warm-up (pp - rank - 1) * 2 + (v - 1) * pp:
  // 4 forwards on rank 0, 2 on rank 1.
  CHECK(order(Schedule::kInterleaved, 2, 0, 4, 2) ==
        "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0");
  CHECK(order(Schedule::kInterleaved, 2, 1, 4, 2) ==
        "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0");
  // m == pp: Megatron-LM warms up every forward.
  CHECK(order(Schedule::kInterleaved, 2, 1, 2, 2) == "F0.0 F1.0 F0.1 F1.1 B0.1 B1.1 B0.0 B1.0");
}

TEST_CASE("every order runs each pass once, a backward after its forward", "[schedule]") {
  for (Schedule schedule : {Schedule::kGpipe, Schedule::k1F1B, Schedule::kInterleaved}) {
    const int v = schedule == Schedule::kInterleaved ? 3 : 1;
    for (int pp : {2, 4}) {
      for (std::int64_t m : {4, 8, 12}) {
        for (int rank = 0; rank < pp; ++rank) {
          INFO(to_string(schedule) << " pp=" << pp << " m=" << m << " rank=" << rank);
          const std::vector<PipelineOp> ops = pipeline_order(schedule, pp, rank, m, v);
          REQUIRE(ops.size() == static_cast<std::size_t>(2 * m * v));
          std::vector<int> forwards(static_cast<std::size_t>(m * v), 0);
          std::vector<int> backwards(static_cast<std::size_t>(m * v), 0);
          for (const PipelineOp& op : ops) {
            const auto i = static_cast<std::size_t>(op.micro_batch * v + op.chunk);
            if (op.pass == PassKind::kForward) {
              ++forwards[i];
            } else {
              CHECK(forwards[i] == 1);
              ++backwards[i];
            }
          }
          CHECK(forwards == std::vector<int>(forwards.size(), 1));
          CHECK(backwards == std::vector<int>(backwards.size(), 1));
          // The memory model's closed form is the order's own peak.
          CHECK(activation_micro_batches_in_flight(schedule, pp, rank, m, v) ==
                peak_in_flight(ops, v));
        }
      }
    }
  }
}

TEST_CASE("schedules refuse what they cannot run", "[schedule]") {
  CHECK_FALSE(check_schedule(Schedule::k1F1B, 3, 4, 1));
  CHECK_FALSE(check_schedule(Schedule::kInterleaved, 2, 4, 2));
  CHECK(check_schedule(Schedule::k1F1B, 2, 4, 2) ==
        std::optional<std::string>("virtual stages > 1 need the interleaved schedule"));
  CHECK(check_schedule(Schedule::kGpipe, 2, 4, 0) ==
        std::optional<std::string>("virtual stages must be >= 1 (found 0)"));
  CHECK(check_schedule(Schedule::kInterleaved, 2, 4, 1) ==
        std::optional<std::string>("the interleaved schedule needs virtual stages >= 2"));
  CHECK(check_schedule(Schedule::kInterleaved, 1, 4, 2) ==
        std::optional<std::string>("the interleaved schedule needs pp >= 2"));
  CHECK(check_schedule(Schedule::kInterleaved, 2, 5, 2) ==
        std::optional<std::string>(
            "the interleaved schedule needs the 5 micro-batches to be a multiple of pp=2"));
  CHECK(check_schedule(Schedule::k1F1B, 0, 4, 1) ==
        std::optional<std::string>("pp must be >= 1 (found 0)"));
  CHECK(check_schedule(Schedule::k1F1B, 2, 0, 1) ==
        std::optional<std::string>("the number of micro-batches must be >= 1"));
  CHECK_THROWS_WITH(pipeline_order(Schedule::kInterleaved, 2, 0, 5, 2),
                    "the interleaved schedule needs the 5 micro-batches to be a multiple of pp=2");
  CHECK_THROWS_WITH(pipeline_order(Schedule::k1F1B, 2, 2, 4, 1), "pipeline rank 2 is not in 0..1");
}

TEST_CASE("schedule names round-trip", "[schedule]") {
  CHECK(schedule_names() == std::vector<std::string>{"gpipe", "1f1b", "interleaved"});
  for (const std::string& name : schedule_names()) {
    REQUIRE(parse_schedule(name));
    CHECK(to_string(*parse_schedule(name)) == name);
  }
  CHECK_FALSE(parse_schedule("zero-bubble"));
}
