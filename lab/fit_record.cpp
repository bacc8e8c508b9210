// The calibration record a fit writes into a cluster, and device parameters carried to another
// cluster of the same GPU die (fit.hpp).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "lab/fit.hpp"

namespace loom::fit {

namespace {

// Four significant digits: the record and the fitted values stay readable, and a re-run that
// converges to the same optimum writes the same file.
double rounded(double value) {
  if (value == 0 || !std::isfinite(value)) return value;
  char text[32];
  std::snprintf(text, sizeof text, "%.4g", value);
  return std::strtod(text, nullptr);
}

profiles::CalibrationRecord record_of(const FitResult& fit, const std::vector<std::string>& files,
                                      const std::string& date) {
  profiles::CalibrationRecord record;
  for (const RowFit& r : fit.rows) record.rows += r.error_pct() || r.memory_error_pct() ? 1 : 0;
  record.files = files;
  record.date = date;
  auto put = [](const std::optional<double>& v) {
    return v ? std::optional<double>(rounded(*v)) : std::nullopt;
  };
  record.median_error_pct = put(fit.median_error_pct);
  record.loo_median_error_pct = put(fit.loo_median_error_pct);
  record.memory_median_error_pct = put(fit.memory_median_error_pct);
  record.loo_memory_median_error_pct = put(fit.loo_memory_median_error_pct);
  return record;
}

}  // namespace

profiles::Cluster with_record(const FitResult& fit, const std::vector<std::string>& files,
                              const std::string& date) {
  // The fitted cluster with its values rounded as the record shows them.
  std::vector<ParameterSpec> specs;
  std::vector<double> values;
  for (const ParameterFit& p : fit.parameters) {
    if (!p.informed) continue;
    specs.push_back({p.name, p.start, p.start, 0, 0, 0});
    values.push_back(rounded(p.value));
  }
  profiles::Cluster out = with_parameters(fit.cluster, specs, values);
  profiles::CalibrationRecord record = record_of(fit, files, date);
  for (const ParameterFit& p : fit.parameters) {
    profiles::CalibratedParameter c;
    c.name = p.name;
    c.start = p.start;
    c.value = p.informed ? rounded(p.value) : p.fixed ? p.value : p.start;
    if (p.informed) c.uncertainty = rounded(p.uncertainty);
    c.informed = p.informed || p.fixed;
    c.fixed = p.fixed;
    record.parameters.push_back(c);
  }
  out.calibration = record;
  return out;
}

profiles::RuntimeCalibration runtime_calibration(const FitResult& fit,
                                                 const std::vector<std::string>& files,
                                                 const std::string& date, const std::string& name,
                                                 const std::string& runtime,
                                                 const std::string& stack) {
  profiles::RuntimeCalibration out;
  out.name = name;
  out.runtime = runtime;
  out.device = fit.cluster.device.name;
  out.stack = stack;
  out.record = with_record(fit, files, date).calibration;
  for (const profiles::CalibratedParameter& p : out.record->parameters) {
    if (p.informed) out.parameters.emplace_back(p.name, p.value);
  }
  return out;
}

profiles::Cluster transfer_device_parameters(const FitResult& fit, const profiles::Cluster& target,
                                             const std::string& from,
                                             const std::vector<std::string>& files,
                                             const std::string& date) {
  const std::vector<ParameterSpec> own = free_parameters(target);
  std::vector<ParameterSpec> specs;
  std::vector<double> values;
  profiles::CalibrationRecord record = record_of(fit, files, date);
  record.transferred_from = from;
  for (const ParameterFit& p : fit.parameters) {
    if (!p.informed || p.name.rfind("device.", 0) != 0 || p.start <= 0) continue;
    for (const ParameterSpec& t : own) {
      if (t.name != p.name) continue;
      const double value = rounded(std::clamp(t.centre * p.value / p.start, t.lower, t.upper));
      specs.push_back(t);
      values.push_back(value);
      record.parameters.push_back({p.name, t.centre, value, std::nullopt, true});
    }
  }
  // The target's own record entries of what was not carried stay, so that its datasheet values
  // (their starts) survive for a later calibration of the target itself.
  if (target.calibration) {
    for (const profiles::CalibratedParameter& p : target.calibration->parameters) {
      const bool carried =
          std::any_of(record.parameters.begin(), record.parameters.end(),
                      [&](const profiles::CalibratedParameter& q) { return q.name == p.name; });
      if (!carried) record.parameters.push_back(p);
    }
  }
  profiles::Cluster out = with_parameters(target, specs, values);
  out.calibration = record;
  return out;
}

}  // namespace loom::fit
