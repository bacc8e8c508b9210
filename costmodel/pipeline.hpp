// Step time of pipeline schedules in closed form.
#pragma once

#include <cstdint>
#include <vector>

#include "costmodel/strategy.hpp"

namespace loom::costmodel {

// Time one micro-batch spends on one pipeline rank (all of its chunks), forward and backward.
struct StageTime {
  double forward_s = 0;
  double backward_s = 0;
  double total() const { return forward_s + backward_s; }
};

// Time of one step's pipeline with m micro-batches, T_r = forward + backward of rank r:
//   gpipe, 1f1b:  sum_r T_r + (m - 1) max_r T_r          (uniform: (m + p - 1) T)
//   interleaved:  m max_r T_r + (sum_r T_r - max_r T_r) / v   (uniform: m T + (p - 1) T / v)
// so the bubble over the ideal m max_r T_r is (p - 1)/m and (p - 1)/(v m) for uniform stages
// (Narayanan et al. 2021, sections 2.2 and 2.2.1).
double pipeline_time_s(const std::vector<StageTime>& ranks, std::int64_t micro_batches,
                       Schedule schedule, int virtual_stages);

// (pipeline time - ideal) / ideal with ideal = m * max_r T_r.
double bubble_fraction(const std::vector<StageTime>& ranks, std::int64_t micro_batches,
                       Schedule schedule, int virtual_stages);

}  // namespace loom::costmodel
