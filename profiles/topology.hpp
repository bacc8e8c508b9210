// Topology: a cluster's devices and links as a graph, and the link queries the cost model needs.
//
// Vertices are devices, per-node switches and the inter-node fabric; edges are full-duplex links
// with a per-direction bandwidth and a latency. Routes are shortest paths by hop count (ties
// broken by vertex order, so deterministic). Boost.Graph stays inside topology.cpp.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "profiles/cluster.hpp"

namespace loom::profiles {

// What a route or a set of routes offers: the bandwidth each transfer gets (GB/s, per direction)
// and the latency of a hop (microseconds).
struct PathMetrics {
  double bandwidth_gbps = 0;
  double latency_us = 0;
  bool operator==(const PathMetrics&) const = default;
};

class Topology {
 public:
  // Throws InputError when an explicit link names a device that does not exist or leaves a device
  // unreachable.
  explicit Topology(const Cluster& cluster);
  ~Topology();
  Topology(Topology&&) noexcept;
  Topology& operator=(Topology&&) noexcept;

  int device_count() const;
  const std::string& device_name(int device) const;
  int node_of(int device) const;
  std::optional<int> find_device(const std::string& name) const;

  // The route between two devices: its narrowest link's bandwidth and the sum of its latencies.
  // A device to itself is infinitely fast (bandwidth +inf, latency 0).
  PathMetrics route(int from, int to) const;

  // The slowest link that any two of `devices` must use: the minimum bandwidth over all pairwise
  // routes, with that route's latency (the maximum latency if several tie).
  PathMetrics slowest_link(const std::vector<int>& devices) const;

  // Rings that run at the same time (each ring: devices in order, the last sends to the first).
  // Every directed link is shared equally by the ring hops that cross it; returns the bandwidth the
  // slowest hop gets and the largest hop latency. Rings of one device are ignored.
  PathMetrics concurrent_rings(const std::vector<std::vector<int>>& rings) const;

  // Directed links, for models that share bandwidth link by link (the simulator): link 2e crosses
  // edge e from its lower vertex to its higher, 2e + 1 the other way; each direction has the
  // edge's bandwidth. route_links lists the links of route(from, to), in order (none to itself).
  int link_count() const;
  double link_bandwidth_gbps(int link) const;
  std::vector<int> route_links(int from, int to) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace loom::profiles
