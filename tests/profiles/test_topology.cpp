// Topology: routes, slowest links and concurrent rings over the built-in clusters.
#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <vector>

#include "profiles/errors.hpp"
#include "profiles/loader.hpp"
#include "profiles/topology.hpp"

using loom::profiles::PathMetrics;
using loom::profiles::Topology;

namespace {
// The shipped cluster with its links at their datasheet values (the `start` of each link
// parameter in its calibration record): the figures below are derived from the datasheets.
loom::profiles::Cluster datasheet_links(loom::profiles::Cluster c) {
  if (!c.calibration) return c;
  for (const auto& p : c.calibration->parameters) {
    if (p.name == "intra_node.bus_bandwidth_gbps") c.intra_node.bus_bandwidth_gbps = p.start;
    if (p.name == "intra_node.latency_us") c.intra_node.latency_us = p.start;
    if (p.name == "inter_node.bus_bandwidth_gbps" && c.inter_node) {
      c.inter_node->bus_bandwidth_gbps = p.start;
    }
    if (p.name == "inter_node.latency_us" && c.inter_node) c.inter_node->latency_us = p.start;
    if (p.name == "collective_launch_us") c.collective_launch_us = p.start;
  }
  return c;
}
Topology topology_of(const std::string& name) {
  return Topology(datasheet_links(loom::profiles::load_cluster(name)));
}
}  // namespace

TEST_CASE("dgx-a100-80g: names and nodes of the 32 GPUs", "[profiles][topology]") {
  Topology t = topology_of("dgx-a100-80g");
  REQUIRE(t.device_count() == 32);
  CHECK(t.device_name(0) == "node0/gpu0");
  CHECK(t.device_name(9) == "node1/gpu1");
  CHECK(t.device_name(31) == "node3/gpu7");
  CHECK(t.node_of(7) == 0);
  CHECK(t.node_of(8) == 1);
  CHECK(t.node_of(31) == 3);
  CHECK(t.find_device("node2/gpu5") == 21);
  CHECK_FALSE(t.find_device("node4/gpu0").has_value());
  CHECK_FALSE(t.find_device("node0/switch").has_value());  // a switch is not a device
}

TEST_CASE("dgx-a100-80g: routes inside and across nodes", "[profiles][topology]") {
  Topology t = topology_of("dgx-a100-80g");

  PathMetrics inside = t.route(0, 1);
  CHECK(inside.bandwidth_gbps == Approx(300));
  CHECK(inside.latency_us == Approx(3));
  CHECK(t.route(3, 7) == inside);
  CHECK(t.route(1, 0) == inside);

  PathMetrics across = t.route(0, 8);
  CHECK(across.bandwidth_gbps == Approx(200));
  CHECK(across.latency_us == Approx(3 + 8));
  CHECK(t.route(31, 2) == across);

  PathMetrics self = t.route(5, 5);
  CHECK(std::isinf(self.bandwidth_gbps));
  CHECK(self.latency_us == 0);
}

TEST_CASE("dgx-a100-80g: slowest link of a group", "[profiles][topology]") {
  Topology t = topology_of("dgx-a100-80g");
  CHECK(t.slowest_link({0, 1}).bandwidth_gbps == Approx(300));
  CHECK(t.slowest_link({0, 1}).latency_us == Approx(3));
  CHECK(t.slowest_link({0, 8}).bandwidth_gbps == Approx(200));
  CHECK(t.slowest_link({0, 8}).latency_us == Approx(11));
  CHECK(t.slowest_link({0, 1, 2, 3, 4, 5, 6, 7}).bandwidth_gbps == Approx(300));
  CHECK(t.slowest_link({0, 1, 2, 3, 4, 5, 6, 7, 8}).bandwidth_gbps == Approx(200));
  CHECK(std::isinf(t.slowest_link({4}).bandwidth_gbps));
}

TEST_CASE("dgx-a100-80g: concurrent rings share the links they cross", "[profiles][topology]") {
  Topology t = topology_of("dgx-a100-80g");

  SECTION("one ring over the 8 GPUs of node 0 runs at NVSwitch speed") {
    PathMetrics m = t.concurrent_rings({{0, 1, 2, 3, 4, 5, 6, 7}});
    CHECK(m.bandwidth_gbps == Approx(300));
    CHECK(m.latency_us == Approx(3));
  }

  SECTION("8 rings of one GPU per node share each node's uplink") {
    std::vector<std::vector<int>> rings;
    for (int i = 0; i < 8; ++i) rings.push_back({i, 8 + i, 16 + i, 24 + i});
    PathMetrics m = t.concurrent_rings(rings);
    CHECK(m.bandwidth_gbps == Approx(200.0 / 8));
    CHECK(m.latency_us == Approx(11));
    // Any one of those rings alone gets the whole uplink.
    CHECK(t.concurrent_rings({rings[3]}).bandwidth_gbps == Approx(200));
  }

  SECTION("one ring over all 32 GPUs in rank order crosses each uplink once per direction") {
    std::vector<int> ring;
    for (int i = 0; i < 32; ++i) ring.push_back(i);
    PathMetrics m = t.concurrent_rings({ring});
    CHECK(m.bandwidth_gbps == Approx(200));
    CHECK(m.latency_us == Approx(11));
  }

  SECTION("rings inside different nodes do not interfere") {
    PathMetrics m = t.concurrent_rings({{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}});
    CHECK(m.bandwidth_gbps == Approx(300));
  }

  SECTION("rings of one device are ignored") {
    CHECK(std::isinf(t.concurrent_rings({{3}}).bandwidth_gbps));
    CHECK(t.concurrent_rings({{3}, {0, 1}}).bandwidth_gbps == Approx(300));
  }
}

TEST_CASE("v100-16g-4x-nvlink: explicit NVLink pairs", "[profiles][topology]") {
  Topology t = topology_of("v100-16g-4x-nvlink");
  REQUIRE(t.device_count() == 4);

  PathMetrics pair = t.route(0, 1);
  CHECK(pair.bandwidth_gbps == Approx(50));
  CHECK(pair.latency_us == Approx(2));
  CHECK(t.route(2, 3).bandwidth_gbps == Approx(50));

  PathMetrics single = t.route(0, 2);
  CHECK(single.bandwidth_gbps == Approx(25));
  CHECK(single.latency_us == Approx(2));  // the direct link, not a detour through gpu1
  CHECK(t.route(1, 3).bandwidth_gbps == Approx(25));
  CHECK(t.route(0, 3).bandwidth_gbps == Approx(25));

  CHECK(t.slowest_link({0, 1}).bandwidth_gbps == Approx(50));
  CHECK(t.slowest_link({0, 1, 2, 3}).bandwidth_gbps == Approx(25));

  CHECK(t.find_device("node0/gpu3") == 3);
  CHECK_FALSE(t.find_device("node9/gpu0").has_value());
  CHECK_FALSE(t.find_device("node0/gpu4").has_value());
}

TEST_CASE("v100-32g-2x-pcie: two GPUs over PCIe", "[profiles][topology]") {
  Topology t = topology_of("v100-32g-2x-pcie");
  REQUIRE(t.device_count() == 2);
  PathMetrics m = t.route(0, 1);
  CHECK(m.bandwidth_gbps == Approx(15.75));
  CHECK(m.latency_us == Approx(10));
  CHECK(t.concurrent_rings({{0, 1}}).bandwidth_gbps == Approx(15.75));
}

TEST_CASE("a single-GPU cluster has one device and no routes to share", "[profiles][topology]") {
  Topology t = topology_of("h100-x1");
  CHECK(t.device_count() == 1);
  CHECK(t.find_device("node0/gpu0") == 0);
  CHECK(std::isinf(t.slowest_link({0}).bandwidth_gbps));
}

TEST_CASE("explicit links that name node0 only describe every node", "[profiles][topology]") {
  loom::profiles::Cluster c = loom::profiles::load_cluster("v100-16g-4x-nvlink");
  c = loom::profiles::with_nodes(c, 2, "--nodes");
  Topology t(c);
  REQUIRE(t.device_count() == 8);
  CHECK(t.route(4, 5).bandwidth_gbps == Approx(50));  // node1's gpu0-gpu1 pair
  CHECK(t.route(4, 6).bandwidth_gbps == Approx(25));
  // Across nodes: the ethernet fabric (12.5 GB/s) is the narrowest link.
  CHECK(t.route(0, 4).bandwidth_gbps == Approx(12.5));
  CHECK(t.slowest_link({0, 1, 4, 5}).bandwidth_gbps == Approx(12.5));
}

// With the shorthand, a cross-node route costs intra_node.latency_us + inter_node.latency_us
// (dgx-a100-80g: 3 + 8). The same cluster spelled with explicit node0 links charges both classes
// twice (device->nic and nic->fabric at full latency on each side): see the report.
TEST_CASE("explicit links and the shorthand agree on cross-node latency", "[profiles][topology]") {
  loom::profiles::Cluster shorthand = loom::profiles::load_cluster("v100-16g-4x-nvlink");
  shorthand.links.clear();
  shorthand = loom::profiles::with_nodes(shorthand, 2, "--nodes");
  loom::profiles::Cluster explicit_links =
      loom::profiles::with_nodes(loom::profiles::load_cluster("v100-16g-4x-nvlink"), 2, "--nodes");
  Topology a(shorthand);
  Topology b(explicit_links);
  CHECK(a.route(0, 4).latency_us == Approx(10 + 25));
  CHECK(b.route(0, 4).latency_us == Approx(a.route(0, 4).latency_us));
}
