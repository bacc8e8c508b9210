// The named parameters of a cluster that calibrations set and `loom calibrate` fits, each with the
// box a value must stay in.
//
// Hardware parameters describe the machine and come from datasheets and microbenchmarks; a cluster
// file holds them, and a calibration may move them only inside a stated range around the file's
// value:
//   device.achievable_tflops.<p>   0.9-1.1 times the file's GEMM ceiling, at most the peak: the
//                                  ceilings are one machine's mamf-finder or cuBLAS figures, and
//                                  machines of one card differ by a few per cent in clock and power
//   <scope>.bus_bandwidth_gbps     0.85-1.1 times the file's NCCL bus bandwidth, at most the link's
//                                  rate: nccl-tests' figures on one fabric, which Loom's NCCL model
//                                  predicts within 6.4 % median (bench/RESULTS.md, Collectives)
//   <scope>.latency_us, collective_launch_us   0.5-2 times the file's value (microseconds, where a
//                                  factor of two is within the spread of nccl-tests' small sizes)
// Software parameters describe what a runtime and its libraries add (host time per kernel and per
// pass, the slowdown of compute under overlapped communication, the efficiency of its memory-bound
// and attention kernels, its allocator's allowance and context); they live in runtime calibrations
// (profiles/runtime_calibration.hpp) and keep the wide boxes of their definitions (fractions in
// (0, 1], times up to a millisecond or 100 ms a pass).
#pragma once

#include <string>
#include <vector>

#include "profiles/cluster.hpp"
#include "profiles/runtime_calibration.hpp"

namespace loom::costmodel {

enum class ParameterKind { kHardware, kSoftware };

struct ClusterParameter {
  std::string name;  // "device.achievable_tflops.bf16", "overlap_slowdown", ...
  ParameterKind kind = ParameterKind::kSoftware;
  double value = 0;  // the cluster's (or the cost model's default where the file has none)
  double lower = 0;  // box
  double upper = 0;
  double offset = 0;  // a fit works in log(value + offset): > 0 where 0 is a valid value
};

// The parameters of `cluster` (those its device and links have), in a fixed order, with boxes
// around its values: hardware ranges as the header says, software boxes as their definitions.
std::vector<ClusterParameter> cluster_parameters(const profiles::Cluster& cluster);

// The value of parameter `name` of `cluster`; std::invalid_argument for a name it does not have.
double cluster_parameter(const profiles::Cluster& cluster, const std::string& name);
// Sets it; std::invalid_argument for a name it does not have.
void set_cluster_parameter(profiles::Cluster& cluster, const std::string& name, double value);

// `cluster` (hardware values) with `calibration`'s parameters set (inter-node ones only where the
// cluster has more than one node's link class). InputError naming `source` and
// "$.parameters.<name>" for a parameter the cluster does not have or a value outside its box
// (a hardware value outside the range around `cluster`'s), and "$.device" when the calibration
// was fitted on another device model.
profiles::Cluster apply_calibration(const profiles::Cluster& cluster,
                                    const profiles::RuntimeCalibration& calibration,
                                    const std::string& source);

}  // namespace loom::costmodel
