// Reading a training run's metrics.jsonl (docs/formats.md: one JSON object per line, written by
// `loom train --metrics`) into what `loom report` and `loom validate` print next to the
// prediction. LibTorch-free, in the executor's io library beside the data readers.
#pragma once

#include <cstdint>
#include <string>

#include "planner/report.hpp"

namespace loom::executor {

// Reads metrics JSON lines (blank lines skipped; evaluation lines have no step_time_s and are
// ignored). Throws InputError naming `source` and the line number for a line that is not a JSON
// object or whose step_time_s / peak_memory_bytes is not a non-negative number, and when no line
// has a step_time_s, or whose phases_s is not an object of non-negative numbers. The first
// `warmup_steps` steps are left out of the medians (when more were run).
planner::MeasuredSteps summarize_metrics(const std::string& jsonl, const std::string& source,
                                         std::int64_t warmup_steps = 0);

}  // namespace loom::executor
