#include "costmodel/sim_network.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "costmodel/nccl.hpp"

namespace loom::costmodel::sim {

namespace {
constexpr double kInfinity = std::numeric_limits<double>::infinity();
}  // namespace

// The directed links of the cluster graph come from profiles::Topology (link_count,
// link_bandwidth_gbps, route_links), the same graph and routes the closed forms use.
std::vector<double> link_capacities_bytes_per_s(const profiles::Topology& topology) {
  std::vector<double> out(static_cast<std::size_t>(topology.link_count()));
  for (int l = 0; l < topology.link_count(); ++l) {
    out[static_cast<std::size_t>(l)] = topology.link_bandwidth_gbps(l) * 1e9;
  }
  return out;
}

int Network::add_shape(Shape shape) {
  shapes_.push_back(std::move(shape));
  return static_cast<int>(shapes_.size()) - 1;
}

void Network::resize(std::size_t tasks) {
  flows_.resize(tasks);
  mark_.resize(tasks, 0);
}

void Network::start(int task, int shape, double bytes, double now_s, EventQueue& queue) {
  Flow& f = flows_[static_cast<std::size_t>(task)];
  f.shape = shape;
  f.remaining_bytes = bytes;
  f.rate_bytes_per_s = 0;
  f.since_s = now_s;
  f.active = true;
  for (auto [link, copies] : shapes_[static_cast<std::size_t>(shape)]) {
    load_[static_cast<std::size_t>(link)] += copies;
    flows_on_[static_cast<std::size_t>(link)].push_back(task);
  }
  update_sharers(task, now_s, queue);
}

void Network::finish(int task, double now_s, EventQueue& queue) {
  Flow& f = flows_[static_cast<std::size_t>(task)];
  f.active = false;
  for (auto [link, copies] : shapes_[static_cast<std::size_t>(f.shape)]) {
    load_[static_cast<std::size_t>(link)] -= copies;
    auto& on = flows_on_[static_cast<std::size_t>(link)];
    auto it = std::find(on.begin(), on.end(), task);
    *it = on.back();
    on.pop_back();
  }
  update_sharers(task, now_s, queue);
}

bool Network::is_current(int task, std::uint64_t version) const {
  const Flow& f = flows_[static_cast<std::size_t>(task)];
  return f.active && f.version == version;
}

double Network::rate_of(const Flow& f) const {
  double rate = kInfinity;
  for (auto [link, copies] : shapes_[static_cast<std::size_t>(f.shape)]) {
    auto l = static_cast<std::size_t>(link);
    rate = std::min(rate, capacity_[l] / load_[l]);
  }
  return rate;
}

void Network::update_sharers(int task, double now_s, EventQueue& queue) {
  ++epoch_;
  affected_.clear();
  auto visit = [&](int t) {
    if (mark_[static_cast<std::size_t>(t)] == epoch_) return;
    mark_[static_cast<std::size_t>(t)] = epoch_;
    affected_.push_back(t);
  };
  if (flows_[static_cast<std::size_t>(task)].active) visit(task);
  for (auto [link, copies] : shapes_[static_cast<std::size_t>(flows_[task].shape)]) {
    for (int t : flows_on_[static_cast<std::size_t>(link)]) visit(t);
  }
  for (int t : affected_) {
    Flow& f = flows_[static_cast<std::size_t>(t)];
    double rate = rate_of(f);
    if (rate == f.rate_bytes_per_s) continue;  // its drain event still holds
    if (f.rate_bytes_per_s > 0) {
      f.remaining_bytes =
          std::max(0.0, f.remaining_bytes - f.rate_bytes_per_s * (now_s - f.since_s));
    }
    f.since_s = now_s;
    f.rate_bytes_per_s = rate;
    ++f.version;
    double drain_s = std::isinf(rate) ? now_s : now_s + f.remaining_bytes / rate;
    queue.push(drain_s, EventKind::kFlowDrain, t, f.version);
  }
}

FlowSpec Comms::collective(Collective c, Group group, int stage, double bytes, double count) {
  const int n = group == Group::kTensor ? tp_ : dp_;
  if (n <= 1 || bytes <= 0 || count <= 0) return {};
  const ShapeInfo& s = shape(group == Group::kTensor ? 0 : 1, stage, -1);
  const double f = factors_[static_cast<std::size_t>(c)];
  if (s.fabric) {
    const NcclTime t = nccl_time(c, bytes, n, *s.fabric);
    return FlowSpec{s.id, count * t.latency_s * f,
                    count * t.transfer_s * s.bandwidth_bytes_per_s * f};
  }
  double dn = n;
  double hops = c == Collective::kAllReduce ? 2 * (dn - 1) : dn - 1;
  double share = c == Collective::kAllReduce ? 2 * (dn - 1) / dn : (dn - 1) / dn;
  return FlowSpec{s.id, count * hops * s.latency_s * f, count * share * bytes * f};
}

FlowSpec Comms::p2p(int from, int to, double bytes) {
  if (bytes <= 0) return {};
  const ShapeInfo& s = shape(2, from, to);
  const double f = factors_[static_cast<std::size_t>(Collective::kP2p)];
  return FlowSpec{s.id, s.latency_s * f, bytes * f};
}

const Comms::ShapeInfo& Comms::shape(int kind, int stage, int peer) {
  auto key = std::make_tuple(kind, stage, peer);
  auto it = cache_.find(key);
  if (it != cache_.end()) return it->second;
  const int per_stage = dp_ * tp_;
  const int base = stage * per_stage;
  std::vector<std::pair<int, int>> hops;  // (rank, rank)
  std::vector<std::vector<int>> rings;    // devices
  auto ring = [&](const std::vector<int>& ranks) {
    if (ranks.size() < 2) return;
    std::vector<int> devices;
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      hops.emplace_back(ranks[i], ranks[(i + 1) % ranks.size()]);
      devices.push_back(device_of_rank_[static_cast<std::size_t>(ranks[i])]);
    }
    rings.push_back(std::move(devices));
  };
  if (kind == 0) {
    for (int d = 0; d < dp_; ++d) {
      std::vector<int> g(static_cast<std::size_t>(tp_));
      for (int i = 0; i < tp_; ++i) g[static_cast<std::size_t>(i)] = base + d * tp_ + i;
      ring(g);
    }
  } else if (kind == 1) {
    for (int t = 0; t < tp_; ++t) {
      std::vector<int> g(static_cast<std::size_t>(dp_));
      for (int i = 0; i < dp_; ++i) g[static_cast<std::size_t>(i)] = base + t + i * tp_;
      ring(g);
    }
  } else {
    for (int i = 0; i < per_stage; ++i) hops.emplace_back(base + i, peer * per_stage + i);
  }
  ShapeInfo info;
  double latency_us = 0;
  std::vector<int> touched;
  for (auto [ra, rb] : hops) {
    int a = device_of_rank_[static_cast<std::size_t>(ra)];
    int b = device_of_rank_[static_cast<std::size_t>(rb)];
    profiles::PathMetrics m = topology_.route(a, b);
    latency_us = std::max(latency_us, m.latency_us);
    for (int l : topology_.route_links(a, b)) {
      if (touched_count_[static_cast<std::size_t>(l)]++ == 0) touched.push_back(l);
    }
  }
  std::sort(touched.begin(), touched.end());
  Network::Shape loads;
  for (int l : touched) {
    loads.emplace_back(l, touched_count_[static_cast<std::size_t>(l)]);
    touched_count_[static_cast<std::size_t>(l)] = 0;
  }
  info.id = network_.add_shape(std::move(loads));
  info.latency_s = latency_us * 1e-6;
  if (!rings.empty()) {
    const profiles::PathMetrics m = topology_.concurrent_rings(rings);
    info.fabric = m.fabric;
    info.bandwidth_bytes_per_s = m.bandwidth_gbps * 1e9;
  }
  return cache_.emplace(key, info).first->second;
}

}  // namespace loom::costmodel::sim
