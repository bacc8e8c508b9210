// Rank-to-device mapping on the topology graph.
//
// Ranks are numbered Megatron-style (tp fastest, then dp, then pp), so the innermost parallel
// group (tp, or dp when tp = 1, or pp when both are 1) holds consecutive ranks. On a regular node
// (one switch, every pair equal) rank r on device r is already best: tp groups share a node, pp
// neighbours come next and dp spans nodes. On an irregular node (declared links: NVLink pairs,
// PCIe between pairs) the devices of a node are grouped so that the innermost groups, all
// communicating at once, get the most bandwidth per ring hop (Topology::concurrent_rings, which
// follows the declared or measured link bandwidths). Every node uses the same pattern.
// Deterministic: ties keep the lowest device order, so a regular node maps r to r.
#pragma once

#include <vector>

#include "costmodel/strategy.hpp"
#include "profiles/topology.hpp"

namespace loom::planner {

// device_of_rank for `strategy` on `cluster`: element r is the cluster device index of rank r.
std::vector<int> map_ranks(const profiles::Topology& topology, const profiles::Cluster& cluster,
                           const costmodel::Strategy& strategy);

}  // namespace loom::planner
