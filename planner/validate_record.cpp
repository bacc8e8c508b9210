#include "planner/validate_record.hpp"

#include <cmath>
#include <nlohmann/json.hpp>

#include "profiles/errors.hpp"
#include "profiles/json_reader.hpp"

namespace loom::planner {

namespace {

using nlohmann::json;

json phases_to_json(const std::vector<std::pair<std::string, double>>& phases) {
  json out = json::object();
  for (const auto& [name, seconds] : phases) out[name] = seconds;
  return out;
}

RankRun rank_from_json(const json& value, const std::string& source, const std::string& path) {
  profiles::ObjectReader r(value, source, path);
  RankRun out;
  out.rank = static_cast<int>(r.integer("rank", 0, profiles::ObjectReader::kIntMax));
  out.step_time_s = r.number("step_time_s", 0, false);
  out.peak_memory_bytes = r.optional_number("peak_memory_bytes", 0, false).value_or(0);
  if (r.has("phases_s")) {
    const json& phases = value.at("phases_s");
    if (!phases.is_object()) r.fail("phases_s", "expected an object of seconds per phase");
    for (const auto& [name, seconds] : phases.items()) {
      if (!seconds.is_number() || seconds.get<double>() < 0) {
        r.fail("phases_s", "expected a number >= 0 for phase \"" + name + "\"");
      }
      out.phases_s.emplace_back(name, seconds.get<double>());
    }
    r.skip("phases_s");
  }
  return out;
}

}  // namespace

json measured_run_to_json(const MeasuredRun& run) {
  json out = {{"step_time_s", run.step_time_s},
              {"peak_memory_bytes", std::llround(run.peak_memory_bytes)},
              {"steps", run.steps},
              {"warmup_steps", run.warmup_steps}};
  json ranks = json::array();
  for (const RankRun& r : run.ranks) {
    ranks.push_back({{"rank", r.rank},
                     {"step_time_s", r.step_time_s},
                     {"peak_memory_bytes", std::llround(r.peak_memory_bytes)},
                     {"phases_s", phases_to_json(r.phases_s)}});
  }
  out["ranks"] = ranks;
  if (run.device_used_bytes) out["device_used_bytes"] = std::llround(*run.device_used_bytes);
  return out;
}

MeasuredRun measured_run_from_json(const json& record, const std::string& source,
                                   const std::string& path) {
  profiles::ObjectReader top(record, source, path);
  profiles::ObjectReader r = top.object("measured");
  MeasuredRun out;
  out.step_time_s = r.number("step_time_s", 0, true);
  out.peak_memory_bytes = r.optional_number("peak_memory_bytes", 0, true).value_or(0);
  out.device_used_bytes = r.optional_number("device_used_bytes", 0, true);
  out.steps = r.optional_integer("steps", 0).value_or(0);
  out.warmup_steps = r.optional_integer("warmup_steps", 0).value_or(0);
  if (r.has("ranks")) {
    const json& ranks = r.array("ranks");
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      out.ranks.push_back(rank_from_json(ranks[i], source, r.element_path("ranks", i)));
    }
  }
  return out;
}

}  // namespace loom::planner
