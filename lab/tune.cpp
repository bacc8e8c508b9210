#include "lab/tune.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "profiles/errors.hpp"
#include "profiles/json_reader.hpp"

namespace loom::tune {

namespace {

constexpr const char* kFormat = "loom-tune/1";

// The stage partition as "0-2,3-5" (the --stages notation).
std::string stages_text(const std::vector<costmodel::StageRange>& stages) {
  std::string out;
  for (const costmodel::StageRange& r : stages) {
    out += (out.empty() ? "" : ",") + std::to_string(r.first_layer) + "-" +
           std::to_string(r.last_layer);
  }
  return out;
}

nlohmann::json measurement_to_json(const TuneMeasurement& m) {
  nlohmann::json out = {{"key", m.key}};
  if (m.step_time_s) out["step_time_s"] = *m.step_time_s;
  if (m.peak_memory_bytes) out["peak_memory_bytes"] = *m.peak_memory_bytes;
  if (!m.failure.empty()) out["failure"] = m.failure;
  return out;
}

TuneMeasurement measurement_from_json(const nlohmann::json& value, const std::string& source,
                                      const std::string& path) {
  profiles::ObjectReader r(value, source, path);
  TuneMeasurement m;
  m.key = r.string("key");
  m.step_time_s = r.optional_number("step_time_s", 0, true);
  m.peak_memory_bytes = r.optional_number("peak_memory_bytes", 0, false);
  m.failure = r.optional_string("failure").value_or("");
  if (m.step_time_s.has_value() == !m.failure.empty()) {
    r.fail("step_time_s", "either a measured step_time_s or a failure, not both or neither");
  }
  r.finish();
  return m;
}

}  // namespace

const TuneMeasurement* TuneLog::find(const std::string& key) const {
  for (const TuneMeasurement& m : measurements) {
    if (m.key == key) return &m;
  }
  return nullptr;
}

std::string candidate_key(const Plan& plan) {
  return costmodel::describe(plan.strategy) + " stages=" + stages_text(plan.stages);
}

std::string tune_setting(const Plan& plan, const TuneSteps& steps) {
  return plan.model.name + " (" + std::to_string(plan.model.layers) + " layers, hidden " +
         std::to_string(plan.model.hidden) + ") on " + plan.cluster.name + " (" +
         std::to_string(plan.cluster.device_count()) + " devices), job " +
         costmodel::job_to_json(plan.job).dump() + ", " + std::to_string(steps.steps) + " steps, " +
         std::to_string(steps.warmup_steps) + " warm-up";
}

void check_tune_setting(const TuneLog& log, const std::string& setting, const std::string& source) {
  if (log.setting != setting) {
    throw InputError(source, "$.setting",
                     "the measurements of this tune (" + setting + "), found those of " +
                         log.setting + ": give another --resume file");
  }
}

nlohmann::json tune_log_to_json(const TuneLog& log) {
  nlohmann::json out = {{"format", kFormat}, {"setting", log.setting}};
  out["measurements"] = nlohmann::json::array();
  for (const TuneMeasurement& m : log.measurements) {
    out["measurements"].push_back(measurement_to_json(m));
  }
  return out;
}

TuneLog tune_log_from_json(const nlohmann::json& value, const std::string& source) {
  profiles::ObjectReader r(value, source);
  r.expect_format("loom-tune");
  TuneLog log;
  log.setting = r.string("setting");
  const nlohmann::json& measurements = r.array("measurements");
  for (std::size_t i = 0; i < measurements.size(); ++i) {
    TuneMeasurement m =
        measurement_from_json(measurements[i], source, r.element_path("measurements", i));
    if (log.find(m.key) != nullptr) {
      throw InputError(source, r.element_path("measurements", i) + ".key",
                       "one measurement per candidate; \"" + m.key + "\" appears twice");
    }
    log.measurements.push_back(std::move(m));
  }
  r.finish();
  return log;
}

std::optional<double> TuneCandidate::relative_error() const {
  if (!measurement.step_time_s) return std::nullopt;
  return (plan.predicted.step_time_s - *measurement.step_time_s) / *measurement.step_time_s;
}

TuneResult tune(const std::vector<Plan>& plans, TuneLog* log, const TuneMeasure& measure,
                const TuneSaved& saved) {
  TuneResult result;
  for (std::size_t i = 0; i < plans.size(); ++i) {
    TuneCandidate c;
    c.plan = plans[i];
    c.predicted_rank = static_cast<int>(i) + 1;
    const std::string key = candidate_key(c.plan);
    if (const TuneMeasurement* known = log->find(key)) {
      c.measurement = *known;
      c.resumed = true;
    } else {
      c.measurement = measure(c.plan, c.predicted_rank);
      c.measurement.key = key;
      log->measurements.push_back(c.measurement);
      if (saved) saved(*log);
    }
    result.candidates.push_back(std::move(c));
  }
  std::vector<std::size_t> ran;
  std::string failures;
  for (std::size_t i = 0; i < result.candidates.size(); ++i) {
    const TuneCandidate& c = result.candidates[i];
    if (c.measurement.step_time_s) {
      ran.push_back(i);
    } else {
      failures += (failures.empty() ? "" : "; ") + std::string("#") +
                  std::to_string(c.predicted_rank) + ": " + c.measurement.failure;
    }
  }
  if (ran.empty()) throw std::runtime_error("no candidate ran (" + failures + ")");
  // Fastest first; equal times keep the predicted order.
  std::stable_sort(ran.begin(), ran.end(), [&](std::size_t a, std::size_t b) {
    return *result.candidates[a].measurement.step_time_s <
           *result.candidates[b].measurement.step_time_s;
  });
  for (std::size_t r = 0; r < ran.size(); ++r) {
    result.candidates[ran[r]].measured_rank = static_cast<int>(r) + 1;
  }
  result.best = ran.front();
  const double best_s = *result.candidates[result.best].measurement.step_time_s;
  if (const auto& first = result.candidates.front().measurement.step_time_s) {
    result.regret = (*first - best_s) / best_s;
  }
  return result;
}

nlohmann::json tuned_to_json(const TuneResult& result, const TuneSteps& steps) {
  const TuneCandidate& best = result.candidates.at(result.best);
  nlohmann::json out = {{"measured_step_time_s", *best.measurement.step_time_s},
                        {"predicted_step_time_s", best.plan.predicted.step_time_s},
                        {"predicted_rank", best.predicted_rank},
                        {"measured_rank", 1},
                        {"regret", nullptr},
                        {"steps", steps.steps},
                        {"warmup_steps", steps.warmup_steps}};
  if (result.regret) out["regret"] = *result.regret;
  out["candidates"] = nlohmann::json::array();
  for (const TuneCandidate& c : result.candidates) {
    nlohmann::json j = {{"predicted_rank", c.predicted_rank},
                        {"strategy", costmodel::strategy_to_json(c.plan.strategy)},
                        {"stages", stages_text(c.plan.stages)},
                        {"predicted_step_time_s", c.plan.predicted.step_time_s},
                        {"measured_step_time_s", nullptr},
                        {"measured_rank", nullptr},
                        {"relative_error", nullptr}};
    if (c.measurement.step_time_s) {
      j["measured_step_time_s"] = *c.measurement.step_time_s;
      j["measured_rank"] = *c.measured_rank;
      j["relative_error"] = *c.relative_error();
    }
    if (c.measurement.peak_memory_bytes) {
      j["measured_peak_memory_bytes"] = *c.measurement.peak_memory_bytes;
    }
    if (!c.measurement.failure.empty()) j["failure"] = c.measurement.failure;
    out["candidates"].push_back(std::move(j));
  }
  return out;
}

nlohmann::json tuned_plan_json(const TuneResult& result, const TuneSteps& steps) {
  nlohmann::json out = plan_to_json(result.candidates.at(result.best).plan);
  out["tuned"] = tuned_to_json(result, steps);
  return out;
}

}  // namespace loom::tune
