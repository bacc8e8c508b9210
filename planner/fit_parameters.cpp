// The free parameters of a cluster and how a value reaches the cluster (fit.hpp).
#include <stdexcept>

#include "costmodel/compute.hpp"
#include "costmodel/process_memory.hpp"
#include "planner/fit.hpp"

namespace loom::fit {

namespace {

using profiles::Cluster;
using profiles::Precision;

// The field `name` of `cluster` (a link's bus bandwidth defaults to its rate, and the others to
// the cost model's defaults); nullptr and `fallback` untouched when the cluster has no such field.
struct Field {
  double* value = nullptr;                 // a plain double field
  std::optional<double>* maybe = nullptr;  // an optional field
  double fallback = 0;                     // the optional's value when absent
};

Field field(Cluster& c, const std::string& name) {
  const bool gpu = c.device.kind == profiles::DeviceKind::kGpu;
  const costmodel::EfficiencyDefaults d;
  const std::string ceilings = "device.achievable_tflops.";
  if (name.rfind(ceilings, 0) == 0) {
    if (auto p = profiles::parse_precision(name.substr(ceilings.size()))) {
      return {&c.device.achievable_tflops.at(*p), nullptr, 0};
    }
  }
  if (name == "device.matrix_efficiency") {
    return {nullptr, &c.device.matrix_efficiency, gpu ? d.gpu_matrix : d.cpu_matrix};
  }
  if (name == "device.memory_efficiency") {
    return {nullptr, &c.device.memory_efficiency, gpu ? d.gpu_memory : d.cpu_memory};
  }
  if (name == "device.attention_efficiency") {
    return {nullptr, &c.device.attention_efficiency, d.flash_attention};
  }
  if (name == "device.fragmentation") {
    return {nullptr, &c.device.fragmentation, costmodel::kFragmentationFraction};
  }
  if (name == "device.cuda_context_mib") {
    return {nullptr, &c.device.cuda_context_mib, costmodel::kCudaContextBytes / (1 << 20)};
  }
  if (name == "device.host_launch_us") {
    return {nullptr, &c.device.host_launch_us, d.gpu_host_launch_s * 1e6};
  }
  if (name == "device.host_pass_us") {
    return {nullptr, &c.device.host_pass_us, d.gpu_host_pass_s * 1e6};
  }
  if (name == "device.host_serial_fraction") {
    return {nullptr, &c.device.host_serial_fraction, d.gpu_host_serial_fraction};
  }
  for (auto [scope, link] :
       {std::pair<const char*, profiles::LinkClass*>{"intra_node", &c.intra_node},
        {"inter_node", c.inter_node ? &*c.inter_node : nullptr}}) {
    if (link == nullptr) continue;
    if (name == std::string(scope) + ".bus_bandwidth_gbps") {
      return {nullptr, &link->bus_bandwidth_gbps, link->bandwidth_gbps};
    }
    if (name == std::string(scope) + ".latency_us") return {&link->latency_us, nullptr, 0};
  }
  if (name == "collective_launch_us") return {nullptr, &c.collective_launch_us, 0};
  if (name == "overlap_slowdown") {
    return {nullptr, &c.overlap_slowdown, profiles::kDefaultOverlapSlowdown};
  }
  return {};
}

double current(Cluster& c, const std::string& name) {
  Field f = field(c, name);
  if (f.value) return *f.value;
  if (f.maybe) return f.maybe->value_or(f.fallback);
  throw std::invalid_argument("no cluster parameter " + name);
}

// The prior's centre: the value before any calibration, as the cluster's record keeps it.
double centre_of(const Cluster& c, const std::string& name, double start) {
  if (!c.calibration) return start;
  for (const profiles::CalibratedParameter& p : c.calibration->parameters) {
    if (p.name == name) return p.start;
  }
  return start;
}

}  // namespace

std::vector<ParameterSpec> free_parameters(const Cluster& cluster) {
  Cluster c = cluster;
  const bool gpu = c.device.kind == profiles::DeviceKind::kGpu;
  std::vector<ParameterSpec> out;
  auto add = [&](const std::string& name, double lower, double upper, double offset) {
    ParameterSpec p;
    p.name = name;
    p.start = current(c, name);
    p.centre = centre_of(c, name, p.start);
    p.lower = lower;
    p.upper = upper;
    p.offset = offset;
    out.push_back(p);
  };
  if (gpu && c.device.sm_count > 0) {
    for (Precision p : profiles::kAllPrecisions) {
      const double ceiling = c.device.achievable_tflops.of(p);
      if (ceiling > 0) {
        add(std::string("device.achievable_tflops.") + profiles::to_string(p),
            0.05 * c.device.peak_tflops.of(p), c.device.peak_tflops.of(p), 0);
      }
    }
  } else {
    add("device.matrix_efficiency", 0.01, 1, 0);
  }
  add("device.memory_efficiency", 0.01, 1, 0);
  if (gpu) {
    add("device.attention_efficiency", 0.01, 1, 0);
    add("device.fragmentation", 0, 1, 0.01);
    add("device.cuda_context_mib", 0, 16384, 16);
    add("device.host_launch_us", 0, 1000, 1);
    add("device.host_pass_us", 0, 100000, 100);
    add("device.host_serial_fraction", 0, 1, 0.05);
  }
  add("intra_node.bus_bandwidth_gbps", 0.01 * c.intra_node.bandwidth_gbps,
      c.intra_node.bandwidth_gbps, 0);
  add("intra_node.latency_us", 0, 1000, 1);
  if (c.inter_node) {
    add("inter_node.bus_bandwidth_gbps", 0.01 * c.inter_node->bandwidth_gbps,
        c.inter_node->bandwidth_gbps, 0);
    add("inter_node.latency_us", 0, 1000, 1);
  }
  if (gpu) {
    add("collective_launch_us", 0, 1000, 1);
    add("overlap_slowdown", 0, 0.95, 0.05);
  }
  return out;
}

Cluster with_parameters(const Cluster& cluster, const std::vector<ParameterSpec>& parameters,
                        const std::vector<double>& values) {
  Cluster c = cluster;
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    Field f = field(c, parameters[i].name);
    if (f.value) {
      *f.value = values[i];
    } else if (f.maybe) {
      *f.maybe = values[i];
    } else {
      throw std::invalid_argument("no cluster parameter " + parameters[i].name);
    }
  }
  return c;
}

}  // namespace loom::fit
