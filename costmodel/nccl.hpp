// NCCL's collective algorithms on GPU clusters, timed as NCCL's own tuning model times them
// (src/graph/tuning.cc of github.com/NVIDIA/nccl: ncclTopoTuneModel and ncclTopoGetAlgoTime),
// with the bandwidths taken from the cluster file's measured bus-bandwidth ceilings.
//
// Algorithms: ring (every collective), tree (all-reduce over groups that span nodes: NCCL's double
// binary tree between nodes, a chain inside each node) and NVLS (NVLink SHARP, where the
// intra-node switch has it: all-reduce, all-gather and reduce-scatter inside a node; all-reduce
// across nodes as NVLS tree). Protocols: LL, LL128 (over NVLink only) and Simple. Each pair costs
//   launch + latency(algorithm, protocol, ranks, nodes) + bytes / algorithm bandwidth
// and NCCL runs the fastest pair for the message size, as its tuner does.
//
// Latency: NCCL's base latency per algorithm and protocol plus its per-step hardware latencies
// (NVLink, PCIe or network), times the ring's 2 (n-1) steps or the tree's depth; the inter-node
// link class's latency_us is NCCL's network latency (added twice for Simple, as NCCL's flush).
// Bandwidth: a ring's bus bandwidth is CollectiveFabric's (the link shares times the ceilings);
// LL gets half of it, LL128 0.92; algorithm bandwidth = bus bandwidth x n / (2 (n-1)) for
// all-reduce, x n / (n-1) for all-gather and reduce-scatter. A tree moves every byte across a
// node's NICs once each way (0.92 x 0.5 of its bus bandwidth, as NCCL models it, and NCCL's
// medium-size correction factors). NVLS runs at the fabric's nvls_bandwidth_gbps.
#pragma once

#include <string>

#include "costmodel/comm.hpp"
#include "profiles/topology.hpp"

namespace loom::costmodel {

enum class NcclAlgorithm { kRing, kTree, kNvls, kNvlsTree };
enum class NcclProtocol { kLl, kLl128, kSimple };
const char* to_string(NcclAlgorithm algorithm);
const char* to_string(NcclProtocol protocol);

// One algorithm and protocol's time for one collective call.
struct NcclTime {
  NcclAlgorithm algorithm = NcclAlgorithm::kRing;
  NcclProtocol protocol = NcclProtocol::kSimple;
  double latency_s = 0;   // launch + NCCL's latency term
  double transfer_s = 0;  // bytes / algorithm bandwidth
  double total_s() const { return latency_s + transfer_s; }
};

// The algorithm and protocol NCCL picks for `collective` (not kP2p) of `bytes` (the buffer of one
// rank, as nccl-tests counts it) over `ranks` ranks: the fastest of every candidate, the first in
// NCCL's order of preference among equals. Zero time for one rank or no bytes.
NcclTime nccl_time(Collective collective, double bytes, int ranks,
                   const profiles::CollectiveFabric& fabric);

// nccl-tests' bus bandwidth (GB/s) of a collective of `bytes` per rank taking `time_s`:
// bytes / time x 2 (n-1) / n for all-reduce, x (n-1) / n for all-gather and reduce-scatter.
double bus_bandwidth_gbps(Collective collective, double bytes, int ranks, double time_s);

}  // namespace loom::costmodel
