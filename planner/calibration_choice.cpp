// Which runtime calibration a plan's cluster gets (calibration_choice.hpp).
#include "planner/calibration_choice.hpp"

#include "costmodel/cluster_parameters.hpp"
#include "profiles/errors.hpp"
#include "profiles/loader.hpp"

namespace loom::planner {

CalibratedCluster with_calibration(const profiles::Cluster& cluster, costmodel::Runtime runtime,
                                   const std::optional<std::string>& choice) {
  const std::string runtime_name = costmodel::to_string(runtime);
  if (!choice) {
    if (cluster.calibration) return {cluster, kOwnRecord};
    auto shipped = profiles::shipped_calibration(runtime_name, cluster.device.name);
    if (!shipped) return {cluster, ""};
    return {
        costmodel::apply_calibration(cluster, *shipped, "built-in calibration " + shipped->name),
        shipped->name};
  }
  const profiles::Cluster hardware = profiles::datasheet_cluster(cluster);
  if (*choice == "none") return {hardware, ""};
  const profiles::RuntimeCalibration c = profiles::load_calibration(*choice);
  if (c.runtime != runtime_name) {
    throw InputError("--calibration", "",
                     "a calibration of the plan's runtime, " + runtime_name +
                         " (--runtime), or none; " + c.name + " is of runtime " + c.runtime);
  }
  return {costmodel::apply_calibration(hardware, c, *choice), c.name};
}

std::string calibration_text(const std::string& calibration) {
  if (calibration.empty()) return "none: the cluster's hardware values alone";
  return calibration;
}

}  // namespace loom::planner
