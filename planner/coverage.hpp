// Coverage: the points of a plan's prediction that a measured profile (profiles/profile.hpp)
// answers. The cost model asks the measured profile (costmodel/measured_profile.hpp) for each layer
// kind at the plan's micro-batch, the rank's share of the sequence, tp shard, recomputation and CPU
// threads per rank (the points its terms record, costmodel/terms.hpp), for the optimizer step at
// those threads and the rank count's loop, and charges the collectives of the plan's dp, tp and pp
// groups with the links fitted to the profile. plan_points() lists those points (what `loom profile
// --for PLAN.json` measures); extrapolated_points() lists the ones the plan's profile did not
// measure, each with what it is derived from (what `loom plan`, `simulate` and `validate` print and
// the plan records as "extrapolated"). Neither changes a prediction.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "costmodel/measured_profile.hpp"
#include "planner/plan.hpp"

namespace loom::planner {

struct PlanPoints {
  // Each layer kind's query, with its name ("embedding", "encoder layer", "head").
  std::vector<std::pair<std::string, costmodel::LayerQuery>> layers;
  int threads = 1;    // CPU threads per rank (costmodel::threads_per_rank of the plan's cluster)
  bool flat = false;  // the optimizer's loop: flat buffers with several ranks
  // The distinct collectives of the step over groups of more than one rank (rank count, size and
  // scope; groups that send the same message joined as "dp+pp").
  std::vector<costmodel::LinkQuery> links;
};

PlanPoints plan_points(const Plan& plan);

// The points of plan_points() that plan.profile lacks, in the order layers, optimizer, links;
// empty for a plan without a profile. The tensor-parallel collectives of a layer whose answer
// was measured with them (tp_communication) are not asked for.
std::vector<costmodel::Extrapolation> extrapolated_points(const Plan& plan);

}  // namespace loom::planner
