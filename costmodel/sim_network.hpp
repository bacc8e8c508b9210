// The simulator's network: flows over the directed links of the cluster graph, and the flows a
// plan's collectives and transfers make. Internal to the simulator.
//
// Links are profiles::Topology's (device uplinks to a node switch and node uplinks to the fabric,
// or the explicit links, widest path first), the same graph and routes the closed forms use. A
// link's bandwidth is shared equally by the transfers crossing it at that moment (the rule of
// Topology::concurrent_rings); a flow moves at the rate of its narrowest share, and the rates of
// the flows that share a link with a flow are recomputed whenever it starts or ends.
//
// Symmetry: one flow stands for all of its copies (all dp or tp groups of a stage, every rank pair
// between two stages), so the links carry the load of every group, as GroupLinks accounts for it.
// A collective over rings of n ranks is one flow whose every ring hop carries the ring algorithm's
// bytes (all-reduce 2 (n-1)/n * bytes, reduce-scatter and all-gather (n-1)/n * bytes, p2p all of
// them), after the algorithm's latency (2 (n-1), n-1 or 1 hop latencies, the hop latency being the
// largest route latency of the flow). On GPU clusters a collective is NCCL's (nccl.hpp): the flow
// waits NCCL's latency term, then carries bytes that drain in NCCL's transfer time at the ring
// hops' bandwidth. Alone, a flow takes exactly collective_time_s() over the link GroupLinks gives
// its group.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "costmodel/comm.hpp"
#include "costmodel/sim_events.hpp"
#include "profiles/topology.hpp"

namespace loom::costmodel::sim {

// The bandwidth of every directed link of `topology`, by link index.
std::vector<double> link_capacities_bytes_per_s(const profiles::Topology& topology);

// A flow to play: `latency_s`, then `hop_bytes` across every hop of network shape `shape`.
struct FlowSpec {
  int shape = -1;
  double latency_s = 0;
  double hop_bytes = 0;
  bool empty() const { return shape < 0; }
};

// Flows over directed links. A shape lists the links a flow's copies cross, with how many copies
// cross each; every copy on a link gets capacity / (copies of all active flows on it), and a flow
// moves at its smallest share. A flow's rate changes only when a flow sharing one of its links
// starts or ends; then its progress is brought up to date and its drain event rescheduled (the old
// one goes stale through the version number).
class Network {
 public:
  using Shape = std::vector<std::pair<int, int>>;  // (link, copies)

  explicit Network(std::vector<double> capacity_bytes_per_s)
      : capacity_(std::move(capacity_bytes_per_s)),
        load_(capacity_.size(), 0),
        flows_on_(capacity_.size()) {}

  int add_shape(Shape shape);

  void resize(std::size_t tasks);

  // Starts moving `bytes` across every hop of `shape` for `task`.
  void start(int task, int shape, double bytes, double now_s, EventQueue& queue);

  // The flow of `task` has drained: frees its links.
  void finish(int task, double now_s, EventQueue& queue);

  bool is_current(int task, std::uint64_t version) const;

 private:
  struct Flow {
    int shape = -1;
    double remaining_bytes = 0;
    double rate_bytes_per_s = 0;
    double since_s = 0;
    std::uint64_t version = 0;
    bool active = false;
  };

  double rate_of(const Flow& f) const;

  // Re-rates every active flow that shares a link with `task`'s (and `task`'s own, if active).
  void update_sharers(int task, double now_s, EventQueue& queue);

  std::vector<double> capacity_;
  std::vector<int> load_;
  std::vector<std::vector<int>> flows_on_;
  std::vector<Shape> shapes_;
  std::vector<Flow> flows_;
  std::vector<std::uint64_t> mark_;
  std::uint64_t epoch_ = 0;
  std::vector<int> affected_;
};

enum class Group { kTensor, kData };

// Builds (and caches) the network shapes of a plan's collectives and transfers: every group of
// the stage, or every rank pair between two stages, as one flow.
// Compute tasks do not slow while a flow runs here; the analytical estimate charges that
// (overlap_slowdown(), comm.hpp) through the runtimes' exposure rules.
class Comms {
 public:
  Comms(const profiles::Topology& topology, Network& network, std::vector<int> device_of_rank,
        int dp, int tp, std::array<double, 4> factors)
      : factors_(factors),
        topology_(topology),
        network_(network),
        device_of_rank_(std::move(device_of_rank)),
        dp_(dp),
        tp_(tp),
        touched_count_(static_cast<std::size_t>(topology.link_count()), 0) {}

  // `count` collectives of `bytes` each over every `group` of `stage`, lumped into one flow.
  FlowSpec collective(Collective c, Group group, int stage, double bytes, double count = 1);

  // Every rank of stage `from` sends `bytes` to its peer of stage `to`.
  FlowSpec p2p(int from, int to, double bytes);

 private:
  struct ShapeInfo {
    int id = -1;
    double latency_s = 0;
    std::optional<profiles::CollectiveFabric> fabric;  // GPU clusters' collectives
    double bandwidth_bytes_per_s = 0;                  // a copy's rate when alone
  };

  const ShapeInfo& shape(int kind, int stage, int peer);

  std::array<double, 4> factors_;  // measured / modelled time, by Collective
  const profiles::Topology& topology_;
  Network& network_;
  std::vector<int> device_of_rank_;
  int dp_;
  int tp_;
  std::vector<int> touched_count_;
  std::map<std::tuple<int, int, int>, ShapeInfo> cache_;
};

}  // namespace loom::costmodel::sim
