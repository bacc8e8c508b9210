// Runtime calibrations (profiles/runtime_calibration.hpp, costmodel/cluster_parameters.hpp,
// planner/calibration_choice.hpp): the shipped cluster files hold hardware values inside their
// ranges, every shipped calibration stays inside them on every cluster of its device, a plan
// gets the calibration of its runtime and device, and bad calibrations are refused by name.
#include <catch2/catch.hpp>
#include <set>
#include <string>

#include "costmodel/cluster_parameters.hpp"
#include "planner/calibration_choice.hpp"
#include "profiles/errors.hpp"
#include "profiles/loader.hpp"

using namespace loom;

namespace {

std::string thrown(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return std::string(e.what());
  }
  return "";
}

}  // namespace

TEST_CASE("shipped cluster files hold hardware values, without a fitted record", "[calibration]") {
  for (const std::string& name : profiles::builtin_cluster_names()) {
    INFO(name);
    const profiles::Cluster c = profiles::load_cluster(name);
    CHECK_FALSE(c.calibration.has_value());
    // Hardware ranges are drawn around the file's own values, so the file is checked against
    // what bounds them: the datasheet's peak and the links' rates. Software values the file
    // states must lie inside their definitions' bounds.
    for (const costmodel::ClusterParameter& p : costmodel::cluster_parameters(c)) {
      if (p.kind != costmodel::ParameterKind::kSoftware) continue;
      INFO(p.name);
      CHECK(p.value >= p.lower);
      CHECK(p.value <= p.upper);
    }
    for (profiles::Precision p : profiles::kAllPrecisions) {
      CHECK(c.device.achievable_tflops.of(p) <= c.device.peak_tflops.of(p));
    }
    CHECK(c.intra_node.bus_bandwidth_gbps.value_or(0) <= c.intra_node.bandwidth_gbps);
    if (c.inter_node) {
      CHECK(c.inter_node->bus_bandwidth_gbps.value_or(0) <= c.inter_node->bandwidth_gbps);
    }
  }
  // The values the pooled fits had moved far from their sources are the sources again.
  const profiles::Cluster h100 = profiles::load_cluster("dgx-h100");
  CHECK(*h100.intra_node.bus_bandwidth_gbps == 366.0);  // nccl-tests, 8 x H200 NVLink 4
  CHECK(*h100.device.memory_efficiency == 0.8);
  CHECK(*h100.overlap_slowdown == 0.189);
  CHECK(*profiles::load_cluster("dgx-a100-80g").intra_node.bus_bandwidth_gbps == 235.0);
  CHECK(*profiles::load_cluster("dgx2-v100-32g").intra_node.bus_bandwidth_gbps == 150.0);
}

TEST_CASE("a hardware range is 0.9-1.1 of a GEMM ceiling and 0.85-1.1 of a bus bandwidth",
          "[calibration]") {
  const profiles::Cluster h100 = profiles::load_cluster("dgx-h100");
  bool ceiling = false;
  bool bus = false;
  for (const costmodel::ClusterParameter& p : costmodel::cluster_parameters(h100)) {
    if (p.name == "device.achievable_tflops.bf16") {
      ceiling = true;
      CHECK(p.kind == costmodel::ParameterKind::kHardware);
      CHECK(p.lower == Approx(0.9 * 794.5));
      CHECK(p.upper == Approx(1.1 * 794.5));  // 874, under the 989.5 peak
    }
    if (p.name == "intra_node.bus_bandwidth_gbps") {
      bus = true;
      CHECK(p.lower == Approx(0.85 * 366));
      CHECK(p.upper == Approx(1.1 * 366));  // 402.6, under NVLink's 450
    }
    if (p.name == "device.memory_efficiency" || p.name == "overlap_slowdown") {
      CHECK(p.kind == costmodel::ParameterKind::kSoftware);
    }
  }
  CHECK(ceiling);
  CHECK(bus);
}

TEST_CASE("every shipped calibration stays inside the ranges on each cluster of its device",
          "[calibration]") {
  std::set<std::string> runtimes;
  for (const std::string& name : profiles::builtin_calibration_names()) {
    INFO(name);
    const profiles::RuntimeCalibration c = profiles::load_calibration(name);
    CHECK(c.name == name);
    CHECK(c.record.has_value());
    runtimes.insert(c.runtime);
    int clusters = 0;
    for (const std::string& cluster_name : profiles::builtin_cluster_names()) {
      const profiles::Cluster cluster = profiles::load_cluster(cluster_name);
      if (cluster.device.name != c.device) continue;
      INFO(cluster_name);
      ++clusters;
      const profiles::Cluster applied = costmodel::apply_calibration(cluster, c, name);
      for (const auto& [parameter, value] : c.parameters) {
        if (!cluster.inter_node && parameter.rfind("inter_node.", 0) == 0) continue;  // one node
        CHECK(costmodel::cluster_parameter(applied, parameter) == value);
      }
    }
    CHECK(clusters >= 1);
    // One shipped calibration per runtime and device: the default a plan gets.
    CHECK(profiles::shipped_calibration(c.runtime, c.device)->name == name);
  }
  CHECK(runtimes == std::set<std::string>{"deepspeed", "fsdp", "loom", "nemo"});
}

TEST_CASE("a plan gets the calibration of its runtime and device, or the hardware alone",
          "[calibration]") {
  const profiles::Cluster h100 = profiles::load_cluster("dgx-h100");
  const planner::CalibratedCluster fsdp =
      planner::with_calibration(h100, costmodel::Runtime::kFsdp, std::nullopt);
  CHECK(fsdp.calibration == "fsdp-h100");
  // FSDP's fit puts its unhidden costs into software parameters, not into the NVLink.
  CHECK(*fsdp.cluster.device.memory_efficiency < 0.6);
  CHECK(*fsdp.cluster.intra_node.bus_bandwidth_gbps >= 0.85 * 366 - 1e-9);
  // Megatron-LM has no shipped calibration: what FSDP's rows taught does not reach it.
  const planner::CalibratedCluster megatron =
      planner::with_calibration(h100, costmodel::Runtime::kMegatron, std::nullopt);
  CHECK(megatron.calibration.empty());
  CHECK(megatron.cluster == h100);
  CHECK(planner::with_calibration(h100, costmodel::Runtime::kFsdp, "none").calibration.empty());
  CHECK(planner::with_calibration(h100, costmodel::Runtime::kNemo, std::nullopt).calibration ==
        "nemo-h100");
  // Another runtime's calibration, or another device's, is refused by name.
  CHECK(thrown(
            [&] { planner::with_calibration(h100, costmodel::Runtime::kMegatron, "fsdp-h100"); }) ==
        "--calibration: a calibration of the plan's runtime, megatron (--runtime), or "
        "none; fsdp-h100 is of runtime fsdp");
  const std::string other = thrown([&] {
    planner::with_calibration(profiles::load_cluster("dgx-a100-80g"), costmodel::Runtime::kFsdp,
                              "fsdp-h100");
  });
  CHECK(other.find("fsdp-h100: $.device: the device of cluster dgx-a100-80g (A100-SXM4-80GB)") !=
        std::string::npos);
}

TEST_CASE("a calibration that leaves a hardware range is refused, naming the parameter",
          "[calibration]") {
  profiles::RuntimeCalibration c = profiles::load_calibration("fsdp-h100");
  c.parameters = {{"intra_node.bus_bandwidth_gbps", 116.0}};  // what the pooled fit once stored
  const std::string why = thrown(
      [&] { costmodel::apply_calibration(profiles::load_cluster("dgx-h100"), c, "mine.json"); });
  CHECK(why ==
        "mine.json: $.parameters.intra_node.bus_bandwidth_gbps: a hardware value within [311.1, "
        "402.6] on cluster dgx-h100, found 116");
  c.parameters = {{"device.nonsense", 1.0}};
  CHECK(thrown([&] {
          costmodel::apply_calibration(profiles::load_cluster("dgx-h100"), c, "mine.json");
        }).find("mine.json: $.parameters.device.nonsense: a parameter of cluster dgx-h100 (") == 0);
}

TEST_CASE("a loom-calibration file round-trips and names a bad field", "[calibration]") {
  const profiles::RuntimeCalibration c = profiles::load_calibration("nemo-h100");
  const nlohmann::json j = profiles::runtime_calibration_to_json(c);
  CHECK(profiles::runtime_calibration_from_json(j, "again.json") == c);
  nlohmann::json bad = j;
  bad["parameters"]["overlap_slowdown"] = "high";
  CHECK(thrown([&] {
          profiles::runtime_calibration_from_json(bad, "bad.json");
        }).find("bad.json: $.parameters.overlap_slowdown:") == 0);
  bad = j;
  bad["runtim"] = "fsdp";
  CHECK(thrown([&] {
          profiles::runtime_calibration_from_json(bad, "bad.json");
        }).find("bad.json: $.runtim: unknown field") == 0);
}
