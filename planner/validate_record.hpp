// What a run of a plan measured, as `loom validate --json` records it in its "measured" object
// (docs/validate.md): the slowest rank's median step time, the largest peak, and each rank's
// figures. loom validate writes it with measured_run_to_json(); loom calibrate (lab/fit_runs.cpp)
// and loom tune read it with measured_run_from_json(), the one reader.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace loom::planner {

struct RankRun {
  int rank = 0;
  double step_time_s = 0;        // its median step time after the warm-up
  double peak_memory_bytes = 0;  // its allocator's peak (0: not recorded)
  std::vector<std::pair<std::string, double>>
      phases_s;  // each phase's median, in loom train's order
  bool operator==(const RankRun&) const = default;
};

struct MeasuredRun {
  double step_time_s = 0;        // the slowest rank's median step time after the warm-up
  double peak_memory_bytes = 0;  // the largest rank's allocator peak (0: not recorded)
  // The largest device_used_bytes of the ranks (CUDA runs: total minus free on the device).
  std::optional<double> device_used_bytes;
  std::int64_t steps = 0;         // steps run
  std::int64_t warmup_steps = 0;  // the first steps left out of the medians
  std::vector<RankRun> ranks;
  bool operator==(const MeasuredRun&) const = default;
};

// The "measured" object: bytes as integers, phases as an object of seconds.
nlohmann::json measured_run_to_json(const MeasuredRun& run);

// Reads `record`'s "measured" object. step_time_s must be a number > 0; peak_memory_bytes and
// device_used_bytes are optional and > 0 when present; steps, warmup_steps and ranks are optional
// (records written by hand often give the step time alone). Errors throw InputError naming
// `source` and `path`.measured.<field>.
MeasuredRun measured_run_from_json(const nlohmann::json& record, const std::string& source,
                                   const std::string& path = "$");

}  // namespace loom::planner
