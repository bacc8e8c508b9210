// The free parameters of a cluster and how a value reaches the cluster (fit.hpp).
#include <algorithm>
#include <stdexcept>

#include "costmodel/cluster_parameters.hpp"
#include "lab/fit.hpp"

namespace loom::fit {

using profiles::Cluster;

std::vector<ParameterSpec> free_parameters(const Cluster& cluster) {
  // Boxes around the datasheet values (a calibrated file's record keeps them), so that a fit of
  // a calibrated file cannot carry a hardware value further out at each re-run.
  const std::vector<costmodel::ClusterParameter> datasheet =
      costmodel::cluster_parameters(profiles::datasheet_cluster(cluster));
  std::vector<ParameterSpec> out;
  for (const costmodel::ClusterParameter& d : datasheet) {
    ParameterSpec p;
    p.name = d.name;
    p.start = std::clamp(costmodel::cluster_parameter(cluster, d.name), d.lower, d.upper);
    p.centre = d.value;
    p.lower = d.lower;
    p.upper = d.upper;
    p.offset = d.offset;
    p.hardware = d.kind == costmodel::ParameterKind::kHardware;
    out.push_back(p);
  }
  return out;
}

Cluster with_parameters(const Cluster& cluster, const std::vector<ParameterSpec>& parameters,
                        const std::vector<double>& values) {
  Cluster c = cluster;
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    costmodel::set_cluster_parameter(c, parameters[i].name, values[i]);
  }
  return c;
}

}  // namespace loom::fit
