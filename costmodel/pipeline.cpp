#include "costmodel/pipeline.hpp"

#include <algorithm>

namespace loom::costmodel {

double pipeline_time_s(const std::vector<StageTime>& ranks, std::int64_t micro_batches,
                       Schedule schedule, int virtual_stages) {
  double sum = 0;
  double slowest = 0;
  for (const StageTime& r : ranks) {
    sum += r.total();
    slowest = std::max(slowest, r.total());
  }
  auto m = static_cast<double>(micro_batches);
  if (schedule == Schedule::kInterleaved) return m * slowest + (sum - slowest) / virtual_stages;
  return sum + (m - 1) * slowest;
}

double bubble_fraction(const std::vector<StageTime>& ranks, std::int64_t micro_batches,
                       Schedule schedule, int virtual_stages) {
  double slowest = 0;
  for (const StageTime& r : ranks) slowest = std::max(slowest, r.total());
  double ideal = static_cast<double>(micro_batches) * slowest;
  if (ideal <= 0) return 0;
  return pipeline_time_s(ranks, micro_batches, schedule, virtual_stages) / ideal - 1;
}

}  // namespace loom::costmodel
