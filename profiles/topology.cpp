#include "profiles/topology.hpp"

#include <algorithm>
#include <boost/graph/adjacency_list.hpp>
#include <limits>
#include <map>
#include <queue>
#include <tuple>

#include "profiles/errors.hpp"

namespace loom::profiles {
namespace {

struct VertexProps {
  std::string name;
  int node = -1;  // -1 for the inter-node fabric
};
struct EdgeProps {
  double bandwidth_gbps = 0;
  double latency_us = 0;
  int index = 0;  // dense edge index, for per-direction load counting
};
using Graph =
    boost::adjacency_list<boost::vecS, boost::vecS, boost::undirectedS, VertexProps, EdgeProps>;
using Vertex = boost::graph_traits<Graph>::vertex_descriptor;

// One step of a route: an edge crossed from `from` to the other end.
struct Hop {
  int edge = 0;
  bool forward = true;  // crossing from the edge's lower vertex to its higher vertex
};

constexpr double kInfinity = std::numeric_limits<double>::infinity();

}  // namespace

struct Topology::Impl {
  Graph graph;
  std::vector<std::pair<double, double>> edge_metrics;  // (bandwidth_gbps, latency_us) by index
  std::vector<std::pair<int, int>> edge_ends;           // (lower vertex, higher vertex)
  std::vector<bool> edge_inter;                         // the edge leaves a node
  // GPU clusters: what CollectiveFabric takes from the cluster file.
  bool gpu = false;
  CollectiveFabric fabric_template;
  double intra_efficiency = 1;
  double inter_efficiency = 1;
  std::vector<int> device_node;
  std::map<std::string, int> vertex_by_name;
  // routes[a][b]: the hops from device a to device b. Filled for all pairs (explicit links) or
  // computed on demand from the regular shape (shorthand).
  bool regular = true;
  int devices_per_node = 1;
  std::vector<int> node_switch;  // regular: the switch vertex of each node
  int fabric = -1;
  std::vector<std::vector<std::vector<Hop>>> routes;

  int add_vertex(const std::string& name, int node) {
    auto it = vertex_by_name.find(name);
    if (it != vertex_by_name.end()) return it->second;
    Vertex v = boost::add_vertex(VertexProps{name, node}, graph);
    vertex_by_name[name] = static_cast<int>(v);
    return static_cast<int>(v);
  }

  int add_edge(int a, int b, double bandwidth_gbps, double latency_us) {
    int index = static_cast<int>(edge_metrics.size());
    boost::add_edge(static_cast<Vertex>(a), static_cast<Vertex>(b),
                    EdgeProps{bandwidth_gbps, latency_us, index}, graph);
    edge_metrics.emplace_back(bandwidth_gbps, latency_us);
    edge_ends.emplace_back(std::min(a, b), std::max(a, b));
    const int node_a = graph[static_cast<Vertex>(a)].node;
    const int node_b = graph[static_cast<Vertex>(b)].node;
    edge_inter.push_back(node_a < 0 || node_b < 0 || node_a != node_b);
    return index;
  }

  Hop hop(int edge, int from) const { return Hop{edge, edge_ends[edge].first == from}; }

  std::vector<Hop> regular_route(int a, int b) const {
    if (a == b) return {};
    int na = device_node[a];
    int nb = device_node[b];
    // Edge indices in build order: device i's uplink is edge i; node k's fabric link follows.
    std::vector<Hop> out{hop(a, a)};
    if (na != nb) {
      int count = static_cast<int>(device_node.size());
      out.push_back(hop(count + na, node_switch[na]));
      out.push_back(hop(count + nb, fabric));
    }
    out.push_back(hop(b, node_switch[nb]));
    return out;
  }

  // Widest path (largest bottleneck bandwidth), then fewest hops, then lowest vertex numbers.
  std::string cluster_name;

  std::vector<std::vector<Hop>> widest_routes_from(int source) const {
    int n = static_cast<int>(boost::num_vertices(graph));
    std::vector<double> width(n, 0.0);
    std::vector<int> hops(n, std::numeric_limits<int>::max());
    std::vector<int> via_edge(n, -1);
    std::vector<int> via_vertex(n, -1);
    std::vector<bool> done(n, false);
    using Entry = std::tuple<double, int, int>;  // (-width, hops, vertex): smallest first
    std::priority_queue<Entry, std::vector<Entry>, std::greater<>> queue;
    width[source] = kInfinity;
    hops[source] = 0;
    queue.emplace(-kInfinity, 0, source);
    while (!queue.empty()) {
      auto [neg_width, h, v] = queue.top();
      queue.pop();
      if (done[v]) continue;
      done[v] = true;
      for (auto [e, end] = boost::out_edges(static_cast<Vertex>(v), graph); e != end; ++e) {
        int u = static_cast<int>(boost::target(*e, graph));
        double w = std::min(width[v], graph[*e].bandwidth_gbps);
        int uh = h + 1;
        if (w > width[u] || (w == width[u] && uh < hops[u])) {
          width[u] = w;
          hops[u] = uh;
          via_edge[u] = graph[*e].index;
          via_vertex[u] = v;
          queue.emplace(-w, uh, u);
        }
      }
    }
    int devices = static_cast<int>(device_node.size());
    std::vector<std::vector<Hop>> out(devices);
    for (int b = 0; b < devices; ++b) {
      if (b == source) continue;
      if (via_edge[b] < 0) {
        throw InputError("cluster \"" + cluster_name + "\"", "$.links",
                         "expected every device to be reachable; " + graph[b].name +
                             " cannot reach " + graph[source].name);
      }
      std::vector<Hop> path;
      for (int v = b; v != source; v = via_vertex[v])
        path.push_back(hop(via_edge[v], via_vertex[v]));
      std::reverse(path.begin(), path.end());
      out[b] = std::move(path);
    }
    return out;
  }

  std::vector<Hop> route_hops(int a, int b) const {
    return regular ? regular_route(a, b) : routes[a][b];
  }

  // The CollectiveFabric of `rings` whose hops are `all_hops`, with `load` ring hops per link.
  CollectiveFabric fabric_of(const std::vector<std::vector<int>>& rings,
                             const std::vector<std::vector<Hop>>& all_hops,
                             const std::vector<int>& load) const {
    CollectiveFabric f = fabric_template;
    f.intra_bus_gbps = kInfinity;
    f.inter_bus_gbps = kInfinity;
    f.intra_share = 1;
    for (const auto& ring : rings) {
      if (ring.size() < 2) continue;
      std::map<int, int> per_node;
      for (int d : ring) ++per_node[device_node[d]];
      f.nodes = std::max(f.nodes, static_cast<int>(per_node.size()));
      for (auto [node, count] : per_node) f.ranks_per_node = std::max(f.ranks_per_node, count);
    }
    for (const auto& hops : all_hops) {
      for (const Hop& h : hops) {
        const int copies = load[2 * h.edge + (h.forward ? 0 : 1)];
        const double share = edge_metrics[h.edge].first / copies;
        if (edge_inter[h.edge]) {
          f.inter_bus_gbps = std::min(f.inter_bus_gbps, share * inter_efficiency);
        } else {
          f.intra_bus_gbps = std::min(f.intra_bus_gbps, share * intra_efficiency);
          f.intra_share = std::min(f.intra_share, 1.0 / copies);
        }
      }
    }
    return f;
  }

  PathMetrics metrics(const std::vector<Hop>& hops) const {
    PathMetrics m{kInfinity, 0, std::nullopt};
    for (const Hop& h : hops) {
      m.bandwidth_gbps = std::min(m.bandwidth_gbps, edge_metrics[h.edge].first);
      m.latency_us += edge_metrics[h.edge].second;
    }
    return m;
  }
};

Topology::Topology(const Cluster& cluster) : impl_(std::make_unique<Impl>()) {
  validate_cluster(cluster, "cluster \"" + cluster.name + "\"");
  Impl& t = *impl_;
  t.cluster_name = cluster.name;
  t.gpu = cluster.device.kind == DeviceKind::kGpu;
  if (t.gpu) {
    auto efficiency = [](const LinkClass& l) {
      return l.bus_bandwidth_gbps ? *l.bus_bandwidth_gbps / l.bandwidth_gbps : 1.0;
    };
    t.intra_efficiency = efficiency(cluster.intra_node);
    if (cluster.inter_node) t.inter_efficiency = efficiency(*cluster.inter_node);
    CollectiveFabric& f = t.fabric_template;
    f.nvls_bandwidth_gbps = cluster.intra_node.nvls_bandwidth_gbps.value_or(0);
    auto nvlink = [](const std::string& kind) {
      return kind.rfind("nvlink", 0) == 0 || kind.rfind("nvswitch", 0) == 0;
    };
    f.nvlink = nvlink(cluster.intra_node.kind);
    for (const ExplicitLink& l : cluster.links) f.nvlink = f.nvlink || nvlink(l.kind);
    f.inter_latency_us = cluster.inter_node ? cluster.inter_node->latency_us : 0;
    f.launch_us = cluster.collective_launch_us.value_or(0);
  }
  int nodes = static_cast<int>(cluster.nodes);
  int per_node = static_cast<int>(cluster.devices_per_node);
  t.devices_per_node = per_node;
  for (int i = 0; i < nodes * per_node; ++i) {
    t.add_vertex(profiles::device_name(cluster, i), i / per_node);
    t.device_node.push_back(i / per_node);
  }
  t.regular = cluster.links.empty();
  if (t.regular) {
    for (int k = 0; k < nodes; ++k) {
      t.node_switch.push_back(t.add_vertex("node" + std::to_string(k) + "/switch", k));
    }
    for (int i = 0; i < nodes * per_node; ++i) {
      t.add_edge(i, t.node_switch[i / per_node], cluster.intra_node.bandwidth_gbps,
                 cluster.intra_node.latency_us / 2);
    }
    if (nodes > 1) {
      t.fabric = t.add_vertex("fabric", -1);
      for (int k = 0; k < nodes; ++k) {
        t.add_edge(t.node_switch[k], t.fabric, cluster.inter_node->bandwidth_gbps,
                   cluster.inter_node->latency_us / 2);
      }
    }
    return;
  }
  // Explicit links. Links that name only node0 endpoints describe every node alike.
  bool template_links = std::all_of(cluster.links.begin(), cluster.links.end(), [](const auto& l) {
    return l.a.rfind("node0/", 0) == 0 && l.b.rfind("node0/", 0) == 0;
  });
  auto endpoint = [&](const std::string& name, int node, std::size_t index) {
    std::string n = name;
    if (template_links) n = "node" + std::to_string(node) + name.substr(5);
    auto it = t.vertex_by_name.find(n);
    if (it != t.vertex_by_name.end()) return it->second;
    // Not a device: a switch, unless it looks like a device that does not exist.
    if (n.find("/gpu") != std::string::npos || n.find("/cpu") != std::string::npos) {
      throw InputError("cluster \"" + cluster.name + "\"", "$.links[" + std::to_string(index) + "]",
                       "names device \"" + n + "\", which is not one of the " +
                           std::to_string(nodes * per_node) + " devices (" +
                           profiles::device_name(cluster, 0) + " .. " +
                           profiles::device_name(cluster, nodes * per_node - 1) + ")");
    }
    int node_of = -1;
    if (n.rfind("node", 0) == 0) node_of = std::atoi(n.c_str() + 4);
    return t.add_vertex(n, node_of);
  };
  int copies = template_links ? nodes : 1;
  for (int k = 0; k < copies; ++k) {
    for (std::size_t i = 0; i < cluster.links.size(); ++i) {
      const ExplicitLink& l = cluster.links[i];
      t.add_edge(endpoint(l.a, k, i), endpoint(l.b, k, i), l.bandwidth_gbps, l.latency_us);
    }
  }
  if (nodes > 1) {
    t.fabric = t.add_vertex("fabric", -1);
    for (int k = 0; k < nodes; ++k) {
      std::string nic_name = "node" + std::to_string(k) + "/nic";
      bool declared = t.vertex_by_name.count(nic_name) > 0;
      int nic = t.add_vertex(nic_name, k);
      if (!declared) {
        for (int j = 0; j < per_node; ++j) {
          t.add_edge(k * per_node + j, nic, cluster.intra_node.bandwidth_gbps,
                     cluster.intra_node.latency_us / 2);
        }
      }
      t.add_edge(nic, t.fabric, cluster.inter_node->bandwidth_gbps,
                 cluster.inter_node->latency_us / 2);
    }
  }
  for (int a = 0; a < nodes * per_node; ++a) t.routes.push_back(t.widest_routes_from(a));
}

Topology::~Topology() = default;
Topology::Topology(Topology&&) noexcept = default;
Topology& Topology::operator=(Topology&&) noexcept = default;

int Topology::device_count() const { return static_cast<int>(impl_->device_node.size()); }

const std::string& Topology::device_name(int device) const {
  return impl_->graph[static_cast<Vertex>(device)].name;
}

int Topology::node_of(int device) const { return impl_->device_node.at(device); }

std::optional<int> Topology::find_device(const std::string& name) const {
  auto it = impl_->vertex_by_name.find(name);
  if (it == impl_->vertex_by_name.end() || it->second >= device_count()) return std::nullopt;
  return it->second;
}

PathMetrics Topology::route(int from, int to) const {
  return impl_->metrics(impl_->route_hops(from, to));
}

PathMetrics Topology::slowest_link(const std::vector<int>& devices) const {
  PathMetrics worst{kInfinity, 0, std::nullopt};
  for (std::size_t i = 0; i < devices.size(); ++i) {
    for (std::size_t j = 0; j < devices.size(); ++j) {
      if (devices[i] == devices[j]) continue;
      PathMetrics m = route(devices[i], devices[j]);
      if (m.bandwidth_gbps < worst.bandwidth_gbps ||
          (m.bandwidth_gbps == worst.bandwidth_gbps && m.latency_us > worst.latency_us)) {
        worst = m;
      }
    }
  }
  return worst;
}

PathMetrics Topology::concurrent_rings(const std::vector<std::vector<int>>& rings) const {
  const Impl& t = *impl_;
  std::vector<int> load(2 * t.edge_metrics.size(), 0);
  std::vector<std::vector<Hop>> all_hops;
  for (const auto& ring : rings) {
    if (ring.size() < 2) continue;
    for (std::size_t i = 0; i < ring.size(); ++i) {
      all_hops.push_back(t.route_hops(ring[i], ring[(i + 1) % ring.size()]));
      for (const Hop& h : all_hops.back()) ++load[2 * h.edge + (h.forward ? 0 : 1)];
    }
  }
  if (all_hops.empty()) return PathMetrics{kInfinity, 0, std::nullopt};
  PathMetrics out{kInfinity, 0, std::nullopt};
  for (const auto& hops : all_hops) {
    double latency = 0;
    for (const Hop& h : hops) {
      double share = t.edge_metrics[h.edge].first / load[2 * h.edge + (h.forward ? 0 : 1)];
      out.bandwidth_gbps = std::min(out.bandwidth_gbps, share);
      latency += t.edge_metrics[h.edge].second;
    }
    out.latency_us = std::max(out.latency_us, latency);
  }
  if (t.gpu) out.fabric = t.fabric_of(rings, all_hops, load);
  return out;
}

int Topology::link_count() const { return 2 * static_cast<int>(impl_->edge_metrics.size()); }

double Topology::link_bandwidth_gbps(int link) const {
  return impl_->edge_metrics.at(static_cast<std::size_t>(link / 2)).first;
}

std::vector<int> Topology::route_links(int from, int to) const {
  std::vector<int> out;
  if (from == to) return out;
  for (const Hop& h : impl_->route_hops(from, to)) out.push_back(2 * h.edge + (h.forward ? 0 : 1));
  return out;
}

}  // namespace loom::profiles
