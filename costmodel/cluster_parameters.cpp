// Named cluster parameters and their boxes (cluster_parameters.hpp).
#include "costmodel/cluster_parameters.hpp"

#include <algorithm>
#include <cstdio>
#include <stdexcept>

#include "costmodel/compute.hpp"
#include "costmodel/process_memory.hpp"
#include "profiles/errors.hpp"

namespace loom::costmodel {

namespace {

using profiles::Cluster;

// The field `name` of `cluster` (a link's bus bandwidth defaults to its rate, the others to the
// cost model's defaults); both pointers null when the cluster has no such field.
struct Field {
  double* value = nullptr;                 // a plain double field
  std::optional<double>* maybe = nullptr;  // an optional field
  double fallback = 0;                     // the optional's value when absent
};

Field field(Cluster& c, const std::string& name) {
  const bool gpu = c.device.kind == profiles::DeviceKind::kGpu;
  const EfficiencyDefaults d;
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
  if (name == "device.flash_attention_2_efficiency") {
    return {nullptr, &c.device.flash_attention_2_efficiency,
            c.device.attention_efficiency.value_or(d.flash_attention)};
  }
  if (name == "device.fragmentation") {
    return {nullptr, &c.device.fragmentation, kFragmentationFraction};
  }
  if (name == "device.cuda_context_mib") {
    return {nullptr, &c.device.cuda_context_mib, kCudaContextBytes / (1 << 20)};
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

std::string number(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.6g", v);
  return text;
}

}  // namespace

double cluster_parameter(const Cluster& cluster, const std::string& name) {
  Cluster c = cluster;
  Field f = field(c, name);
  if (f.value) return *f.value;
  if (f.maybe) return f.maybe->value_or(f.fallback);
  throw std::invalid_argument("no cluster parameter " + name);
}

void set_cluster_parameter(Cluster& cluster, const std::string& name, double value) {
  Field f = field(cluster, name);
  if (f.value) {
    *f.value = value;
  } else if (f.maybe) {
    *f.maybe = value;
  } else {
    throw std::invalid_argument("no cluster parameter " + name);
  }
}

std::vector<ClusterParameter> cluster_parameters(const Cluster& c) {
  const bool gpu = c.device.kind == profiles::DeviceKind::kGpu;
  std::vector<ClusterParameter> out;
  auto add = [&](const std::string& name, ParameterKind kind, double lower, double upper,
                 double offset) {
    ClusterParameter p;
    p.name = name;
    p.kind = kind;
    p.value = cluster_parameter(c, name);
    p.lower = lower;
    p.upper = upper;
    p.offset = offset;
    out.push_back(p);
  };
  const auto hardware = ParameterKind::kHardware;
  const auto software = ParameterKind::kSoftware;
  // A time-like hardware value: half to twice the file's (up to 1 us where the file has 0).
  auto time_range = [&](const std::string& name, double offset) {
    const double v = cluster_parameter(c, name);
    add(name, hardware, 0.5 * v, std::max(2 * v, 1.0), offset);
  };
  auto bus = [&](const std::string& scope, const profiles::LinkClass& link) {
    const std::string name = scope + ".bus_bandwidth_gbps";
    const double v = cluster_parameter(c, name);
    add(name, hardware, 0.85 * v, std::max(v, std::min(1.1 * v, link.bandwidth_gbps)), 0);
  };
  if (gpu && c.device.sm_count > 0) {
    for (profiles::Precision p : profiles::kAllPrecisions) {
      const double ceiling = c.device.achievable_tflops.of(p);
      const double peak = c.device.peak_tflops.of(p);
      if (ceiling > 0) {
        add(std::string("device.achievable_tflops.") + profiles::to_string(p), hardware,
            0.9 * ceiling, std::max(ceiling, std::min(1.1 * ceiling, peak)), 0);
      }
    }
  } else {
    add("device.matrix_efficiency", software, 0.01, 1, 0);
  }
  add("device.memory_efficiency", software, 0.01, 1, 0);
  if (gpu) {
    add("device.attention_efficiency", software, 0.01, 1, 0);
    // Only where the file gives FlashAttention-2 its own rate (Hopper).
    if (c.device.flash_attention_2_efficiency) {
      add("device.flash_attention_2_efficiency", software, 0.01, 1, 0);
    }
    add("device.fragmentation", software, 0, 1, 0.01);
    add("device.cuda_context_mib", software, 0, 16384, 16);
    add("device.host_launch_us", software, 0, 1000, 1);
    add("device.host_pass_us", software, 0, 100000, 100);
    add("device.host_serial_fraction", software, 0, 1, 0.05);
  }
  bus("intra_node", c.intra_node);
  time_range("intra_node.latency_us", 1);
  if (c.inter_node) {
    bus("inter_node", *c.inter_node);
    time_range("inter_node.latency_us", 1);
  }
  if (gpu) {
    time_range("collective_launch_us", 1);
    add("overlap_slowdown", software, 0, 0.95, 0.05);
  }
  return out;
}

Cluster apply_calibration(const Cluster& cluster, const profiles::RuntimeCalibration& calibration,
                          const std::string& source) {
  if (calibration.device != cluster.device.name) {
    throw InputError(source, "$.device",
                     "the device of cluster " + cluster.name + " (" + cluster.device.name +
                         "), found \"" + calibration.device +
                         "\": a calibration serves the device model it was fitted on");
  }
  const std::vector<ClusterParameter> boxes = cluster_parameters(cluster);
  Cluster out = cluster;
  for (const auto& parameter : calibration.parameters) {
    const std::string& name = parameter.first;
    const double value = parameter.second;
    // A one-node cluster has no inter-node link for the calibration's figures to describe.
    if (!cluster.inter_node && name.rfind("inter_node.", 0) == 0) continue;
    auto box = std::find_if(boxes.begin(), boxes.end(),
                            [&](const ClusterParameter& p) { return p.name == name; });
    const std::string path = "$.parameters." + name;
    if (box == boxes.end()) {
      std::string names;
      for (const ClusterParameter& p : boxes) names += (names.empty() ? "" : ", ") + p.name;
      throw InputError(source, path, "a parameter of cluster " + cluster.name + " (" + names + ")");
    }
    // Written values are rounded to 4 significant digits: allow that much at the ends.
    const double slack = 1e-3 * std::max(std::abs(box->lower), std::abs(box->upper));
    if (value < box->lower - slack || value > box->upper + slack) {
      throw InputError(
          source, path,
          std::string(box->kind == ParameterKind::kHardware ? "a hardware value within "
                                                            : "a value within ") +
              "[" + number(box->lower) + ", " + number(box->upper) + "] on cluster " +
              cluster.name + ", found " + number(value));
    }
    set_cluster_parameter(out, name, value);
  }
  return out;
}

}  // namespace loom::costmodel
