// loom tune's logic with fake measurements: re-ranking, the regret, failures, the resume file.
#include <catch2/catch.hpp>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "lab/tune.hpp"
#include "planner/search.hpp"
#include "profiles/errors.hpp"
#include "profiles/loader.hpp"

using namespace loom;
using namespace loom::planner;
using namespace loom::tune;

namespace {

// The search's best three plans of tiny-bert on the 2-core CPU cluster: three distinct
// candidates in predicted order.
std::vector<Plan> three_plans() {
  const costmodel::CostModel cost(profiles::load_model("tiny-bert"),
                                  profiles::load_cluster("local-cpu"));
  SearchOptions o;
  o.top = 3;
  o.simulate = false;
  std::vector<Plan> plans = search(cost, {16, 64, profiles::Precision::kFp32, "adamw"}, o).plans;
  REQUIRE(plans.size() == 3);
  return plans;
}

// Measures from a table of times by predicted rank (absent: the candidate fails), counting calls.
struct FakeRuns {
  std::map<int, double> step_time_s;
  std::vector<int> measured;
  TuneMeasurement operator()(const Plan&, int rank) {
    measured.push_back(rank);
    TuneMeasurement m;
    const auto it = step_time_s.find(rank);
    if (it == step_time_s.end()) {
      m.failure = "out of memory";
    } else {
      m.step_time_s = it->second;
    }
    return m;
  }
};

}  // namespace

TEST_CASE("tune re-ranks by measured time and reports the regret of the predicted first",
          "[tune]") {
  const std::vector<Plan> plans = three_plans();
  FakeRuns runs;
  // Predicted #2 is measured fastest (0.080 s); the predicted first took 0.100 s.
  runs.step_time_s = {{1, 0.100}, {2, 0.080}, {3, 0.120}};
  TuneLog log;
  int saves = 0;
  const TuneResult r = tune::tune(plans, &log, std::ref(runs), [&](const TuneLog& so_far) {
    ++saves;
    CHECK(so_far.measurements.size() == static_cast<std::size_t>(saves));
  });
  CHECK(runs.measured == std::vector<int>{1, 2, 3});
  CHECK(saves == 3);
  CHECK(r.best == 1);
  CHECK(r.candidates[0].measured_rank == 2);
  CHECK(r.candidates[1].measured_rank == 1);
  CHECK(r.candidates[2].measured_rank == 3);
  // (0.100 - 0.080) / 0.080 = 0.25.
  REQUIRE(r.regret.has_value());
  CHECK(*r.regret == Approx(0.25).epsilon(1e-12));
  // Error of candidate #3: (predicted - 0.120) / 0.120.
  CHECK(*r.candidates[2].relative_error() ==
        Approx((plans[2].predicted.step_time_s - 0.120) / 0.120).epsilon(1e-12));

  const nlohmann::json doc = tuned_plan_json(r, {10, 2});
  CHECK(doc.at("strategy") == costmodel::strategy_to_json(plans[1].strategy));
  const nlohmann::json& tuned = doc.at("tuned");
  CHECK(tuned.at("measured_step_time_s").get<double>() == 0.080);
  CHECK(tuned.at("predicted_step_time_s").get<double>() == plans[1].predicted.step_time_s);
  CHECK(tuned.at("predicted_rank") == 2);
  CHECK(tuned.at("measured_rank") == 1);
  CHECK(tuned.at("regret").get<double>() == Approx(0.25).epsilon(1e-12));
  CHECK(tuned.at("steps") == 10);
  CHECK(tuned.at("warmup_steps") == 2);
  REQUIRE(tuned.at("candidates").size() == 3);
  CHECK(tuned.at("candidates")[2].at("measured_rank") == 3);
  // The tuned plan reads back as a plan (the record is accepted and not needed to run).
  const Plan back = plan_from_json(doc, "tuned.json");
  CHECK(back.strategy == plans[1].strategy);
}

TEST_CASE("tune: a predicted first measured fastest has no regret", "[tune]") {
  FakeRuns runs;
  runs.step_time_s = {{1, 0.05}, {2, 0.06}, {3, 0.05}};  // a tie keeps the predicted order
  TuneLog log;
  const TuneResult r = tune::tune(three_plans(), &log, std::ref(runs), nullptr);
  CHECK(r.best == 0);
  CHECK(r.candidates[2].measured_rank == 2);
  CHECK(*r.regret == 0.0);
}

TEST_CASE("tune skips a candidate that fails and keeps its reason", "[tune]") {
  FakeRuns runs;
  runs.step_time_s = {{2, 0.09}, {3, 0.07}};  // #1 fails
  TuneLog log;
  const TuneResult r = tune::tune(three_plans(), &log, std::ref(runs), nullptr);
  CHECK(r.best == 2);
  CHECK_FALSE(r.candidates[0].measured_rank.has_value());
  CHECK(r.candidates[0].measurement.failure == "out of memory");
  CHECK_FALSE(r.candidates[0].relative_error().has_value());
  CHECK(r.candidates[1].measured_rank == 2);
  CHECK_FALSE(r.regret.has_value());  // the predicted first did not run
  const nlohmann::json tuned = tuned_to_json(r, {10, 2});
  CHECK(tuned.at("regret").is_null());
  CHECK(tuned.at("candidates")[0].at("failure") == "out of memory");
  CHECK(tuned.at("candidates")[0].at("measured_step_time_s").is_null());

  FakeRuns none;  // every candidate fails: nothing to write
  TuneLog empty;
  CHECK_THROWS_WITH(tune::tune(three_plans(), &empty, std::ref(none), nullptr),
                    Catch::StartsWith("no candidate ran (#1: out of memory; #2: out of memory"));
}

TEST_CASE("tune resumes: measured candidates are not run again", "[tune]") {
  const std::vector<Plan> plans = three_plans();
  const TuneSteps steps{4, 1};
  FakeRuns first;
  first.step_time_s = {{1, 0.10}, {2, 0.08}, {3, 0.12}};
  TuneLog log;
  log.setting = tune_setting(plans[0], steps);
  nlohmann::json saved;
  // Interrupted after the first two measurements: the file written then is what resumes.
  try {
    tune::tune(plans, &log, std::ref(first), [&](const TuneLog& so_far) {
      saved = tune_log_to_json(so_far);
      if (so_far.measurements.size() == 2) throw std::runtime_error("interrupted");
    });
  } catch (const std::runtime_error&) {
  }
  CHECK(saved.at("format") == "loom-tune/1");
  TuneLog resumed = tune_log_from_json(saved, "tune.json");
  CHECK_NOTHROW(check_tune_setting(resumed, tune_setting(plans[0], steps), "tune.json"));
  REQUIRE(resumed.measurements.size() == 2);
  CHECK(resumed.measurements[1].key == candidate_key(plans[1]));

  FakeRuns second;
  second.step_time_s = {{1, 1.0}, {2, 1.0}, {3, 0.11}};  // #1 and #2 must come from the file
  const TuneResult r = tune::tune(plans, &resumed, std::ref(second), nullptr);
  CHECK(second.measured == std::vector<int>{3});
  CHECK(r.candidates[0].resumed);
  CHECK_FALSE(r.candidates[2].resumed);
  CHECK(*r.candidates[0].measurement.step_time_s == 0.10);
  CHECK(r.best == 1);
  // (0.10 - 0.08) / 0.08 = 0.25.
  CHECK(*r.regret == Approx(0.25).epsilon(1e-12));
  CHECK(resumed.measurements.size() == 3);

  // Another setting (other steps) refuses the file.
  CHECK_THROWS_AS(check_tune_setting(resumed, tune_setting(plans[0], {10, 2}), "tune.json"),
                  InputError);
}

TEST_CASE("the resume file is read strictly", "[tune]") {
  const nlohmann::json both = {
      {"format", "loom-tune/1"},
      {"setting", "s"},
      {"measurements", {{{"key", "a"}, {"step_time_s", 0.1}, {"failure", "x"}}}}};
  CHECK_THROWS_WITH(tune_log_from_json(both, "t.json"),
                    Catch::Contains("$.measurements[0].step_time_s") &&
                        Catch::Contains("either a measured step_time_s or a failure"));
  const nlohmann::json twice = {
      {"format", "loom-tune/1"},
      {"setting", "s"},
      {"measurements", {{{"key", "a"}, {"step_time_s", 0.1}}, {{"key", "a"}, {"failure", "x"}}}}};
  CHECK_THROWS_WITH(tune_log_from_json(twice, "t.json"), Catch::Contains("appears twice"));
  const nlohmann::json other = {{"format", "loom-plan/1"}, {"setting", "s"}, {"measurements", {}}};
  CHECK_THROWS_AS(tune_log_from_json(other, "t.json"), InputError);
}
