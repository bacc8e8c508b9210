// The metrics.jsonl reader behind "predicted vs measured" (loom report, loom validate).
#include <catch2/catch.hpp>
#include <string>

#include "executor/metrics.hpp"
#include "profiles/errors.hpp"

using Catch::Contains;
using loom::InputError;
using loom::executor::summarize_metrics;
using loom::planner::MeasuredSteps;

TEST_CASE("a metrics file summarised: median step time, peak memory, errors by line",
          "[executor][metrics]") {
  const std::string jsonl =
      "{\"step\": 1, \"loss\": 0.7, \"step_time_s\": 0.50, \"peak_memory_bytes\": 1000}\n"
      "\n"
      "{\"step\": 2, \"loss\": 0.6, \"step_time_s\": 0.20, \"peak_memory_bytes\": 3000,"
      " \"device_used_bytes\": 9000}\n"
      "{\"eval\": true, \"step\": 2, \"accuracy\": 0.9, \"loss\": 0.5}\n"
      "{\"step\": 3, \"loss\": 0.5, \"step_time_s\": 0.30}\n"
      "{\"step\": 4, \"loss\": 0.4, \"step_time_s\": 0.40}\n";
  const MeasuredSteps m = summarize_metrics(jsonl, "metrics.jsonl");
  CHECK(m.steps == 4);
  CHECK(m.median_step_time_s == Approx(0.35));
  REQUIRE(m.peak_memory_bytes);
  CHECK(*m.peak_memory_bytes == 3000);
  REQUIRE(m.device_used_bytes);  // CUDA runs write it on some lines
  CHECK(*m.device_used_bytes == 9000);
  CHECK_FALSE(summarize_metrics("{\"step_time_s\": 0.1}\n", "m.jsonl").device_used_bytes);

  auto error_of = [](const std::string& text) {
    try {
      summarize_metrics(text, "m.jsonl");
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  CHECK_THAT(error_of("{\"step\": 1, \"step_time_s\": 0.1}\nnot json\n"),
             Contains("m.jsonl") && Contains("line 2"));
  CHECK_THAT(error_of("{\"step_time_s\": \"fast\"}\n"),
             Contains("line 1") && Contains("step_time_s"));
  CHECK_THAT(error_of("{\"eval\": true, \"loss\": 0.3}\n"), Contains("none"));
  CHECK_THAT(error_of("{\"step_time_s\": 0.1, \"phases_s\": 3}\n"), Contains("line 1: phases_s"));
  CHECK_THAT(error_of("{\"step_time_s\": 0.1, \"phases_s\": {\"forward\": -1}}\n"),
             Contains("phases_s.forward"));
  CHECK_THAT(error_of("{\"step_time_s\": 0.1, \"device_used_bytes\": -5}\n"),
             Contains("line 1: device_used_bytes"));
}

TEST_CASE("each phase of loom train's steps gets its median over the steps after the warm-up",
          "[executor][metrics]") {
  const std::string jsonl =
      "{\"step\": 1, \"step_time_s\": 0.9, \"phases_s\": {\"forward\": 0.5, \"backward\": 0.4}}\n"
      "{\"step\": 2, \"step_time_s\": 0.3, \"phases_s\": {\"forward\": 0.1, \"backward\": 0.2}}\n"
      "{\"step\": 3, \"step_time_s\": 0.4, \"phases_s\": {\"forward\": 0.3, \"backward\": 0.1}}\n"
      "{\"step\": 4, \"step_time_s\": 0.5, \"phases_s\": {\"forward\": 0.2, \"backward\": 0.3}}\n";
  const MeasuredSteps m = summarize_metrics(jsonl, "metrics.jsonl", 1);
  CHECK(m.median_step_time_s == Approx(0.4));
  // In the lines' order (not alphabetical), step 1 left out.
  REQUIRE(m.median_phases_s.size() == 2);
  CHECK(m.median_phases_s[0].first == "forward");
  CHECK(m.median_phases_s[0].second == Approx(0.2));
  CHECK(m.median_phases_s[1].first == "backward");
  CHECK(m.median_phases_s[1].second == Approx(0.2));
  CHECK(summarize_metrics("{\"step_time_s\": 0.1}\n", "m.jsonl").median_phases_s.empty());
}
