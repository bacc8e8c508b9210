// Which runtime calibration a plan's cluster gets (profiles/runtime_calibration.hpp).
//
// `--calibration` absent: the shipped calibration of the plan's runtime on the cluster's device
// model, if there is one; a cluster file that carries its own calibration record (an older
// `loom calibrate` output) is used as it is. `none`: the cluster's hardware values alone. A name
// or a loom-calibration file: that calibration, on the cluster's datasheet values; it must be of
// the plan's runtime and device model.
#pragma once

#include <optional>
#include <string>

#include "costmodel/strategy.hpp"
#include "profiles/cluster.hpp"

namespace loom::planner {

struct CalibratedCluster {
  profiles::Cluster cluster;
  // The calibration applied ("fsdp-h100", a file's name field); "" for the hardware alone, and
  // kOwnRecord for a cluster file's own calibration record.
  std::string calibration;
};
inline constexpr const char* kOwnRecord = "the cluster file's own";

// InputError naming --calibration (or the file) for an unknown name, another runtime or device,
// or a value outside its range.
CalibratedCluster with_calibration(const profiles::Cluster& cluster, costmodel::Runtime runtime,
                                   const std::optional<std::string>& choice);

// "fsdp-h100", "none: the hardware values alone", "the cluster file's own": for plan texts.
std::string calibration_text(const std::string& calibration);

}  // namespace loom::planner
