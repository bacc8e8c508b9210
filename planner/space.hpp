// The search space: every strategy the search tries for a model on a cluster and a job, before
// recomputation (which the search walks itself, pruning by memory). The dimensions the user
// pinned (SearchOptions) hold one value; the others take every value that can work: tp over the
// divisors of the devices within a node that divide the heads and the MLP, cp where the runtime
// runs it (context_parallel_choices in space.cpp), pp up to the layer count, dp from the rest,
// ZeRO 0-3 when dp > 1, every micro-batch dividing a rank's samples,
// the schedules with their virtual stages, and sequence parallelism where it applies. On one CPU
// node (SearchOptions::fewer_cpu_ranks) also every divisor of its cores as the world size.
#pragma once

#include <string>
#include <vector>

#include "costmodel/strategy.hpp"
#include "planner/search.hpp"
#include "profiles/cluster.hpp"
#include "profiles/model_spec.hpp"

namespace loom::planner {

// Every candidate strategy, recomputation left at none, deterministic in order (all devices
// first). Strategies costmodel::check_strategy() refuses (also the job's runtime) are skipped;
// the first reason of any skip is kept in `first_refusal` for the error message when nothing is
// left.
std::vector<costmodel::Strategy> candidate_strategies(const profiles::ModelSpec& model,
                                                      const profiles::Cluster& cluster,
                                                      const costmodel::Job& job,
                                                      const SearchOptions& options,
                                                      std::string* first_refusal);

}  // namespace loom::planner
