#include "planner/mapping.hpp"

#include <numeric>

namespace loom::planner {

namespace {

// Enumerates the partitions of `devices` into groups of `size` (each group in increasing order,
// groups ordered by their first device) and keeps the one whose groups get the most bandwidth
// when they all communicate at once; the first best found wins ties.
class GroupSearch {
 public:
  GroupSearch(const profiles::Topology& topology, std::vector<int> devices, int size)
      : topology_(topology),
        devices_(std::move(devices)),
        size_(size),
        used_(devices_.size(), false) {}

  std::vector<std::vector<int>> best() {
    visit();
    return best_;
  }

 private:
  void visit() {
    std::size_t first = 0;
    while (first < used_.size() && used_[first]) ++first;
    if (first == used_.size()) {
      const double bw = topology_.concurrent_rings(current_).bandwidth_gbps;
      if (best_.empty() || bw > best_bandwidth_gbps_) {
        best_ = current_;
        best_bandwidth_gbps_ = bw;
      }
      return;
    }
    used_[first] = true;
    current_.push_back({devices_[first]});
    extend(first + 1);
    current_.pop_back();
    used_[first] = false;
  }

  void extend(std::size_t from) {
    if (static_cast<int>(current_.back().size()) == size_) {
      visit();
      return;
    }
    for (std::size_t i = from; i < used_.size(); ++i) {
      if (used_[i]) continue;
      used_[i] = true;
      current_.back().push_back(devices_[i]);
      extend(i + 1);
      current_.back().pop_back();
      used_[i] = false;
    }
  }

  const profiles::Topology& topology_;
  std::vector<int> devices_;
  int size_;
  std::vector<bool> used_;
  std::vector<std::vector<int>> current_;
  std::vector<std::vector<int>> best_;
  double best_bandwidth_gbps_ = 0;
};

// Beyond this many devices per node the enumeration is too large; such nodes are regular in
// practice (one NVSwitch) and keep rank r on device r.
constexpr int kMaxEnumeratedDevices = 8;

}  // namespace

std::vector<int> map_ranks(const profiles::Topology& topology, const profiles::Cluster& cluster,
                           const costmodel::Strategy& s) {
  const int world = s.world_size();
  std::vector<int> identity(static_cast<std::size_t>(world));
  std::iota(identity.begin(), identity.end(), 0);
  const int per_node = static_cast<int>(cluster.devices_per_node);
  const int dp = costmodel::gradient_view(s).dp;  // cp's ranks sit beside dp's (strategy.hpp)
  const int inner = s.tp > 1 ? s.tp : dp > 1 ? dp : s.pp;
  if (cluster.links.empty() || inner <= 1 || inner >= per_node || per_node % inner != 0 ||
      per_node > kMaxEnumeratedDevices || world % per_node != 0) {
    return identity;
  }
  std::vector<int> node0(static_cast<std::size_t>(per_node));
  std::iota(node0.begin(), node0.end(), 0);
  std::vector<int> pattern;
  for (const std::vector<int>& group : GroupSearch(topology, node0, inner).best()) {
    pattern.insert(pattern.end(), group.begin(), group.end());
  }
  std::vector<int> out(static_cast<std::size_t>(world));
  for (int r = 0; r < world; ++r) {
    out[static_cast<std::size_t>(r)] =
        (r / per_node) * per_node + pattern[static_cast<std::size_t>(r % per_node)];
  }
  return out;
}

}  // namespace loom::planner
