// The NCCL collective model (costmodel/nccl.hpp) against published collective measurements:
// every row of a collectives file (the schema of bench/published/collectives.json) not marked
// doubtful, modelled on the cluster file its system maps to (bench/collectives/systems.json),
// with the GPUs and nodes of the row. Prints, per row, the measured and modelled bus bandwidth
// (nccl-tests' busbw), the algorithm and protocol the model picks and the error; per system, the
// median |error|. A row stating NCCL_NVLS_ENABLE=0 is modelled without NVLS. A row with a
// measured time is compared by time (bus bandwidth is inversely proportional to it; the
// published bus bandwidth of tiny messages is rounded to 0.00).
//
// Usage: bench_collectives COLLECTIVES_JSON [SYSTEMS_JSON]
//        (run from the repository root; SYSTEMS_JSON defaults to bench/collectives/systems.json)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "costmodel/comm.hpp"
#include "costmodel/nccl.hpp"
#include "profiles/errors.hpp"
#include "profiles/loader.hpp"
#include "profiles/topology.hpp"

using namespace loom;
using namespace loom::costmodel;
using nlohmann::json;

namespace {

struct System {
  std::string match;
  std::string name;
  std::string cluster;
};

json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InputError(path, "", "cannot be read");
  return json::parse(in);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

bool parse_collective(const std::string& text, Collective* out) {
  if (text == "all_reduce")
    *out = Collective::kAllReduce;
  else if (text == "all_gather")
    *out = Collective::kAllGather;
  else if (text == "reduce_scatter")
    *out = Collective::kReduceScatter;
  else
    return false;
  return true;
}

// The fabric of one group of all `gpus` GPUs of the system's cluster.
profiles::CollectiveFabric fabric_of(const System& system, int gpus) {
  profiles::Cluster c =
      profiles::with_devices(profiles::load_cluster(system.cluster), gpus, system.cluster);
  std::vector<int> identity(static_cast<std::size_t>(c.device_count()));
  std::iota(identity.begin(), identity.end(), 0);
  GroupLinks links(std::make_shared<const profiles::Topology>(c), identity);
  const profiles::PathMetrics m = links.group(gpus, gpus, 1);
  if (!m.fabric) throw InputError(system.cluster, "device.kind", "expected a GPU cluster");
  return *m.fabric;
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc < 2) {
    std::fprintf(stderr, "usage: bench_collectives COLLECTIVES_JSON [SYSTEMS_JSON]\n");
    return 2;
  }
  const json rows = read_json(argv[1]).at("rows");
  const json systems_json =
      read_json(argc > 2 ? argv[2] : "bench/collectives/systems.json").at("systems");
  std::vector<System> systems;
  for (const json& s : systems_json) {
    systems.push_back({s.at("match"), s.at("name"), s.at("cluster")});
  }
  std::map<std::string, std::vector<double>> errors;  // by system name, in order of appearance
  std::vector<std::string> order;
  std::printf("%-24s %-14s %4s %5s %12s %-22s %-15s %9s %9s %7s\n", "system", "collective", "gpus",
              "nodes", "bytes", "published algorithm", "model", "busbw", "model", "error");
  int skipped = 0;
  for (const json& r : rows) {
    const std::string text = r.at("system");
    if (r.value("doubtful", false)) {
      ++skipped;
      continue;
    }
    auto sys = std::find_if(systems.begin(), systems.end(), [&](const System& s) {
      return text.find(s.match) != std::string::npos;
    });
    Collective c{};
    if (sys == systems.end() || !r.contains("gpus") || !parse_collective(r.at("collective"), &c)) {
      std::printf("not modelled (no system, GPU count or known collective): %s\n", text.c_str());
      continue;
    }
    const int gpus = r.at("gpus");
    const double bytes = r.at("bytes");
    const std::string algorithm = r.value("algorithm", "");
    profiles::CollectiveFabric f = fabric_of(*sys, gpus);
    if (algorithm.find("NCCL_NVLS_ENABLE=0") != std::string::npos) f.nvls_bandwidth_gbps = 0;
    const NcclTime t = nccl_time(c, bytes, gpus, f);
    const double model_busbw = bus_bandwidth_gbps(c, bytes, gpus, t.total_s());
    const double measured_busbw = r.at("busbw_gbps");
    double error = 0;
    if (r.contains("time_us")) {
      error = r.at("time_us").get<double>() * 1e-6 / t.total_s() - 1;
    } else if (measured_busbw > 0) {
      error = model_busbw / measured_busbw - 1;
    } else {
      std::printf("not modelled (no time and zero bus bandwidth): %s\n", text.c_str());
      continue;
    }
    if (!errors.count(sys->name)) order.push_back(sys->name);
    errors[sys->name].push_back(std::abs(error));
    const std::string model = std::string(to_string(t.algorithm)) + "/" + to_string(t.protocol);
    std::printf("%-24s %-14s %4d %5d %12.0f %-22.22s %-15s %9.2f %9.2f %+6.1f%%\n",
                sys->name.c_str(), r.at("collective").get<std::string>().c_str(), gpus,
                r.value("nodes", 1), bytes, algorithm.c_str(), model.c_str(), measured_busbw,
                model_busbw, 100 * error);
  }
  std::printf("\nmedian |error| of bus bandwidth per system (%d doubtful rows left out):\n",
              skipped);
  std::vector<double> all;
  for (const std::string& name : order) {
    const std::vector<double>& e = errors[name];
    all.insert(all.end(), e.begin(), e.end());
    std::printf("  %-24s %3zu rows  %5.1f %%\n", name.c_str(), e.size(), 100 * median(e));
  }
  std::printf("  %-24s %3zu rows  %5.1f %%\n", "all", all.size(), 100 * median(all));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_collectives: %s\n", e.what());
  return 2;
}
