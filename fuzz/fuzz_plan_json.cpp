// Fuzz target: loom-plan/1 documents (model, cluster, strategy, stages, ranks, prediction).
#include "fuzz/fuzz_common.hpp"
#include "planner/plan.hpp"
#include "profiles/json_reader.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  loom::fuzz::expect_input_error_only([&] {
    const auto json = loom::profiles::parse_json_text(loom::fuzz::text_of(data, size), "fuzz");
    const loom::planner::Plan plan = loom::planner::plan_from_json(json, "fuzz");
    (void)loom::planner::device_of_rank(plan);
  });
  return 0;
}
