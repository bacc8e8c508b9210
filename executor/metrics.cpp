#include "executor/metrics.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <tuple>
#include <utility>
#include <vector>

#include "profiles/errors.hpp"

namespace loom::executor {

planner::MeasuredSteps summarize_metrics(const std::string& jsonl, const std::string& source,
                                         std::int64_t warmup_steps) {
  std::vector<double> times;
  std::vector<double> warm;  // steps after the warm-up
  // Phase samples in the lines' order: name, seconds, after the warm-up.
  std::vector<std::tuple<std::string, double, bool>> phases;
  auto median_of = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const std::size_t n = v.size();
    return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  };
  planner::MeasuredSteps out;
  std::istringstream in(jsonl);
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = "line " + std::to_string(number);
    // Ordered: phases_s keeps loom train's order.
    nlohmann::ordered_json value = nlohmann::ordered_json::parse(line, nullptr, false);
    if (value.is_discarded() || !value.is_object()) {
      throw InputError(source, where, "expected one JSON object per line");
    }
    auto number_field = [&](const char* key) -> std::optional<double> {
      auto it = value.find(key);
      if (it == value.end() || it->is_null()) return std::nullopt;
      if (!it->is_number() || it->get<double>() < 0) {
        throw InputError(source, where + ": " + key, "expected a non-negative number");
      }
      return it->get<double>();
    };
    if (auto t = number_field("step_time_s")) {
      times.push_back(*t);
      const auto step = number_field("step");
      const bool after_warmup = !step || *step > static_cast<double>(warmup_steps);
      if (after_warmup) warm.push_back(*t);
      if (auto it = value.find("phases_s"); it != value.end()) {
        if (!it->is_object()) {
          throw InputError(source, where + ": phases_s", "expected an object of seconds");
        }
        for (const auto& [name, seconds] : it->items()) {
          if (!seconds.is_number() || seconds.get<double>() < 0) {
            throw InputError(source, where + ": phases_s." + name,
                             "expected a non-negative number");
          }
          phases.emplace_back(name, seconds.get<double>(), after_warmup);
        }
      }
    }
    if (auto m = number_field("peak_memory_bytes")) {
      out.peak_memory_bytes = std::max(out.peak_memory_bytes.value_or(0), *m);
    }
    if (auto m = number_field("device_used_bytes")) {
      out.device_used_bytes = std::max(out.device_used_bytes.value_or(0), *m);
    }
  }
  if (times.empty()) throw InputError(source, "", "expected lines with a step_time_s, found none");
  // The same steps as the step time: those after the warm-up, when there are any.
  const bool only_warm = !warm.empty();
  if (only_warm) times = warm;
  out.steps = static_cast<std::int64_t>(times.size());
  out.median_step_time_s = median_of(times);
  std::vector<std::pair<std::string, std::vector<double>>> by_phase;
  for (const auto& sample : phases) {
    const std::string& name = std::get<0>(sample);
    if (only_warm && !std::get<2>(sample)) continue;
    auto it = std::find_if(by_phase.begin(), by_phase.end(),
                           [&](const auto& p) { return p.first == name; });
    if (it == by_phase.end()) it = by_phase.insert(by_phase.end(), {name, {}});
    it->second.push_back(std::get<1>(sample));
  }
  for (const auto& [name, samples] : by_phase) {
    out.median_phases_s.emplace_back(name, median_of(samples));
  }
  return out;
}

}  // namespace loom::executor
