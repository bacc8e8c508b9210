// Cluster: built-in clusters, the loom-cluster/1 round trip, device names and the --nodes override.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "profiles/cluster.hpp"
#include "profiles/errors.hpp"
#include "profiles/json_reader.hpp"
#include "profiles/loader.hpp"

using loom::profiles::Cluster;
using loom::profiles::DeviceKind;
using loom::profiles::Precision;

namespace {

// The datasheet value of a calibrated parameter: its `start` in the file's calibration record
// (bench/calibrate-clusters.sh fits the shipped GPU files), else the value the file holds.
double datasheet(const Cluster& c, const std::string& name, double value) {
  if (!c.calibration) return value;
  for (const auto& p : c.calibration->parameters) {
    if (p.name == name) return p.start;
  }
  return value;
}

}  // namespace

TEST_CASE("every built-in cluster loads and round-trips through loom-cluster/1",
          "[profiles][cluster]") {
  const std::vector<std::string> names = loom::profiles::builtin_cluster_names();
  REQUIRE(names.size() >= 5);
  for (const std::string& name : names) {
    CAPTURE(name);
    Cluster c = loom::profiles::load_cluster(name);
    CHECK(c.name == name);
    CHECK(c.device_count() >= 1);
    CHECK(c.device.memory_bytes > 0);
    CHECK((c.nodes == 1 || c.inter_node.has_value()));
    nlohmann::json j = loom::profiles::cluster_to_json(c);
    CHECK(j.at("format") == "loom-cluster/1");
    CHECK(loom::profiles::cluster_from_json(j, "round trip of " + name) == c);
    CHECK(loom::profiles::cluster_from_json(
              loom::profiles::parse_json_text(j.dump(2), "text round trip of " + name),
              "text round trip of " + name) == c);
  }
}

TEST_CASE("dgx-a100-80g holds the datasheet figures", "[profiles][cluster]") {
  Cluster c = loom::profiles::load_cluster("dgx-a100-80g");
  CHECK(c.nodes == 4);
  CHECK(c.devices_per_node == 8);
  CHECK(c.device_count() == 32);
  CHECK(c.device.kind == DeviceKind::kGpu);
  CHECK(c.device.memory_bytes == 85899345920);
  CHECK(c.device.peak_tflops.bf16 == 312);
  CHECK(c.device.peak_tflops.of(Precision::kBf16) == 312);
  CHECK(c.device.peak_tflops.of(Precision::kFp16) == 312);
  CHECK(c.device.peak_tflops.of(Precision::kTf32) == 156);
  CHECK(c.device.peak_tflops.of(Precision::kFp32) == 19.5);
  CHECK(c.device.memory_bandwidth_gbps == 2039);
  CHECK(c.intra_node.bandwidth_gbps == 300);
  CHECK(c.intra_node.latency_us == 3);
  REQUIRE(c.inter_node.has_value());
  CHECK(c.inter_node->bandwidth_gbps == 200);
  CHECK(datasheet(c, "inter_node.latency_us", c.inter_node->latency_us) == 8);
  CHECK(c.links.empty());
  CHECK_FALSE(c.source.empty());
}

TEST_CASE("GPU files carry SM counts and measured matrix ceilings", "[profiles][cluster]") {
  // A100 SXM: 108 SMs, 271.2 bf16 TFLOP/s measured; H100 and H200 SXM: 132 SMs, 794.5, and a
  // sustained clock of 755 / 834 (H200's sustainable over achievable matmul rate); A100 has no
  // such measurement. The fused attention's product rate: the device's own kernel's,
  // FlashAttention-2's on A100 (0.9) and cuDNN's on H100 and H200 (0.89), with FlashAttention-2's
  // apart on Hopper (0.52).
  Cluster a100 = loom::profiles::load_cluster("dgx-a100-80g");
  CHECK(a100.device.sm_count == 108);
  CHECK(datasheet(a100, "device.achievable_tflops.bf16",
                  a100.device.achievable_tflops.of(Precision::kBf16)) == 271.2);
  CHECK(datasheet(a100, "device.achievable_tflops.tf32",
                  a100.device.achievable_tflops.of(Precision::kTf32)) == 135.6);
  CHECK(datasheet(a100, "device.attention_efficiency",
                  a100.device.attention_efficiency.value_or(0)) == 0.9);
  CHECK_FALSE(a100.device.sustained_clock_fraction.has_value());
  CHECK_FALSE(a100.device.flash_attention_2_efficiency.has_value());
  for (const auto& [name, attention] :
       {std::pair{"dgx-h100", 0.89}, std::pair{"h100-x1", 0.89}, std::pair{"h200-x1", 0.89}}) {
    INFO(name);
    Cluster h = loom::profiles::load_cluster(name);
    CHECK(h.device.sm_count == 132);
    CHECK(h.device.sustained_clock_fraction.value_or(1) == Approx(755.0 / 834.0).epsilon(1e-3));
    CHECK(datasheet(h, "device.achievable_tflops.bf16",
                    h.device.achievable_tflops.of(Precision::kBf16)) == 794.5);
    CHECK(datasheet(h, "device.achievable_tflops.tf32",
                    h.device.achievable_tflops.of(Precision::kTf32)) == 397.2);
    CHECK(datasheet(h, "device.attention_efficiency", h.device.attention_efficiency.value_or(0)) ==
          attention);
    CHECK(datasheet(h, "device.flash_attention_2_efficiency",
                    h.device.flash_attention_2_efficiency.value_or(0)) == 0.52);
  }
  CHECK(loom::profiles::load_cluster("local-cpu").device.sm_count == 0);
}

TEST_CASE("device names are node-major", "[profiles][cluster]") {
  Cluster c = loom::profiles::load_cluster("dgx-a100-80g");
  CHECK(loom::profiles::device_name(c, 0) == "node0/gpu0");
  CHECK(loom::profiles::device_name(c, 7) == "node0/gpu7");
  CHECK(loom::profiles::device_name(c, 9) == "node1/gpu1");
  CHECK(loom::profiles::device_name(c, 31) == "node3/gpu7");

  Cluster cpu = loom::profiles::load_cluster("local-cpu");
  CHECK(cpu.device.kind == DeviceKind::kCpu);
  CHECK(loom::profiles::device_name(cpu, 1) == "node0/cpu1");
}

TEST_CASE("a round trip keeps explicit links and efficiencies", "[profiles][cluster]") {
  Cluster v100 = loom::profiles::load_cluster("v100-16g-4x-nvlink");
  REQUIRE(v100.links.size() == 6);
  CHECK(v100.links[0].a == "node0/gpu0");
  CHECK(v100.links[0].b == "node0/gpu1");
  CHECK(v100.links[0].bandwidth_gbps == 50);
  CHECK(v100.links[0].kind == "nvlink2 x2");

  Cluster cpu = loom::profiles::load_cluster("local-cpu");
  REQUIRE(cpu.device.matrix_efficiency.has_value());
  CHECK(*cpu.device.matrix_efficiency == 0.5);

  Cluster c = v100;
  c.device.matrix_efficiency = 0.7;
  c.links[1].kind.clear();  // the kind of a link is optional
  c.source.clear();
  CHECK(loom::profiles::cluster_from_json(loom::profiles::cluster_to_json(c), "edited") == c);

  cpu.device.thread_serial_fraction = 0.85;
  const nlohmann::json j = loom::profiles::cluster_to_json(cpu);
  CHECK(j["device"]["thread_serial_fraction"] == 0.85);
  CHECK(loom::profiles::cluster_from_json(j, "edited") == cpu);
}

TEST_CASE("with_nodes changes the node count", "[profiles][cluster]") {
  Cluster c = loom::profiles::load_cluster("dgx-a100-80g");
  Cluster two = loom::profiles::with_nodes(c, 2, "--nodes");
  CHECK(two.nodes == 2);
  CHECK(two.device_count() == 16);
  CHECK(two.devices_per_node == c.devices_per_node);
  CHECK(two.device == c.device);
  CHECK(c.nodes == 4);  // the original is untouched

  Cluster sixteen = loom::profiles::with_nodes(c, 16, "--nodes");
  CHECK(sixteen.device_count() == 128);
  CHECK(loom::profiles::device_name(sixteen, 127) == "node15/gpu7");

  // A single-node cluster with an inter-node class can grow.
  Cluster pcie = loom::profiles::load_cluster("v100-32g-2x-pcie");
  CHECK(loom::profiles::with_nodes(pcie, 3, "--nodes").device_count() == 6);
}

TEST_CASE("with_nodes refuses what the cluster cannot do", "[profiles][cluster]") {
  Cluster h100 = loom::profiles::load_cluster("h100-x1");
  REQUIRE_FALSE(h100.inter_node.has_value());
  // One node is always fine.
  CHECK(loom::profiles::with_nodes(h100, 1, "--nodes") == h100);

  REQUIRE_THROWS_AS(loom::profiles::with_nodes(h100, 2, "--nodes"), loom::InputError);
  REQUIRE_THROWS_WITH(loom::profiles::with_nodes(h100, 2, "--nodes"),
                      Catch::Contains("--nodes") && Catch::Contains("h100-x1") &&
                          Catch::Contains("inter_node") && Catch::Contains("2 nodes"));
  try {
    loom::profiles::with_nodes(h100, 2, "--nodes");
    FAIL("expected an InputError");
  } catch (const loom::InputError& e) {
    CHECK(e.source() == "--nodes");
  }

  REQUIRE_THROWS_AS(loom::profiles::with_nodes(h100, 0, "--nodes"), loom::InputError);
  REQUIRE_THROWS_WITH(loom::profiles::with_nodes(h100, 0, "--nodes"),
                      Catch::Contains("--nodes") && Catch::Contains(">= 1"));
}

TEST_CASE("with_devices uses part of a node or whole nodes (--gpus)", "[profiles][cluster]") {
  const Cluster dgx = loom::profiles::load_cluster("dgx-a100-80g");
  const Cluster two = loom::profiles::with_devices(dgx, 2, "--gpus");
  CHECK(two.nodes == 1);
  CHECK(two.devices_per_node == 2);
  CHECK(two.device == dgx.device);
  CHECK(two.intra_node == dgx.intra_node);
  const Cluster eight = loom::profiles::with_devices(dgx, 8, "--gpus");
  CHECK(eight.nodes == 1);
  CHECK(eight.devices_per_node == 8);
  const Cluster sixteen = loom::profiles::with_devices(dgx, 16, "--gpus");
  CHECK(sixteen.nodes == 2);
  CHECK(sixteen.devices_per_node == 8);
  CHECK(loom::profiles::with_devices(dgx, 64, "--gpus").nodes == 8);
  REQUIRE_THROWS_WITH(loom::profiles::with_devices(dgx, 12, "--gpus"),
                      "--gpus: at most the 8 devices of one node of dgx-a100-80g, or a multiple "
                      "of 8 (whole nodes), found 12");
  REQUIRE_THROWS_AS(loom::profiles::with_devices(dgx, 0, "--gpus"), loom::InputError);

  // Explicit links to the devices left out are dropped; the rest stay.
  const Cluster quad = loom::profiles::load_cluster("v100-16g-4x-nvlink");
  const Cluster pair = loom::profiles::with_devices(quad, 2, "--gpus");
  REQUIRE(pair.links.size() == 1);
  CHECK(pair.links[0] == quad.links[0]);  // node0/gpu0 - node0/gpu1
  CHECK(loom::profiles::with_devices(quad, 3, "--gpus").links.size() == 3);
  CHECK(loom::profiles::with_devices(quad, 4, "--gpus") == quad);
}

TEST_CASE("the default precision is the best the device runs", "[profiles][cluster]") {
  using loom::profiles::best_precision;
  CHECK(best_precision(loom::profiles::load_cluster("dgx-a100-80g").device) == Precision::kBf16);
  CHECK(best_precision(loom::profiles::load_cluster("v100-32g-2x-pcie").device) ==
        Precision::kFp16);
  // A CPU computes in fp32, even where its table lists a bf16 rate.
  const Cluster cpu = loom::profiles::load_cluster("local-cpu");
  REQUIRE(cpu.device.peak_tflops.bf16 > 0);
  CHECK(best_precision(cpu.device) == Precision::kFp32);
  loom::profiles::DeviceSpec old = loom::profiles::load_cluster("v100-32g-2x-pcie").device;
  old.peak_tflops.fp16 = 0;
  CHECK(best_precision(old) == Precision::kFp32);

  using loom::profiles::precision_refusal;
  const loom::profiles::DeviceSpec v100 = loom::profiles::load_cluster("v100-32g-2x-pcie").device;
  CHECK(precision_refusal(v100, Precision::kBf16) ==
        "the V100-PCIE-32GB has no bf16 rate in its peak_tflops: use --precision fp16 (the best "
        "it runs)");
  CHECK_FALSE(precision_refusal(v100, Precision::kFp16).has_value());
  CHECK_FALSE(precision_refusal(v100, Precision::kFp32).has_value());
  CHECK(precision_refusal(old, Precision::kFp16) ==
        "the V100-PCIE-32GB has no fp16 rate in its peak_tflops: use --precision fp32 (the best "
        "it runs)");
}
