// Communication: the time of a collective over a group's links, the links a group of ranks runs
// over, and what overlapping communication costs the compute beside it.
//
// CPU clusters (Gloo) run alpha-beta rings. GPU clusters run NCCL: the links of a group carry a
// profiles::CollectiveFabric (Topology::concurrent_rings sets it) and collective_time_s then
// times the algorithm and protocol NCCL picks (costmodel/nccl.hpp).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "profiles/topology.hpp"

namespace loom::costmodel {

enum class Collective { kAllReduce, kReduceScatter, kAllGather, kP2p };

// Ring algorithms (Thakur et al. 2005; Patarasuk and Yuan 2009) over `ranks` ranks whose hops
// each get `link` (bandwidth per direction, latency per hop); `bytes` is the whole buffer:
//   allreduce:        2 (n-1) alpha + 2 (n-1)/n * bytes / bw
//   reduce-scatter,
//   all-gather:         (n-1) alpha +   (n-1)/n * bytes / bw
//   p2p:                      alpha +             bytes / bw
// One rank (or zero bytes) costs nothing. When `link.fabric` is set (GPU clusters) every
// collective but p2p takes NCCL's time instead (nccl_time in nccl.hpp).
double collective_time_s(Collective collective, double bytes, int ranks,
                         const profiles::PathMetrics& link);

// How long a compute span of `compute_s` seconds takes when NCCL kernels run beside it for
// `communication_s` seconds from its start, if compute slows by the fraction `slowdown` while
// both run (the cluster's overlap_slowdown; profiles::kDefaultOverlapSlowdown): the compute runs
// at 1 / (1 + slowdown) of its speed while communication lasts, so the span ends at
//   compute_s + communication_s * slowdown / (1 + slowdown)   when communication ends first,
//   communication_s                                           otherwise.
// The communication itself is not slowed. slowdown = 0 gives max(compute_s, communication_s).
double overlapped_time_s(double compute_s, double communication_s, double slowdown);

// The cluster's overlap_slowdown on GPUs (profiles::kDefaultOverlapSlowdown when absent); 0 on
// CPU clusters, whose Gloo collectives never overlap compute in Loom's model.
double overlap_slowdown(const profiles::Cluster& cluster);

// The link every group of a given shape gets when all groups of that shape communicate at once:
// ranks are numbered Megatron-style (tp fastest, then dp, then pp) and rank r runs on device
// `device_of_rank[r]`; a group of `size` ranks with `stride` holds ranks base + i * stride.
// Results are cached per shape; safe to call from several threads.
class GroupLinks {
 public:
  GroupLinks(std::shared_ptr<const profiles::Topology> topology, std::vector<int> device_of_rank);

  // The link of every group of `size` ranks with `stride` among the first `world` ranks.
  profiles::PathMetrics group(int world, int size, int stride) const;
  const profiles::Topology& topology() const { return *topology_; }
  const std::shared_ptr<const profiles::Topology>& shared_topology() const { return topology_; }
  const std::vector<int>& device_of_rank() const { return device_of_rank_; }

 private:
  std::shared_ptr<const profiles::Topology> topology_;
  std::vector<int> device_of_rank_;
  mutable std::unique_ptr<std::mutex> mutex_;
  mutable std::map<std::tuple<int, int, int>, profiles::PathMetrics> cache_;
};

// The groups of ranks of one shape over `world` ranks, each in rank order.
std::vector<std::vector<int>> rank_groups(int world, int size, int stride);

}  // namespace loom::costmodel
