#include "costmodel/nccl.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>

namespace loom::costmodel {
namespace {

using profiles::CollectiveFabric;

constexpr int kLl = 0;
constexpr int kLl128 = 1;
constexpr int kSimple = 2;
constexpr int kTree = 0;
constexpr int kRing = 1;
constexpr int kNvls = 2;
constexpr int kNvlsTree = 3;
constexpr int kNvlinkHw = 0;
constexpr int kPcieHw = 1;
constexpr int kNetHw = 2;

// NCCL's tuning constants (src/graph/tuning.cc, ncclTunerConstantsDefaults), microseconds:
// base latency by algorithm (tree, ring; NVLS has none) and protocol (LL, LL128, Simple) ...
constexpr double kBaseLatencyUs[2][3] = {{6.8, 14.0, 8.4}, {6.6, 14.0, 8.4}};
// ... and the hardware latency of one step by link (NVLink, PCIe, network), algorithm (tree,
// ring, NVLS, NVLS tree) and protocol.
constexpr double kHwLatencyUs[3][4][3] = {
    {{0.6, 1.25, 4.0}, {0.6, 1.9, 3.4}, {0, 0, 25}, {0, 0, 25}},
    {{1.0, 1.9, 4.0}, {1.0, 2.5, 5.7}, {0, 0, 0}, {0, 0, 0}},
    {{5.0, 8.5, 14}, {2.7, 4.0, 14.0}, {0, 0, 18}, {0, 0, 20.9}},
};
// LL's bus-bandwidth cap across 2 and more nodes (llMaxBws, x86 Intel hosts), GB/s.
constexpr double kLlMaxBusGbps2Nodes = 39.0;
constexpr double kLlMaxBusGbpsMoreNodes = 20.4;
// The tree's measured departure from its model at medium sizes (treeCorrectionFactor), by
// protocol and log2(bytes / 64) from 0 to 23.
constexpr double kTreeCorrection[3][24] = {
    {1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7,  .7,  .7,  .6,  .5,
     .4,  .4,  .5,  .6,  .7, .8, .9, 1.0, 1.0, 1.0, 1.0, 1.0},
    {1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7,  .6,  .6,
     .6,  .6,  .6,  .6,  .8,  .9, .9, .9, .9, 1.0, 1.0, 1.0},
    {.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5,
     .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9}};
// NCCL raises an inter-node Simple ring's latency by 1.4 (Ampere and later) once each channel's
// share of the buffer per rank reaches 64 bytes ("plateau effect of ring"); channels assumed: 8.
constexpr double kRingPlateau = 1.4;
constexpr double kAssumedChannels = 8;

// The candidates of one call, on the stack: the planner times collectives millions of times.
struct Candidates {
  std::array<NcclTime, 8> items;
  std::size_t count = 0;
  void push_back(const NcclTime& t) { items[count++] = t; }
};

int log2_floor(double x) { return x < 1 ? -1 : std::ilogb(x); }

struct Shape {
  Collective collective;
  double bytes;
  int n;
  const CollectiveFabric& f;
  bool all_reduce() const { return collective == Collective::kAllReduce; }
  int intra_hw() const { return f.nvlink ? kNvlinkHw : kPcieHw; }
  // NCCL's network latency of one step: the tree's when each node holds one rank.
  double inter_latency_us(int algorithm, int p) const {
    const int a = f.ranks_per_node == 1 && algorithm == kRing ? kTree : algorithm;
    return kHwLatencyUs[kNetHw][a][p] + f.inter_latency_us * (p == kSimple ? 2 : 1);
  }
  double ll_cap(double bus_gbps) const {
    if (f.nodes <= 1) return bus_gbps;
    return std::min(bus_gbps, f.nodes == 2 ? kLlMaxBusGbps2Nodes : kLlMaxBusGbpsMoreNodes);
  }
  NcclTime make(NcclAlgorithm a, int p, double latency_us, double algorithm_gbps) const {
    NcclTime t;
    t.algorithm = a;
    t.protocol = static_cast<NcclProtocol>(p);
    t.latency_s = (f.launch_us + latency_us) * 1e-6;
    t.transfer_s = bytes / (algorithm_gbps * 1e9);
    return t;
  }
};

void add_ring(const Shape& s, Candidates& out) {
  const CollectiveFabric& f = s.f;
  const double steps = s.all_reduce() ? 2.0 * (s.n - 1) : s.n - 1.0;
  const double inter_steps = f.nodes <= 1 ? 0 : (s.all_reduce() ? 2.0 : 1.0) * (f.nodes - 1);
  const double bus = std::min(f.intra_bus_gbps, f.inter_bus_gbps);
  for (int p : {kLl, kLl128, kSimple}) {
    if (p == kLl128 && !f.nvlink) continue;
    const double bus_p = p == kLl ? s.ll_cap(0.5 * bus) : p == kLl128 ? 0.92 * bus : bus;
    double intra_us = kHwLatencyUs[s.intra_hw()][kRing][p];
    if (f.nodes > 1) intra_us = std::max(intra_us, p == kSimple ? 3.0 : 1.0);  // net overhead
    double latency_us = kBaseLatencyUs[kRing][p] + (steps - inter_steps) * intra_us +
                        inter_steps * s.inter_latency_us(kRing, p);
    if (p == kSimple && f.nodes > 1 && s.all_reduce() && s.bytes / (kAssumedChannels * s.n) >= 64) {
      latency_us *= kRingPlateau;
    }
    out.push_back(s.make(NcclAlgorithm::kRing, p, latency_us, bus_p * s.n / steps));
  }
}

// All-reduce over nodes: a chain inside each node, NCCL's double binary tree between nodes. On
// two nodes NCCL's model takes the intra-node bandwidth; the NICs bound it at twice their ring
// bus bandwidth (a tree crosses them once each way per byte, a ring 2 (n-1)/n times).
void add_tree(const Shape& s, Candidates& out) {
  const CollectiveFabric& f = s.f;
  if (!s.all_reduce() || f.nodes < 2) return;
  const double bus =
      f.nodes <= 2 ? std::min(f.intra_bus_gbps, 2 * f.inter_bus_gbps) : f.inter_bus_gbps;
  const int log_size = log2_floor(s.bytes / 64);
  for (int p : {kLl, kLl128, kSimple}) {
    if (p == kLl128 && !f.nvlink) continue;
    double bus_p = 0.92 * bus;
    if (p == kLl) bus_p = s.ll_cap(bus_p / 3.8);
    if (p == kLl128) bus_p *= 120.0 / 128.0;
    double algorithm_gbps = 0.5 * bus_p;
    if (log_size >= 0 && log_size < 23) algorithm_gbps *= kTreeCorrection[p][log_size];
    const double latency_us = kBaseLatencyUs[kTree][p] +
                              2 * ((f.ranks_per_node - 1) * kHwLatencyUs[s.intra_hw()][kTree][p] +
                                   log2_floor(f.nodes) * s.inter_latency_us(kTree, p));
    out.push_back(s.make(NcclAlgorithm::kTree, p, latency_us, algorithm_gbps));
  }
}

// NVLink SHARP: the switch reduces (all-reduce) or multicasts; Simple protocol only. Inside a
// node every collective; across nodes all-reduce as NVLS tree (NVLS inside, a tree between).
void add_nvls(const Shape& s, Candidates& out) {
  const CollectiveFabric& f = s.f;
  if (f.nvls_bandwidth_gbps <= 0 || !f.nvlink || f.ranks_per_node < 2) return;
  const double nvls_gbps = f.nvls_bandwidth_gbps * f.intra_share;
  const double switch_us = kHwLatencyUs[kNvlinkHw][kNvls][kSimple];
  if (f.nodes == 1) {
    // NCCL's model: all-gather and reduce-scatter get half the all-reduce's bus bandwidth times
    // (n-1)/n, as their algorithm bandwidth.
    const double n = s.n;
    const double gbps = s.all_reduce() ? nvls_gbps : nvls_gbps * (n - 1) / n * (n - 1) / n;
    out.push_back(s.make(NcclAlgorithm::kNvls, kSimple, switch_us, gbps));
    return;
  }
  if (!s.all_reduce()) return;
  const double gbps = f.nodes <= 2 ? std::min(nvls_gbps, f.inter_bus_gbps)
                                   : std::min(nvls_gbps, 0.5 * f.inter_bus_gbps);
  const double latency_us =
      switch_us +
      2 * log2_floor(f.nodes) * (kHwLatencyUs[kNetHw][kNvlsTree][kSimple] + 2 * f.inter_latency_us);
  out.push_back(s.make(NcclAlgorithm::kNvlsTree, kSimple, latency_us, gbps));
}

}  // namespace

const char* to_string(NcclAlgorithm algorithm) {
  switch (algorithm) {
    case NcclAlgorithm::kRing:
      return "ring";
    case NcclAlgorithm::kTree:
      return "tree";
    case NcclAlgorithm::kNvls:
      return "nvls";
    case NcclAlgorithm::kNvlsTree:
      return "nvls_tree";
  }
  return "ring";
}

const char* to_string(NcclProtocol protocol) {
  switch (protocol) {
    case NcclProtocol::kLl:
      return "LL";
    case NcclProtocol::kLl128:
      return "LL128";
    case NcclProtocol::kSimple:
      return "Simple";
  }
  return "Simple";
}

namespace {

Candidates candidates(Collective collective, double bytes, int ranks,
                      const CollectiveFabric& fabric) {
  Candidates out;
  if (collective == Collective::kP2p || ranks <= 1 || bytes <= 0) return out;
  const Shape s{collective, bytes, ranks, fabric};
  add_tree(s, out);
  add_ring(s, out);
  add_nvls(s, out);
  return out;
}

}  // namespace

NcclTime nccl_time(Collective collective, double bytes, int ranks, const CollectiveFabric& fabric) {
  const Candidates c = candidates(collective, bytes, ranks, fabric);
  if (c.count == 0) return NcclTime{};
  const NcclTime* best = &c.items[0];
  for (std::size_t i = 1; i < c.count; ++i) {
    if (c.items[i].total_s() < best->total_s()) best = &c.items[i];
  }
  return *best;
}

double bus_bandwidth_gbps(Collective collective, double bytes, int ranks, double time_s) {
  const double n = ranks;
  const double factor = collective == Collective::kAllReduce ? 2 * (n - 1) / n : (n - 1) / n;
  return bytes / time_s / 1e9 * factor;
}

}  // namespace loom::costmodel
