#include <catch2/catch.hpp>
#include <memory>
#include <numeric>

#include "costmodel/comm.hpp"
#include "profiles/loader.hpp"

using namespace loom;
using namespace loom::costmodel;

TEST_CASE("alpha-beta times of ring collectives", "[comm]") {
  profiles::PathMetrics link{100, 5, std::nullopt};  // 100 GB/s, 5 us per hop
  const double bytes = 1e9;
  // allreduce over 8: 2*7*5us + 2*7/8 * 1e9 / 100e9 = 70 us + 17.5 ms.
  CHECK(collective_time_s(Collective::kAllReduce, bytes, 8, link) ==
        Approx(70e-6 + 0.0175).epsilon(1e-12));
  CHECK(collective_time_s(Collective::kReduceScatter, bytes, 8, link) ==
        Approx(35e-6 + 0.00875).epsilon(1e-12));
  CHECK(collective_time_s(Collective::kAllGather, bytes, 8, link) ==
        Approx(35e-6 + 0.00875).epsilon(1e-12));
  CHECK(collective_time_s(Collective::kP2p, bytes, 2, link) == Approx(5e-6 + 0.01).epsilon(1e-12));
  CHECK(collective_time_s(Collective::kAllReduce, bytes, 1, link) == 0);
  CHECK(collective_time_s(Collective::kAllReduce, 0, 8, link) == 0);
}

TEST_CASE("rank groups follow Megatron's order", "[comm]") {
  auto tp = rank_groups(16, 4, 1);
  REQUIRE(tp.size() == 4);
  CHECK(tp[1] == std::vector<int>{4, 5, 6, 7});
  auto dp = rank_groups(16, 2, 4);  // tp = 4, dp = 2, pp = 2
  REQUIRE(dp.size() == 8);
  CHECK(dp[0] == std::vector<int>{0, 4});
  CHECK(dp[4] == std::vector<int>{8, 12});
  auto pp = rank_groups(16, 2, 8);
  CHECK(pp[3] == std::vector<int>{3, 11});
}

TEST_CASE("group links on a DGX A100 cluster", "[comm][topology]") {
  profiles::Cluster c = profiles::load_cluster("dgx-a100-80g");  // 4 nodes x 8
  std::vector<int> identity(32);
  std::iota(identity.begin(), identity.end(), 0);
  GroupLinks links(std::make_shared<const profiles::Topology>(c), identity);
  // tp = 8 inside each node: NVSwitch.
  CHECK(links.group(32, 8, 1).bandwidth_gbps == Approx(300));
  // dp = 4 across nodes with tp = 8: eight rings share each node's 200 GB/s.
  CHECK(links.group(32, 4, 8).bandwidth_gbps == Approx(25));
  // dp = 32 over everything: one ring, each node's uplink carries one hop.
  CHECK(links.group(32, 32, 1).bandwidth_gbps == Approx(200));
  // dp = 2 inside a node (stride 4): NVSwitch again.
  CHECK(links.group(32, 2, 4).bandwidth_gbps == Approx(300));
}
