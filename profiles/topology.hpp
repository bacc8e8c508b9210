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

// What NCCL's algorithms (costmodel/nccl.hpp) need to know about a group of GPU ranks that
// communicate while every other group of the same shape does too.
struct CollectiveFabric {
  int nodes = 1;           // the most nodes one group spans
  int ranks_per_node = 1;  // the most ranks of one group on one node
  // Bus bandwidth a ring reaches over its hops inside nodes and between nodes (GB/s): the hop's
  // share of the link (links shared equally by the hops crossing them) times the link class's
  // bus_bandwidth_gbps / bandwidth_gbps; +inf where the group has no such hop.
  double intra_bus_gbps = 0;
  double inter_bus_gbps = 0;
  // The share of the intra-node link a hop gets (1 = a link of its own), which scales NVLS.
  double intra_share = 1;
  double nvls_bandwidth_gbps = 0;  // NVLS all-reduce algorithm bandwidth; 0 = no NVLink SHARP
  bool nvlink = false;             // intra-node hops over NVLink (else PCIe) for NCCL's latencies
  double inter_latency_us = 0;     // the inter-node link class's latency (NCCL's network latency)
  double launch_us = 0;            // the cluster's collective_launch_us
  bool operator==(const CollectiveFabric&) const = default;
};

// What a route or a set of routes offers: the bandwidth each transfer gets (GB/s, per direction)
// and the latency of a hop (microseconds); for GPU clusters' rings, also what NCCL needs.
struct PathMetrics {
  double bandwidth_gbps = 0;
  double latency_us = 0;
  std::optional<CollectiveFabric> fabric;  // set by concurrent_rings on GPU clusters only
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
  // slowest hop gets and the largest hop latency. Rings of one device are ignored. On GPU clusters
  // the result also carries the rings' CollectiveFabric.
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
