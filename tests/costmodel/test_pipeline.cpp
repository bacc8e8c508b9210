#include <catch2/catch.hpp>

#include "costmodel/pipeline.hpp"

using namespace loom::costmodel;

TEST_CASE("uniform stages give the published bubble fractions", "[pipeline]") {
  for (int p : {2, 4, 8, 16}) {
    std::vector<StageTime> ranks(static_cast<std::size_t>(p), StageTime{0.010, 0.020});
    for (std::int64_t m : {1, 4, 8, 32, 128}) {
      double bubble = (p - 1.0) / static_cast<double>(m);
      CHECK(bubble_fraction(ranks, m, Schedule::kGpipe, 1) == Approx(bubble).epsilon(1e-12));
      CHECK(bubble_fraction(ranks, m, Schedule::k1F1B, 1) == Approx(bubble).epsilon(1e-12));
      CHECK(pipeline_time_s(ranks, m, Schedule::k1F1B, 1) ==
            Approx((static_cast<double>(m) + p - 1) * 0.030).epsilon(1e-12));
      for (int v : {2, 4}) {
        CHECK(bubble_fraction(ranks, m, Schedule::kInterleaved, v) ==
              Approx(bubble / v).epsilon(1e-12));
      }
    }
  }
}

TEST_CASE("the slowest stage sets the steady state", "[pipeline]") {
  std::vector<StageTime> ranks{{0.01, 0.02}, {0.02, 0.04}, {0.01, 0.02}};
  // sum T = 0.03 + 0.06 + 0.03; (m - 1) * 0.06 with m = 5.
  CHECK(pipeline_time_s(ranks, 5, Schedule::k1F1B, 1) == Approx(0.12 + 4 * 0.06));
  CHECK(bubble_fraction(ranks, 5, Schedule::k1F1B, 1) == Approx((0.12 + 0.24) / 0.30 - 1));
}
