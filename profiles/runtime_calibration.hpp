// A runtime calibration (loom-calibration/1): what one software stack adds to the hardware a
// cluster file describes, fitted by `loom calibrate --runtime` to measured runs of that stack.
//
// Cluster files hold the hardware: datasheet and microbenchmark values (GEMM ceilings, NCCL bus
// bandwidths, latencies). A calibration holds, for one runtime (loom, fsdp, deepspeed, megatron,
// nemo) on one device model, the values its fit gave: the software parameters (host time per
// kernel and per pass, the compute slowdown under overlapped communication, the efficiency of
// its memory-bound and attention kernels, its allocator's allowance), and the hardware
// parameters it moved inside their stated ranges (costmodel/cluster_parameters.hpp). A plan
// applies the one its runtime and device select, or the one the user names, or none.
//
// JSON: {"format": "loom-calibration/1", "name", "runtime", "device", "stack" (words: the stack
// the rows ran), "parameters": {cluster parameter name: value}, "record": the fit's record
// (cluster.hpp CalibrationRecord: rows, files, date, errors, each parameter's start and value)}.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "profiles/cluster.hpp"

namespace loom::profiles {

struct RuntimeCalibration {
  std::string name;     // "fsdp-h100"
  std::string runtime;  // a costmodel::runtime_names() entry
  std::string device;   // DeviceSpec::name of the device it was fitted on ("H100-SXM5-80GB")
  std::string stack;    // "PyTorch FSDP as llm-foundry and fms-fsdp run it"
  // Cluster parameters by name ("device.memory_efficiency", "overlap_slowdown"), in file order.
  std::vector<std::pair<std::string, double>> parameters;
  std::optional<CalibrationRecord> record;
  bool operator==(const RuntimeCalibration&) const = default;
};

// Reads and checks the fields' types; parameter names and ranges are checked where the
// calibration is applied (costmodel::apply_calibration). InputError naming `source` and the field.
RuntimeCalibration runtime_calibration_from_json(const nlohmann::json& value,
                                                 const std::string& source);
nlohmann::json runtime_calibration_to_json(const RuntimeCalibration& calibration);

}  // namespace loom::profiles
