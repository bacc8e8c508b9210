// Cluster: the hardware a plan runs on, and its JSON form `loom-cluster/1` (docs/formats.md).
//
// The shorthand (nodes x devices_per_node with an intra-node and an inter-node link class) and
// the optional explicit `links` both expand into one topology graph (topology.hpp).
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

namespace loom::profiles {

enum class DeviceKind { kGpu, kCpu };

// kFp8: the matrix products of the linear layers in fp8 (TransformerEngine's recipe), all else
// (activations, weights, attention) in bf16; costmodel/compute.hpp says what it costs.
enum class Precision { kFp32, kTf32, kFp16, kBf16, kFp8 };
inline constexpr Precision kAllPrecisions[] = {Precision::kFp32, Precision::kTf32, Precision::kFp16,
                                               Precision::kBf16, Precision::kFp8};
const char* to_string(Precision precision);
// Parses "fp32" | "tf32" | "fp16" | "bf16" | "fp8"; nullopt otherwise.
std::optional<Precision> parse_precision(const std::string& text);

// Peak dense (non-sparse) matrix rates from the datasheet, in TFLOP/s; 0 = not supported.
struct PeakTflops {
  double fp32 = 0;
  double tf32 = 0;
  double fp16 = 0;
  double bf16 = 0;
  double fp8 = 0;
  double of(Precision precision) const;
  double& at(Precision precision);
  bool any() const { return fp32 > 0 || tf32 > 0 || fp16 > 0 || bf16 > 0 || fp8 > 0; }
  bool operator==(const PeakTflops&) const = default;
};

struct DeviceSpec {
  std::string name;
  DeviceKind kind = DeviceKind::kGpu;
  std::int64_t memory_bytes = 0;
  PeakTflops peak_tflops;
  double memory_bandwidth_gbps = 0;  // GB/s (1e9 bytes per second)
  // Fractions of peak reached by matrix products and by memory-bound kernels; when absent the
  // cost model's defaults apply (costmodel/compute.hpp).
  std::optional<double> matrix_efficiency;
  std::optional<double> memory_efficiency;
  // GPUs: streaming multiprocessors, and the best matrix rate measured per precision (0 = not
  // measured). With both, matrix products are timed from their shapes (costmodel/gemm.hpp);
  // without, at peak x matrix efficiency. JSON "sm_count", "achievable_tflops" (same keys as
  // peak_tflops), which come together.
  std::int64_t sm_count = 0;
  PeakTflops achievable_tflops;
  // Fraction of peak the device's own fused attention kernel reaches (cuDNN's fused attention or
  // FlashAttention-3 on Hopper, FlashAttention-2 on Ampere); absent = the cost model's default.
  // JSON "attention_efficiency".
  std::optional<double> attention_efficiency;
  // FlashAttention-2's fraction where it differs from attention_efficiency: on Hopper it runs
  // Ampere's instructions (no wgmma or TMA) and reaches about 35 % of H100's peak where
  // FlashAttention-3 reaches 75 % (Shah et al. 2024, "FlashAttention-3", section 1). Runtimes
  // that run FlashAttention-2 (costmodel RuntimeRules::attention_kernel) use it; absent = the
  // same as attention_efficiency. JSON "flash_attention_2_efficiency".
  std::optional<double> flash_attention_2_efficiency;
  // GPUs: the clock a long training run sustains on tensor-core (bf16, fp16, tf32) matrix
  // products as a fraction of the clock of the short benchmarks behind achievable_tflops and the
  // GEMM fit (power and thermal limits lower it after seconds of dense load); measured, e.g. the
  // mean of nvidia-smi's clocks.sm over a run over clocks.max.sm. Absent = 1. JSON
  // "sustained_clock_fraction".
  std::optional<double> sustained_clock_fraction;
  // GPUs: the caching allocator's reserved-but-unallocated memory as a fraction of the step's
  // transient bytes (process_memory.hpp); absent = kFragmentationFraction there. JSON
  // "fragmentation".
  std::optional<double> fragmentation;
  // GPUs: what the host spends issuing work through an eager runtime, which bounds a pass when
  // its kernels are shorter than it (costmodel/compute.hpp): per kernel launched, and per forward
  // or backward pass of a micro-batch on a stage (batch set-up, the loss, the autograd engine's
  // start). Absent = the cost model's defaults. JSON "host_launch_us", "host_pass_us".
  std::optional<double> host_launch_us;
  std::optional<double> host_pass_us;
  // GPUs: the share of the shorter of a pass's host issue and its kernels that does not overlap
  // the longer (the host waits for the device where the runtime synchronises); absent = the cost
  // model's default. JSON "host_serial_fraction".
  std::optional<double> host_serial_fraction;
  // CPUs: the share of a rank's compute that its intra-op threads do not split (Amdahl's serial
  // fraction: t threads run it threads / (1 + share * (threads - 1)) times faster than one);
  // absent = 0, perfect scaling. Small layers barely gain from a second thread (LibTorch's small
  // products and elementwise ops stay on one), so loom profile --threads measures the real
  // scaling. JSON "thread_serial_fraction".
  std::optional<double> thread_serial_fraction;
  // GPUs: what the CUDA context of a training process holds, in MiB (the device's used memory
  // less the allocator's reserved bytes, measured); absent = costmodel's kCudaContextBytes.
  // JSON "cuda_context_mib".
  std::optional<double> cuda_context_mib;
  // GPUs: the cuBLAS workspace PyTorch allocates per handle from its caching allocator, in MiB
  // (its default: 32 on Hopper, 8.125 before); absent = costmodel's kCublasWorkspaceBytes.
  // JSON "blas_workspace_mib".
  std::optional<double> blas_workspace_mib;
  bool operator==(const DeviceSpec&) const = default;
};

// A class of link: per device (intra-node) or per node (inter-node), per direction.
struct LinkClass {
  std::string kind;  // "nvswitch", "nvlink", "pcie", "infiniband", "ethernet", "loopback", ...
  double bandwidth_gbps = 0;
  double latency_us = 0;
  // GPU clusters (NCCL, costmodel/nccl.hpp): the bus bandwidth NCCL's ring reaches over this
  // class at large messages (nccl-tests' busbw; absent = bandwidth_gbps), and, on an intra-node
  // switch with NVLink SHARP, the algorithm bandwidth (bytes / time) of an NVLS all-reduce.
  std::optional<double> bus_bandwidth_gbps;
  std::optional<double> nvls_bandwidth_gbps;
  bool operator==(const LinkClass&) const = default;
};

// One explicit link between two named endpoints ("node0/gpu1", or any other name, which becomes a
// switch such as "node0/pcie0" or "node0/nic").
struct ExplicitLink {
  std::string a;
  std::string b;
  double bandwidth_gbps = 0;
  double latency_us = 0;
  std::string kind;  // optional in JSON
  bool operator==(const ExplicitLink&) const = default;
};

// What `loom calibrate` fitted into a cluster file (JSON "calibration"): the measured rows it used,
// from which files and when, the median |error| of its predictions in sample and leave-one-out,
// and each free parameter with its starting (datasheet) value, fitted value and uncertainty.
struct CalibratedParameter {
  std::string name;  // "device.achievable_tflops.bf16", "inter_node.latency_us", ...
  double start = 0;  // the value before any calibration (the prior's centre on a re-fit)
  double value = 0;
  std::optional<double> uncertainty;  // one standard deviation; absent when not informed
  bool informed = true;               // false: no row depends on it, so it kept its start
  bool fixed = false;                 // kept at the file's value by request (calibrate --fix)
  bool operator==(const CalibratedParameter&) const = default;
};
struct CalibrationRecord {
  std::int64_t rows = 0;
  std::vector<std::string> files;
  std::string date;                            // YYYY-MM-DD
  std::optional<double> median_error_pct;      // throughput, |error|, in sample
  std::optional<double> loo_median_error_pct;  // throughput, leave-one-out
  std::optional<double> memory_median_error_pct;
  std::optional<double> loo_memory_median_error_pct;
  std::string transferred_from;  // set when the device parameters come from another cluster's fit
  std::vector<CalibratedParameter> parameters;
  bool operator==(const CalibrationRecord&) const = default;
};
nlohmann::json calibration_to_json(const CalibrationRecord& record);
// Reads a "calibration" object (at JSON `path`); InputError naming `source` and the field
// otherwise.
CalibrationRecord calibration_from_json(const nlohmann::json& value, const std::string& source,
                                        const std::string& path = "$.calibration");

struct Cluster {
  std::string name;
  std::int64_t nodes = 1;
  std::int64_t devices_per_node = 1;
  DeviceSpec device;
  LinkClass intra_node;
  std::optional<LinkClass> inter_node;  // required when nodes > 1
  std::vector<ExplicitLink> links;      // when non-empty, replaces the intra-node switch
  std::string source;                   // where the figures come from (datasheet, profile)
  // GPU clusters: the fixed cost of one NCCL collective call (launch and completion, beyond
  // NCCL's own latency model), and the fraction by which compute slows while NCCL kernels run
  // beside it (comm.hpp overlapped_time_s); absent = 0 and kDefaultOverlapSlowdown.
  std::optional<double> collective_launch_us;
  std::optional<double> overlap_slowdown;
  std::optional<CalibrationRecord> calibration;  // set by `loom calibrate`

  std::int64_t device_count() const { return nodes * devices_per_node; }
  bool operator==(const Cluster&) const = default;
};

// `cluster` as it was before `loom calibrate`: every parameter of its calibration record set back
// to the record's `start` (the datasheet value), the record dropped; unchanged without a record.
// What tests of closed-form GPU figures and the fit's prior start from.
Cluster datasheet_cluster(const Cluster& cluster);

// Lee et al., "Characterizing Compute-Communication Overlap in GPU-Accelerated Distributed Deep
// Learning" (arXiv 2507.03114, 2025): compute overlapped with NCCL collectives on A100 and H100
// runs 18.9 % slower on average (GPT and LLaMA layers, 4 GPUs).
constexpr double kDefaultOverlapSlowdown = 0.189;

// The name of device `index` (node-major): "node1/gpu3", or "node0/cpu1" for CPU devices.
std::string device_name(const Cluster& cluster, std::int64_t index);

Cluster cluster_from_json(const nlohmann::json& value, const std::string& source);
nlohmann::json cluster_to_json(const Cluster& cluster);
void validate_cluster(const Cluster& cluster, const std::string& source);

// A copy with `nodes` changed (the --nodes override); validates the result.
Cluster with_nodes(const Cluster& cluster, std::int64_t nodes, const std::string& source);

// A copy with `devices` devices (the --gpus option): one node of that many when `devices` is at
// most devices_per_node, else devices / devices_per_node whole nodes. Explicit links that name a
// device the copy lacks are dropped. InputError (naming `source`) for another count.
Cluster with_devices(const Cluster& cluster, std::int64_t devices, const std::string& source);

// The precision plans default to on `device`: the fastest its peak table has (bf16, else fp16,
// else fp32) on GPUs; fp32 on CPUs, where Loom computes in fp32.
Precision best_precision(const DeviceSpec& device);

// Why `device` cannot run `precision` (its peak table has no rate for it), naming the precision
// it runs best; nullopt when it can.
std::optional<std::string> precision_refusal(const DeviceSpec& device, Precision precision);

}  // namespace loom::profiles
