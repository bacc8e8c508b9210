#include "profiles/cluster.hpp"

#include <nlohmann/json.hpp>
#include <sstream>

#include "profiles/errors.hpp"
#include "profiles/json_reader.hpp"

namespace loom::profiles {

const char* to_string(Precision precision) {
  switch (precision) {
    case Precision::kFp32:
      return "fp32";
    case Precision::kTf32:
      return "tf32";
    case Precision::kFp16:
      return "fp16";
    case Precision::kBf16:
      return "bf16";
    case Precision::kFp8:
      return "fp8";
  }
  return "fp32";
}

std::optional<Precision> parse_precision(const std::string& text) {
  if (text == "fp32") return Precision::kFp32;
  if (text == "tf32") return Precision::kTf32;
  if (text == "fp16") return Precision::kFp16;
  if (text == "bf16") return Precision::kBf16;
  if (text == "fp8") return Precision::kFp8;
  return std::nullopt;
}

namespace {

// The field of `rates` for `precision`, const or not as `rates` is.
template <typename Rates>
auto& rate_field(Rates& rates, Precision precision) {
  switch (precision) {
    case Precision::kFp32:
      return rates.fp32;
    case Precision::kTf32:
      return rates.tf32;
    case Precision::kFp16:
      return rates.fp16;
    case Precision::kBf16:
      return rates.bf16;
    case Precision::kFp8:
      return rates.fp8;
  }
  return rates.fp32;
}

}  // namespace

double PeakTflops::of(Precision precision) const { return rate_field(*this, precision); }

double& PeakTflops::at(Precision precision) { return rate_field(*this, precision); }

std::string device_name(const Cluster& cluster, std::int64_t index) {
  const char* kind = cluster.device.kind == DeviceKind::kCpu ? "cpu" : "gpu";
  return "node" + std::to_string(index / cluster.devices_per_node) + "/" + kind +
         std::to_string(index % cluster.devices_per_node);
}

namespace {

// The topology graph holds every device: far more than the largest clusters have (~10^5 GPUs) is
// a typo, and would not fit in memory.
constexpr std::int64_t kMaxDevices = 1'000'000;

double efficiency(ObjectReader& r, const std::string& key, std::optional<double>* out) {
  *out = r.optional_number(key, 0, /*exclusive=*/true);
  if (*out && **out > 1) r.fail(key, "expected a fraction in (0, 1]");
  return out->value_or(0);
}

LinkClass read_link_class(ObjectReader r) {
  LinkClass l;
  l.kind = r.string("kind");
  l.bandwidth_gbps = r.number("bandwidth_gbps", 0, /*exclusive=*/true);
  l.latency_us = r.number("latency_us", 0, /*exclusive=*/false);
  l.bus_bandwidth_gbps = r.optional_number("bus_bandwidth_gbps", 0, /*exclusive=*/true);
  l.nvls_bandwidth_gbps = r.optional_number("nvls_bandwidth_gbps", 0, /*exclusive=*/true);
  r.finish();
  return l;
}

nlohmann::json link_class_to_json(const LinkClass& l) {
  nlohmann::json j = {
      {"kind", l.kind}, {"bandwidth_gbps", l.bandwidth_gbps}, {"latency_us", l.latency_us}};
  if (l.bus_bandwidth_gbps) j["bus_bandwidth_gbps"] = *l.bus_bandwidth_gbps;
  if (l.nvls_bandwidth_gbps) j["nvls_bandwidth_gbps"] = *l.nvls_bandwidth_gbps;
  return j;
}

PeakTflops read_rates(ObjectReader p) {
  PeakTflops t;
  for (Precision precision : kAllPrecisions) {
    t.at(precision) = p.optional_number(to_string(precision), 0, false).value_or(0);
  }
  p.finish();
  return t;
}

nlohmann::json rates_to_json(const PeakTflops& t) {
  nlohmann::json p = nlohmann::json::object();
  for (Precision precision : kAllPrecisions) {
    if (t.of(precision) > 0) p[to_string(precision)] = t.of(precision);
  }
  return p;
}

// sm_count and achievable_tflops come together, and no achievable rate exceeds its peak.
template <typename Bad>
void validate_achievable(const DeviceSpec& d, const Bad& bad) {
  const PeakTflops& a = d.achievable_tflops;
  const bool any = a.any();
  if (d.sm_count < 0) bad("device.sm_count", "expected an integer >= 1");
  if (any && d.sm_count == 0) bad("device.sm_count", "required with device.achievable_tflops");
  if (!any && d.sm_count > 0) {
    bad("device.achievable_tflops", "required with device.sm_count (measured matrix rates)");
  }
  for (Precision p : kAllPrecisions) {
    if (a.of(p) > d.peak_tflops.of(p)) {
      std::ostringstream peak;
      peak << d.peak_tflops.of(p);
      bad(std::string("device.achievable_tflops.") + to_string(p),
          std::string("expected at most the peak (peak_tflops.") + to_string(p) + " = " +
              peak.str() + ")");
    }
  }
}

// An optional fraction in [0, 1] (device.fragmentation, device.host_serial_fraction).
std::optional<double> read_fraction(ObjectReader& d, const std::string& key) {
  auto out = d.optional_number(key, 0, /*exclusive=*/false);
  if (out && *out > 1) d.fail(key, "expected a fraction in [0, 1]");
  return out;
}

CalibratedParameter read_calibrated_parameter(ObjectReader p, const std::string& name) {
  CalibratedParameter out;
  out.name = name;
  out.start = p.number("start", 0, false);
  out.value = p.number("value", 0, false);
  out.uncertainty = p.optional_number("uncertainty", 0, /*exclusive=*/false);
  out.informed = p.optional_boolean("informed").value_or(true);
  out.fixed = p.optional_boolean("fixed").value_or(false);
  p.finish();
  return out;
}

}  // namespace

nlohmann::json calibration_to_json(const CalibrationRecord& c) {
  nlohmann::json j = {{"rows", c.rows}, {"files", c.files}, {"date", c.date}};
  auto put = [&](const char* key, const std::optional<double>& v) {
    if (v) j[key] = *v;
  };
  put("median_error_pct", c.median_error_pct);
  put("loo_median_error_pct", c.loo_median_error_pct);
  put("memory_median_error_pct", c.memory_median_error_pct);
  put("loo_memory_median_error_pct", c.loo_memory_median_error_pct);
  if (!c.transferred_from.empty()) j["transferred_from"] = c.transferred_from;
  nlohmann::json parameters = nlohmann::json::object();
  for (const CalibratedParameter& p : c.parameters) {
    nlohmann::json q = {{"start", p.start}, {"value", p.value}};
    if (p.uncertainty) q["uncertainty"] = *p.uncertainty;
    if (!p.informed) q["informed"] = false;
    if (p.fixed) q["fixed"] = true;
    parameters[p.name] = q;
  }
  j["parameters"] = parameters;
  return j;
}

Cluster datasheet_cluster(const Cluster& cluster) {
  Cluster c = cluster;
  if (!c.calibration) return c;
  const std::string ceilings = "device.achievable_tflops.";
  for (const CalibratedParameter& p : c.calibration->parameters) {
    if (p.value == p.start) continue;  // kept as it was (an absent optional stays absent)
    const std::string& n = p.name;
    if (n.rfind(ceilings, 0) == 0) {
      if (auto precision = parse_precision(n.substr(ceilings.size()))) {
        c.device.achievable_tflops.at(*precision) = p.start;
      }
    } else if (n == "device.matrix_efficiency") {
      c.device.matrix_efficiency = p.start;
    } else if (n == "device.memory_efficiency") {
      c.device.memory_efficiency = p.start;
    } else if (n == "device.attention_efficiency") {
      c.device.attention_efficiency = p.start;
    } else if (n == "device.flash_attention_2_efficiency") {
      c.device.flash_attention_2_efficiency = p.start;
    } else if (n == "device.fragmentation") {
      c.device.fragmentation = p.start;
    } else if (n == "device.cuda_context_mib") {
      c.device.cuda_context_mib = p.start;
    } else if (n == "device.host_launch_us") {
      c.device.host_launch_us = p.start;
    } else if (n == "device.host_pass_us") {
      c.device.host_pass_us = p.start;
    } else if (n == "device.host_serial_fraction") {
      c.device.host_serial_fraction = p.start;
    } else if (n == "collective_launch_us") {
      c.collective_launch_us = p.start;
    } else if (n == "overlap_slowdown") {
      c.overlap_slowdown = p.start;
    } else {
      for (auto [scope, link] : {std::pair<const char*, LinkClass*>{"intra_node", &c.intra_node},
                                 {"inter_node", c.inter_node ? &*c.inter_node : nullptr}}) {
        if (link == nullptr) continue;
        if (n == std::string(scope) + ".bus_bandwidth_gbps") link->bus_bandwidth_gbps = p.start;
        if (n == std::string(scope) + ".latency_us") link->latency_us = p.start;
      }
    }
  }
  c.calibration.reset();
  return c;
}

CalibrationRecord calibration_from_json(const nlohmann::json& value, const std::string& source,
                                        const std::string& path) {
  ObjectReader r(value, source, path);
  CalibrationRecord c;
  c.rows = r.integer("rows", 0);
  const nlohmann::json& files = r.array("files");
  for (std::size_t i = 0; i < files.size(); ++i) {
    if (!files[i].is_string()) {
      throw InputError(source, r.element_path("files", i), "expected a file name (a string)");
    }
    c.files.push_back(files[i].get<std::string>());
  }
  c.date = r.string("date");
  c.median_error_pct = r.optional_number("median_error_pct", 0, false);
  c.loo_median_error_pct = r.optional_number("loo_median_error_pct", 0, false);
  c.memory_median_error_pct = r.optional_number("memory_median_error_pct", 0, false);
  c.loo_memory_median_error_pct = r.optional_number("loo_memory_median_error_pct", 0, false);
  c.transferred_from = r.optional_string("transferred_from").value_or("");
  ObjectReader parameters = r.object("parameters");
  const nlohmann::json& object = value.at("parameters");
  for (auto it = object.begin(); it != object.end(); ++it) {
    c.parameters.push_back(read_calibrated_parameter(parameters.object(it.key()), it.key()));
  }
  parameters.finish();
  r.finish();
  return c;
}

void validate_cluster(const Cluster& c, const std::string& source) {
  auto bad = [&](const std::string& field, const std::string& expectation) {
    throw InputError(source, "$." + field, expectation);
  };
  if (c.name.empty()) bad("name", "expected a non-empty string");
  if (c.nodes < 1) bad("nodes", "expected an integer >= 1");
  if (c.devices_per_node < 1) bad("devices_per_node", "expected an integer >= 1");
  if (c.devices_per_node > kMaxDevices || c.nodes > kMaxDevices / c.devices_per_node) {
    bad(c.devices_per_node > kMaxDevices ? "devices_per_node" : "nodes",
        "expected at most " + std::to_string(kMaxDevices) + " devices in all, found " +
            std::to_string(c.nodes) + " nodes x " + std::to_string(c.devices_per_node));
  }
  if (c.device.memory_bytes < 1) bad("device.memory_bytes", "expected an integer >= 1");
  if (!c.device.peak_tflops.any()) {
    bad("device.peak_tflops", "expected at least one precision with a rate > 0");
  }
  // fp8 jobs run attention and the head at bf16's rates (costmodel::DeviceRates::core_gemm).
  if (c.device.peak_tflops.fp8 > 0 && c.device.peak_tflops.bf16 <= 0) {
    bad("device.peak_tflops.bf16", "required with peak_tflops.fp8 (fp8 jobs keep bf16 elsewhere)");
  }
  if (c.device.achievable_tflops.fp8 > 0 && c.device.achievable_tflops.bf16 <= 0) {
    bad("device.achievable_tflops.bf16",
        "required with achievable_tflops.fp8 (fp8 jobs keep bf16 elsewhere)");
  }
  if (c.device.memory_bandwidth_gbps <= 0) bad("device.memory_bandwidth_gbps", "expected > 0");
  validate_achievable(c.device, bad);
  if (c.intra_node.bandwidth_gbps <= 0) bad("intra_node.bandwidth_gbps", "expected > 0");
  if (c.nodes > 1 && !c.inter_node) {
    bad("inter_node", "required when nodes > 1 (found nodes = " + std::to_string(c.nodes) + ")");
  }
}

Cluster cluster_from_json(const nlohmann::json& value, const std::string& source) {
  ObjectReader r(value, source);
  r.expect_format("loom-cluster");
  Cluster c;
  c.name = r.string("name");
  if (c.name.empty()) r.fail("name", "expected a non-empty string");
  c.nodes = r.integer("nodes", 1, kMaxDevices);
  c.devices_per_node = r.integer("devices_per_node", 1, kMaxDevices);
  {
    ObjectReader d = r.object("device");
    c.device.name = d.string("name");
    if (d.has("kind")) {
      c.device.kind =
          d.choice("kind", {"gpu", "cpu"}) == "cpu" ? DeviceKind::kCpu : DeviceKind::kGpu;
    }
    c.device.memory_bytes = d.integer("memory_bytes", 1);
    {
      ObjectReader p = d.object("peak_tflops");
      for (Precision precision : kAllPrecisions) {
        c.device.peak_tflops.at(precision) =
            p.optional_number(to_string(precision), 0, false).value_or(0);
      }
      p.finish();
      if (!c.device.peak_tflops.any()) {
        p.fail("", "expected at least one of fp32, tf32, fp16, bf16, fp8 with a rate > 0");
      }
    }
    c.device.memory_bandwidth_gbps = d.number("memory_bandwidth_gbps", 0, /*exclusive=*/true);
    efficiency(d, "matrix_efficiency", &c.device.matrix_efficiency);
    efficiency(d, "memory_efficiency", &c.device.memory_efficiency);
    c.device.sm_count = d.optional_integer("sm_count", 1, 100'000).value_or(0);
    if (d.has("achievable_tflops")) {
      c.device.achievable_tflops = read_rates(d.object("achievable_tflops"));
    } else {
      d.skip("achievable_tflops");
    }
    efficiency(d, "attention_efficiency", &c.device.attention_efficiency);
    efficiency(d, "flash_attention_2_efficiency", &c.device.flash_attention_2_efficiency);
    efficiency(d, "sustained_clock_fraction", &c.device.sustained_clock_fraction);
    c.device.fragmentation = read_fraction(d, "fragmentation");
    c.device.host_launch_us = d.optional_number("host_launch_us", 0, /*exclusive=*/false);
    c.device.host_pass_us = d.optional_number("host_pass_us", 0, /*exclusive=*/false);
    c.device.host_serial_fraction = read_fraction(d, "host_serial_fraction");
    c.device.thread_serial_fraction = read_fraction(d, "thread_serial_fraction");
    c.device.cuda_context_mib = d.optional_number("cuda_context_mib", 0, /*exclusive=*/false);
    c.device.blas_workspace_mib = d.optional_number("blas_workspace_mib", 0, /*exclusive=*/false);
    d.finish();
  }
  c.intra_node = read_link_class(r.object("intra_node"));
  if (r.has("inter_node")) {
    c.inter_node = read_link_class(r.object("inter_node"));
  } else {
    r.skip("inter_node");
    if (c.nodes > 1) {
      r.fail("inter_node", "missing required field (needed when nodes > 1; found nodes = " +
                               std::to_string(c.nodes) + ")");
    }
  }
  if (r.has("links")) {
    const nlohmann::json& links = r.array("links");
    for (std::size_t i = 0; i < links.size(); ++i) {
      ObjectReader l(links[i], source, r.element_path("links", i));
      ExplicitLink e;
      e.a = l.string("a");
      e.b = l.string("b");
      if (e.a.empty()) l.fail("a", "expected a device or switch name such as \"node0/gpu0\"");
      if (e.b.empty()) l.fail("b", "expected a device or switch name such as \"node0/gpu1\"");
      if (e.a == e.b) l.fail("b", "expected a different endpoint than a (\"" + e.a + "\")");
      e.bandwidth_gbps = l.number("bandwidth_gbps", 0, /*exclusive=*/true);
      e.latency_us = l.number("latency_us", 0, /*exclusive=*/false);
      e.kind = l.optional_string("kind").value_or("");
      l.finish();
      c.links.push_back(e);
    }
  } else {
    r.skip("links");
  }
  c.source = r.optional_string("source").value_or("");
  c.collective_launch_us = r.optional_number("collective_launch_us", 0, /*exclusive=*/false);
  c.overlap_slowdown = r.optional_number("overlap_slowdown", 0, /*exclusive=*/false);
  if (c.overlap_slowdown && *c.overlap_slowdown >= 1) {
    r.fail("overlap_slowdown", "expected a fraction in [0, 1)");
  }
  if (r.has("calibration")) {
    r.object("calibration");  // marks the key known; the record has its own reader
    c.calibration = calibration_from_json(value.at("calibration"), source);
  } else {
    r.skip("calibration");
  }
  r.finish();
  validate_cluster(c, source);
  return c;
}

nlohmann::json cluster_to_json(const Cluster& c) {
  nlohmann::json j;
  j["format"] = "loom-cluster/1";
  j["name"] = c.name;
  j["nodes"] = c.nodes;
  j["devices_per_node"] = c.devices_per_node;
  nlohmann::json d;
  d["name"] = c.device.name;
  d["kind"] = c.device.kind == DeviceKind::kCpu ? "cpu" : "gpu";
  d["memory_bytes"] = c.device.memory_bytes;
  d["peak_tflops"] = rates_to_json(c.device.peak_tflops);
  d["memory_bandwidth_gbps"] = c.device.memory_bandwidth_gbps;
  if (c.device.matrix_efficiency) d["matrix_efficiency"] = *c.device.matrix_efficiency;
  if (c.device.memory_efficiency) d["memory_efficiency"] = *c.device.memory_efficiency;
  if (c.device.sm_count > 0) d["sm_count"] = c.device.sm_count;
  if (c.device.sm_count > 0) d["achievable_tflops"] = rates_to_json(c.device.achievable_tflops);
  if (c.device.attention_efficiency) d["attention_efficiency"] = *c.device.attention_efficiency;
  if (c.device.flash_attention_2_efficiency) {
    d["flash_attention_2_efficiency"] = *c.device.flash_attention_2_efficiency;
  }
  if (c.device.sustained_clock_fraction) {
    d["sustained_clock_fraction"] = *c.device.sustained_clock_fraction;
  }
  if (c.device.fragmentation) d["fragmentation"] = *c.device.fragmentation;
  if (c.device.host_launch_us) d["host_launch_us"] = *c.device.host_launch_us;
  if (c.device.host_pass_us) d["host_pass_us"] = *c.device.host_pass_us;
  if (c.device.host_serial_fraction) d["host_serial_fraction"] = *c.device.host_serial_fraction;
  if (c.device.thread_serial_fraction) {
    d["thread_serial_fraction"] = *c.device.thread_serial_fraction;
  }
  if (c.device.cuda_context_mib) d["cuda_context_mib"] = *c.device.cuda_context_mib;
  if (c.device.blas_workspace_mib) d["blas_workspace_mib"] = *c.device.blas_workspace_mib;
  j["device"] = d;
  j["intra_node"] = link_class_to_json(c.intra_node);
  if (c.inter_node) j["inter_node"] = link_class_to_json(*c.inter_node);
  nlohmann::json links = nlohmann::json::array();
  for (const auto& e : c.links) {
    nlohmann::json l = {
        {"a", e.a}, {"b", e.b}, {"bandwidth_gbps", e.bandwidth_gbps}, {"latency_us", e.latency_us}};
    if (!e.kind.empty()) l["kind"] = e.kind;
    links.push_back(l);
  }
  j["links"] = links;
  if (!c.source.empty()) j["source"] = c.source;
  if (c.collective_launch_us) j["collective_launch_us"] = *c.collective_launch_us;
  if (c.overlap_slowdown) j["overlap_slowdown"] = *c.overlap_slowdown;
  if (c.calibration) j["calibration"] = calibration_to_json(*c.calibration);
  return j;
}

Cluster with_nodes(const Cluster& cluster, std::int64_t nodes, const std::string& source) {
  if (nodes < 1)
    throw InputError(source, "", "expected an integer >= 1, found " + std::to_string(nodes));
  if (nodes > kMaxDevices / cluster.devices_per_node) {
    throw InputError(source, "",
                     "at most " + std::to_string(kMaxDevices / cluster.devices_per_node) +
                         " nodes of " + std::to_string(cluster.devices_per_node) + " devices (" +
                         std::to_string(kMaxDevices) + " devices in all), found " +
                         std::to_string(nodes));
  }
  Cluster c = cluster;
  c.nodes = nodes;
  if (nodes > 1 && !c.inter_node) {
    throw InputError(source, "",
                     "cluster \"" + c.name + "\" has no inter_node link class, so it cannot span " +
                         std::to_string(nodes) + " nodes");
  }
  return c;
}

namespace {

// Whether `name` is a device ("node<K>/gpu<J>" or "node<K>/cpu<J>") outside `nodes` nodes of
// `per_node` devices; switch names are kept.
bool names_missing_device(const std::string& name, std::int64_t nodes, std::int64_t per_node) {
  const std::size_t slash = name.find('/');
  if (name.rfind("node", 0) != 0 || slash == std::string::npos || slash == 4) return false;
  const std::string node = name.substr(4, slash - 4);
  const std::string rest = name.substr(slash + 1);
  if (rest.size() < 4 || (rest.rfind("gpu", 0) != 0 && rest.rfind("cpu", 0) != 0)) return false;
  const std::string index = rest.substr(3);
  auto digits = [](const std::string& t) {
    return !t.empty() && t.size() < 10 && t.find_first_not_of("0123456789") == std::string::npos;
  };
  if (!digits(node) || !digits(index)) return false;
  return std::stoll(node) >= nodes || std::stoll(index) >= per_node;
}

}  // namespace

Cluster with_devices(const Cluster& cluster, std::int64_t devices, const std::string& source) {
  const std::int64_t per_node = cluster.devices_per_node;
  if (devices < 1) {
    throw InputError(source, "", "expected an integer >= 1, found " + std::to_string(devices));
  }
  Cluster c = cluster;
  if (devices <= per_node) {
    c.nodes = 1;
    c.devices_per_node = devices;
  } else if (devices % per_node == 0) {
    c = with_nodes(cluster, devices / per_node, source);
  } else {
    throw InputError(source, "",
                     "at most the " + std::to_string(per_node) + " devices of one node of " +
                         cluster.name + ", or a multiple of " + std::to_string(per_node) +
                         " (whole nodes), found " + std::to_string(devices));
  }
  std::vector<ExplicitLink> kept;
  for (const ExplicitLink& l : c.links) {
    if (!names_missing_device(l.a, c.nodes, c.devices_per_node) &&
        !names_missing_device(l.b, c.nodes, c.devices_per_node)) {
      kept.push_back(l);
    }
  }
  c.links = std::move(kept);
  return c;
}

Precision best_precision(const DeviceSpec& device) {
  if (device.kind == DeviceKind::kCpu) return Precision::kFp32;
  if (device.peak_tflops.bf16 > 0) return Precision::kBf16;
  if (device.peak_tflops.fp16 > 0) return Precision::kFp16;
  return Precision::kFp32;
}

std::optional<std::string> precision_refusal(const DeviceSpec& device, Precision precision) {
  if (device.peak_tflops.of(precision) > 0) return std::nullopt;
  // The suggestion must be one the device runs: the default when it has a rate, else the fastest
  // it has.
  Precision suggestion = best_precision(device);
  for (Precision p : {Precision::kBf16, Precision::kFp16, Precision::kFp32}) {
    if (device.peak_tflops.of(suggestion) > 0) break;
    suggestion = p;
  }
  return std::string("the ") + device.name + " has no " + to_string(precision) +
         " rate in its peak_tflops: use --precision " + to_string(suggestion) +
         " (the best it runs)";
}

}  // namespace loom::profiles
