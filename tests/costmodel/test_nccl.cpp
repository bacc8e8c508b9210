// NCCL's algorithms on GPU clusters (costmodel/nccl.hpp), against numbers computed by hand from
// NCCL's tuning constants (src/graph/tuning.cc), and the alpha-beta ring kept on CPU clusters.
#include <catch2/catch.hpp>
#include <cmath>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>

#include "costmodel/comm.hpp"
#include "costmodel/nccl.hpp"
#include "profiles/errors.hpp"
#include "profiles/loader.hpp"
#include "profiles/topology.hpp"

using loom::costmodel::Collective;
using loom::costmodel::collective_time_s;
using loom::costmodel::GroupLinks;
using loom::costmodel::nccl_time;
using loom::costmodel::NcclAlgorithm;
using loom::costmodel::NcclProtocol;
using loom::costmodel::overlapped_time_s;
namespace profiles = loom::profiles;

namespace {

// `nodes` nodes of 8 GPUs: NVSwitch at 300 GB/s whose ring reaches 240 (0.8), InfiniBand at
// 200 GB/s per node whose ring reaches 180 (0.9) with 5 us latency; no launch cost.
profiles::Cluster nvswitch_cluster(int nodes) {
  profiles::Cluster c;
  c.name = "test-nvswitch";
  c.nodes = nodes;
  c.devices_per_node = 8;
  c.device.name = "gpu";
  c.device.memory_bytes = 1LL << 36;
  c.device.peak_tflops.bf16 = 312;
  c.device.memory_bandwidth_gbps = 2039;
  c.intra_node = {"nvswitch", 300, 3, 240, std::nullopt};
  c.inter_node = profiles::LinkClass{"infiniband", 200, 5, 180, std::nullopt};
  return c;
}

GroupLinks links_of(const profiles::Cluster& c) {
  std::vector<int> identity(static_cast<std::size_t>(c.device_count()));
  std::iota(identity.begin(), identity.end(), 0);
  return GroupLinks(std::make_shared<const profiles::Topology>(c), identity);
}

}  // namespace

TEST_CASE("a group's fabric: nodes, ranks per node and shared ceilings", "[nccl][comm]") {
  profiles::Cluster c = profiles::datasheet_cluster(
      profiles::load_cluster("dgx-a100-80g"));  // 300 -> 235, 200 -> 186
  c.nodes = 2;
  GroupLinks links = links_of(c);
  // dp = 2 across the nodes with tp = 8: the 8 rings share each node's NICs, one rank per node.
  profiles::PathMetrics dp = links.group(16, 2, 8);
  REQUIRE(dp.fabric);
  CHECK(dp.fabric->nodes == 2);
  CHECK(dp.fabric->ranks_per_node == 1);
  CHECK(dp.fabric->inter_bus_gbps == Approx(200.0 / 8 * 186 / 200));  // 23.25
  CHECK(dp.fabric->intra_bus_gbps == Approx(235));
  CHECK(dp.fabric->launch_us == 32);
  // One ring over all 16: each node's uplink carries one hop each way.
  profiles::PathMetrics all = links.group(16, 16, 1);
  CHECK(all.fabric->nodes == 2);
  CHECK(all.fabric->ranks_per_node == 8);
  CHECK(all.fabric->inter_bus_gbps == Approx(186));
  // tp = 8 inside a node: no inter-node hop.
  profiles::PathMetrics tp = links.group(16, 8, 1);
  CHECK(tp.fabric->nodes == 1);
  CHECK(std::isinf(tp.fabric->inter_bus_gbps));
  CHECK(tp.bandwidth_gbps == Approx(300));  // the raw share is unchanged
}

TEST_CASE("tree wins small all-reduces and ring large ones across four nodes", "[nccl]") {
  GroupLinks links = links_of(nvswitch_cluster(4));
  const profiles::PathMetrics m = links.group(32, 32, 1);
  REQUIRE(m.fabric);
  // 64 bytes. Tree LL: 6.8 + 2 ((8-1) 0.6 + log2(4) (5.0 + 5)) = 55.2 us; bus bandwidth
  // min(0.92 x 180 / 3.8, 20.4 LL cap) = 20.4, algorithm bandwidth 10.2 GB/s (correction 1.0).
  // Ring LL: 6.6 + (62 - 6) max(0.6, 1.0) + 6 (2.7 + 5) = 108.8 us.
  auto small = nccl_time(Collective::kAllReduce, 64, 32, *m.fabric);
  CHECK(small.algorithm == NcclAlgorithm::kTree);
  CHECK(small.protocol == NcclProtocol::kLl);
  CHECK(small.total_s() == Approx(55.2e-6 + 64 / 10.2e9).epsilon(1e-9));
  // 1 GiB. Ring Simple: bus 180, algorithm bandwidth 180 x 32 / 62 = 92.9 GB/s; latency
  // (8.4 + 56 x 3.4 + 6 (14 + 2 x 5)) x 1.4 (NCCL's inter-node ring plateau) = 479.92 us.
  // Tree Simple: 0.5 x 0.92 x 180 = 82.8 GB/s (NCCL's model beyond two nodes): slower.
  const double gib = 1073741824.0;
  auto large = nccl_time(Collective::kAllReduce, gib, 32, *m.fabric);
  CHECK(large.algorithm == NcclAlgorithm::kRing);
  CHECK(large.protocol == NcclProtocol::kSimple);
  CHECK(large.total_s() == Approx(479.92e-6 + gib / (180.0 * 32 / 62 * 1e9)).epsilon(1e-9));
  CHECK(collective_time_s(Collective::kAllReduce, gib, 32, m) == Approx(large.total_s()));
}

TEST_CASE("two nodes: tree wins at every size over 16 ranks, ring over one rank per node",
          "[nccl]") {
  GroupLinks links = links_of(nvswitch_cluster(2));
  const double gib = 1073741824.0;
  // 16 ranks: a tree moves each byte across a node's NICs once each way, a ring 2 (n-1)/n
  // times, so on two nodes (NCCL's model takes min(intra 240, 2 x inter 180) = 240) the tree's
  // 0.5 x 0.92 x 240 = 110.4 GB/s beats the ring's 180 x 16 / 30 = 96 GB/s; at 64 bytes its
  // latency 6.8 + 2 (7 x 0.6 + 1 x (5.0 + 5)) = 35.2 us beats the ring's
  // 6.6 + 28 x 1.0 + 2 (2.7 + 5) = 50.0 us; the tree LL's bus bandwidth 0.92 x 240 / 3.8 = 58.1
  // is capped at NCCL's 39 GB/s for two nodes, so 19.5 GB/s of algorithm bandwidth.
  const profiles::PathMetrics all = links.group(16, 16, 1);
  auto small = nccl_time(Collective::kAllReduce, 64, 16, *all.fabric);
  CHECK(small.algorithm == NcclAlgorithm::kTree);
  CHECK(small.total_s() == Approx(35.2e-6 + 64 / 19.5e9).epsilon(1e-9));
  auto large = nccl_time(Collective::kAllReduce, gib, 16, *all.fabric);
  CHECK(large.algorithm == NcclAlgorithm::kTree);
  CHECK(large.transfer_s == Approx(gib / 110.4e9).epsilon(1e-9));
  // dp = 2 with tp = 8: 8 rings share each node's NICs (25 GB/s each, 22.5 after the ceiling).
  // Ring Simple: 22.5 x 2 / 2 = 22.5 GB/s; tree: 0.5 x 0.92 x min(240, 2 x 22.5) = 20.7 GB/s.
  const profiles::PathMetrics dp = links.group(16, 2, 8);
  auto pair = nccl_time(Collective::kAllReduce, gib, 2, *dp.fabric);
  CHECK(pair.algorithm == NcclAlgorithm::kRing);
  CHECK(pair.transfer_s == Approx(gib / 22.5e9).epsilon(1e-9));
}

TEST_CASE("an H200 node runs NVLS for large all-reduces and ring LL for small", "[nccl]") {
  profiles::Cluster c = nvswitch_cluster(1);
  c.intra_node = {"nvswitch", 450, 3, 366, 272};
  c.inter_node.reset();
  GroupLinks links = links_of(c);
  const profiles::PathMetrics m = links.group(8, 8, 1);
  // NVLS: 25 us + bytes / 272 GB/s. Ring Simple: 8.4 + 14 x 3.4 = 56 us + bytes / (366 x 8/14).
  const double gib = 1073741824.0;
  auto large = nccl_time(Collective::kAllReduce, gib, 8, *m.fabric);
  CHECK(large.algorithm == NcclAlgorithm::kNvls);
  CHECK(large.total_s() == Approx(25e-6 + gib / 272e9).epsilon(1e-9));
  // Ring LL: 6.6 + 14 x 0.6 = 15 us + bytes / (0.5 x 366 x 8/14 GB/s): faster up to 1 MiB,
  // slower from 2 MiB on, where the measured node's NCCL switched too (RING/LL to NVLS/SIMPLE).
  auto tiny = nccl_time(Collective::kAllReduce, 32768, 8, *m.fabric);
  CHECK(tiny.algorithm == NcclAlgorithm::kRing);
  CHECK(tiny.protocol == NcclProtocol::kLl);
  CHECK(tiny.total_s() == Approx(15e-6 + 32768 / (183.0 * 8 / 14 * 1e9)).epsilon(1e-9));
  CHECK(nccl_time(Collective::kAllReduce, 1 << 20, 8, *m.fabric).algorithm == NcclAlgorithm::kRing);
  CHECK(nccl_time(Collective::kAllReduce, 2 << 20, 8, *m.fabric).algorithm == NcclAlgorithm::kNvls);
  // All-gather: NVLS gets 272 x (7/8)^2 = 208 GB/s, the ring 366 x 8/7 = 418: the ring.
  CHECK(nccl_time(Collective::kAllGather, gib, 8, *m.fabric).algorithm == NcclAlgorithm::kRing);
}

TEST_CASE("CPU clusters keep the alpha-beta ring", "[nccl][comm]") {
  profiles::Cluster c = profiles::load_cluster("local-cpu");  // 2 GB/s, 150 us loopback
  GroupLinks links = links_of(c);
  const profiles::PathMetrics m = links.group(2, 2, 1);
  CHECK(!m.fabric);
  // 2 (n-1) alpha + 2 (n-1)/n bytes / bw = 300 us + 1e6 / 2e9 s.
  CHECK(collective_time_s(Collective::kAllReduce, 1e6, 2, m) ==
        Approx(300e-6 + 1e6 / 2e9).epsilon(1e-12));
}

TEST_CASE("compute overlapped with communication slows by the cluster's fraction", "[nccl][comm]") {
  // 10 s of compute beside 4 s of communication at 25 % slowdown: the first 4 s do 3.2 s of
  // work, the remaining 6.8 s run alone: 10.8 s.
  CHECK(overlapped_time_s(10, 4, 0.25) == Approx(10.8));
  // Communication longer than the slowed compute (10 x 1.25 = 12.5 s) sets the span.
  CHECK(overlapped_time_s(10, 20, 0.25) == Approx(20));
  CHECK(overlapped_time_s(10, 4, 0) == Approx(10));
  CHECK(overlapped_time_s(0, 4, 0.25) == Approx(4));
  CHECK(overlapped_time_s(10, 0, 0.25) == Approx(10));
  // The cluster's figure on GPUs, the published default without one, none on CPUs.
  CHECK(loom::costmodel::overlap_slowdown(
            profiles::datasheet_cluster(profiles::load_cluster("dgx-a100-80g"))) == 0.189);
  CHECK(loom::costmodel::overlap_slowdown(nvswitch_cluster(1)) ==
        profiles::kDefaultOverlapSlowdown);
  CHECK(loom::costmodel::overlap_slowdown(profiles::load_cluster("local-cpu")) == 0);
}

TEST_CASE("the NCCL link fields round-trip and are checked", "[nccl][cluster]") {
  profiles::Cluster c = profiles::datasheet_cluster(profiles::load_cluster("dgx-h100"));
  CHECK(c.intra_node.bus_bandwidth_gbps == 366);
  CHECK(c.intra_node.nvls_bandwidth_gbps == 272);
  CHECK(c.inter_node->bus_bandwidth_gbps == 372);
  CHECK(c.collective_launch_us == 32);
  CHECK(c.overlap_slowdown == Approx(0.189));
  CHECK(profiles::cluster_from_json(profiles::cluster_to_json(c), "round trip") == c);
  nlohmann::json j = profiles::cluster_to_json(c);
  j["overlap_slowdown"] = 1.5;
  CHECK_THROWS_AS(profiles::cluster_from_json(j, "bad"), loom::InputError);
  j = profiles::cluster_to_json(c);
  j["intra_node"]["bus_bandwidth_gbps"] = 0;
  CHECK_THROWS_AS(profiles::cluster_from_json(j, "bad"), loom::InputError);
}
