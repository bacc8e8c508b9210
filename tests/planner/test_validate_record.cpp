// The "measured" object of a loom validate record: what loom validate writes reads back as the
// same value, and the one reader's refusals name the field.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "planner/validate_record.hpp"
#include "profiles/errors.hpp"

using loom::planner::MeasuredRun;
using nlohmann::json;

TEST_CASE("a validate record's measured run reads back as written", "[validate]") {
  MeasuredRun run;
  run.step_time_s = 0.125;
  run.peak_memory_bytes = 3'000'000;
  run.device_used_bytes = 5'000'000;
  run.steps = 10;
  run.warmup_steps = 2;
  // Phases in their names' order: the JSON object keeps its keys sorted.
  run.ranks = {{0, 0.12, 3'000'000, {{"backward", 0.07}, {"forward", 0.04}}},
               {1, 0.125, 2'500'000, {{"backward", 0.08}, {"forward", 0.03}}}};
  const json doc = {{"measured", loom::planner::measured_run_to_json(run)}};
  CHECK(doc.at("measured").at("peak_memory_bytes").is_number_integer());
  CHECK(doc.at("measured").at("device_used_bytes") == 5'000'000);
  CHECK(loom::planner::measured_run_from_json(doc, "run.json") == run);

  // What a record written by hand holds at least: the step time.
  const MeasuredRun least = loom::planner::measured_run_from_json(
      json::parse(R"({"measured": {"step_time_s": 0.5}})"), "runs.jsonl", "line 3");
  CHECK(least.step_time_s == 0.5);
  CHECK(least.peak_memory_bytes == 0);
  CHECK_FALSE(least.device_used_bytes.has_value());
  CHECK(least.ranks.empty());
}

TEST_CASE("a validate record's measured run is refused with the field named", "[validate]") {
  auto error_of = [](const char* text) -> std::string {
    try {
      loom::planner::measured_run_from_json(json::parse(text), "runs.jsonl", "line 3");
    } catch (const loom::InputError& e) {
      return e.what();
    }
    return "";
  };
  using Catch::Contains;
  CHECK_THAT(error_of(R"({"measured": {"step_time_s": 0}})"),
             Contains("line 3.measured.step_time_s") && Contains("> 0"));
  CHECK_THAT(error_of(R"({"measured": {}})"), Contains("line 3.measured.step_time_s"));
  CHECK_THAT(error_of(R"({"measured": 1})"), Contains("line 3.measured"));
  CHECK_THAT(error_of(R"({"measured": {"step_time_s": 1, "device_used_bytes": -1}})"),
             Contains("line 3.measured.device_used_bytes"));
  CHECK_THAT(
      error_of(R"({"measured": {"step_time_s": 1, "ranks": [{"rank": 0, "step_time_s": 1,
                   "phases_s": {"forward": "fast"}}]}})"),
      Contains("line 3.measured.ranks[0].phases_s") && Contains("\"forward\""));
}
