// loom tune's logic, free of processes: the top K plans of the search are measured (by a
// function the caller gives: `loom tune` runs `loom validate`, tests give fake times), re-ranked
// by measured step time, and the measured best becomes the plan, with the regret the prediction
// alone would have had: (measured time of the predicted-first - measured best) / measured best.
//
// A candidate that fails to run (out of memory, refused) keeps its one-line reason and is left
// out of the ranking. The measurements so far are a resume file (`loom-tune/1`,
// docs/formats.md): after each measurement the caller saves it, and a tune that starts again
// with it measures only the candidates it lacks. Candidates are matched by candidate_key (the
// strategy and the stage partition); the file is refused for another job or measurement
// (tune_setting).
#pragma once

#include <cstddef>
#include <functional>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "planner/plan.hpp"

namespace loom::tune {

using planner::Plan;

// How candidates are measured: steps run and the first ones left out of the median.
struct TuneSteps {
  std::int64_t steps = 10;
  std::int64_t warmup_steps = 2;
};

// One candidate's measurement: its median step time and peak memory, or why it did not run.
struct TuneMeasurement {
  std::string key;                          // candidate_key of the plan measured
  std::optional<double> step_time_s;        // absent when it failed
  std::optional<double> peak_memory_bytes;  // when the run reported it
  std::string failure;                      // one line; empty when measured
};

// The resume file: the measurements so far of one setting.
struct TuneLog {
  std::string setting;  // tune_setting() of the tune that wrote it
  std::vector<TuneMeasurement> measurements;

  // The measurement of `key`, or null.
  const TuneMeasurement* find(const std::string& key) const;
};

// What identifies a candidate among the plans of one setting: its strategy and stages, as text.
std::string candidate_key(const Plan& plan);

// What measurements of `plan`'s candidates depend on: model, cluster, job and `steps`, as text.
std::string tune_setting(const Plan& plan, const TuneSteps& steps);

// Throws InputError (naming `source`, the resume file) unless `log` was written for `setting`.
void check_tune_setting(const TuneLog& log, const std::string& setting, const std::string& source);

nlohmann::json tune_log_to_json(const TuneLog& log);
// Reads a loom-tune/1 document; throws InputError naming `source` and the field.
TuneLog tune_log_from_json(const nlohmann::json& value, const std::string& source);

// One candidate after the tune: the plan (its prediction inside), its predicted rank (1 = the
// search's first) and its measurement.
struct TuneCandidate {
  Plan plan;
  int predicted_rank = 0;
  TuneMeasurement measurement;
  bool resumed = false;              // taken from the resume file, not measured now
  std::optional<int> measured_rank;  // 1 = fastest measured; absent when it failed

  // (predicted - measured) / measured step time; absent when it failed.
  std::optional<double> relative_error() const;
};

struct TuneResult {
  std::vector<TuneCandidate> candidates;  // in predicted order
  std::size_t best = 0;                   // index of the fastest measured candidate
  // (measured time of the predicted-first - measured best) / measured best; absent when the
  // predicted-first failed to run.
  std::optional<double> regret;
};

// Measures one candidate (`predicted_rank` 1-based); a failure is returned, not thrown.
using TuneMeasure = std::function<TuneMeasurement(const Plan& plan, int predicted_rank)>;
// Called after each new measurement with the log so far (to save it).
using TuneSaved = std::function<void(const TuneLog& log)>;

// Measures each of `plans` (the search's order) that `log` lacks, adding each measurement to
// `log` and calling `saved`, then ranks them by measured step time (ties: the predicted order).
// Throws std::runtime_error naming each failure when no candidate ran.
TuneResult tune(const std::vector<Plan>& plans, TuneLog* log, const TuneMeasure& measure,
                const TuneSaved& saved);

// The plan's "tuned" record (docs/formats.md): the measured best's measured step time and ranks,
// the regret, the steps, and every candidate with its prediction and measurement.
nlohmann::json tuned_to_json(const TuneResult& result, const TuneSteps& steps);

// The measured best as a loom-plan/1 document carrying the "tuned" record.
nlohmann::json tuned_plan_json(const TuneResult& result, const TuneSteps& steps);

}  // namespace loom::tune
