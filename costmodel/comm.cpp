#include "costmodel/comm.hpp"

#include <algorithm>
#include <stdexcept>

#include "costmodel/nccl.hpp"

namespace loom::costmodel {

double collective_time_s(Collective collective, double bytes, int ranks,
                         const profiles::PathMetrics& link) {
  if (bytes <= 0) return 0;
  if (collective != Collective::kP2p && ranks <= 1) return 0;
  if (link.fabric && collective != Collective::kP2p) {
    return nccl_time(collective, bytes, ranks, *link.fabric).total_s();
  }
  double alpha_s = link.latency_us * 1e-6;
  double beta_s_per_byte = 1.0 / (link.bandwidth_gbps * 1e9);
  double n = ranks;
  switch (collective) {
    case Collective::kAllReduce:
      return 2 * (n - 1) * alpha_s + 2 * (n - 1) / n * bytes * beta_s_per_byte;
    case Collective::kReduceScatter:
    case Collective::kAllGather:
      return (n - 1) * alpha_s + (n - 1) / n * bytes * beta_s_per_byte;
    case Collective::kP2p:
      return alpha_s + bytes * beta_s_per_byte;
  }
  return 0;
}

double overlapped_time_s(double compute_s, double communication_s, double slowdown) {
  if (compute_s <= 0) return std::max(0.0, communication_s);
  if (communication_s <= 0) return compute_s;
  if (communication_s >= compute_s * (1 + slowdown)) return communication_s;
  return compute_s + communication_s * slowdown / (1 + slowdown);
}

double overlap_slowdown(const profiles::Cluster& cluster) {
  if (cluster.device.kind == profiles::DeviceKind::kCpu) return 0;
  return cluster.overlap_slowdown.value_or(profiles::kDefaultOverlapSlowdown);
}

std::vector<std::vector<int>> rank_groups(int world, int size, int stride) {
  std::vector<std::vector<int>> groups;
  for (int r = 0; r < world; ++r) {
    if ((r / stride) % size != 0) continue;  // r is the base of its group
    std::vector<int> g;
    g.reserve(static_cast<std::size_t>(size));
    for (int i = 0; i < size; ++i) g.push_back(r + i * stride);
    groups.push_back(std::move(g));
  }
  return groups;
}

GroupLinks::GroupLinks(std::shared_ptr<const profiles::Topology> topology,
                       std::vector<int> device_of_rank)
    : topology_(std::move(topology)),
      device_of_rank_(std::move(device_of_rank)),
      mutex_(std::make_unique<std::mutex>()) {}

profiles::PathMetrics GroupLinks::group(int world, int size, int stride) const {
  std::lock_guard<std::mutex> lock(*mutex_);
  auto key = std::make_tuple(world, size, stride);
  auto it = cache_.find(key);
  if (it != cache_.end()) return it->second;
  if (world > static_cast<int>(device_of_rank_.size()) || world % (size * stride) != 0) {
    throw std::logic_error("GroupLinks: group shape does not tile the ranks");
  }
  auto groups = rank_groups(world, size, stride);
  for (auto& g : groups) {
    for (int& r : g) r = device_of_rank_[r];
  }
  profiles::PathMetrics m = topology_->concurrent_rings(groups);
  cache_.emplace(key, m);
  return m;
}

}  // namespace loom::costmodel
