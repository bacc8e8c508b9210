// Calibration of a cluster's free parameters against measured training runs (`loom calibrate`).
//
// Parameters (free_parameters()): what the cluster file and the cost model read, each named as
// its JSON field:
//   device.achievable_tflops.<precision>  GEMM ceilings (GPUs with the shape model), else
//   device.matrix_efficiency              the roofline's fraction of peak
//   device.memory_efficiency              memory-bound kernels' fraction of the bandwidth
//   device.attention_efficiency           fused attention's fraction of peak (GPUs)
//   device.fragmentation                  the caching allocator's allowance (GPUs; memory rows)
//   intra_node.bus_bandwidth_gbps, inter_node.bus_bandwidth_gbps   NCCL's ring ceilings
//   intra_node.latency_us, inter_node.latency_us                   per-hop latencies
//   collective_launch_us, overlap_slowdown                         (GPUs)
// Each has a datasheet value: the `start` of the cluster's calibration record when it has one,
// else the cluster's value (or the default the cost model uses without one). The fit starts
// there, so calibrating a calibrated file again gives the same result; it holds each parameter
// in its box (costmodel/cluster_parameters.hpp: a hardware parameter within its stated range
// around the datasheet value, a software one within its definition's bounds), works in
// log(value + offset), and adds a weak prior towards the datasheet value. A parameter no row's
// prediction depends on is "not informed" and keeps the cluster's value.
//
// Fit: robust least squares on relative error. Each measured row gives a throughput residual
// log(predicted / measured) and, where it has one, a memory residual; the loss is soft-L1
// (2 f^2 (sqrt(1 + (r / f)^2) - 1), f = loss_scale), minimised by Levenberg-Marquardt with a
// forward-difference Jacobian and reweighting (IRLS). Uncertainty: the diagonal of
// (J^T W J + prior)^-1 scaled by the weighted residual variance, taken back to value units.
// Leave-one-out: each row predicted by a fit of the other rows, warm-started from the full fit
// and iterated to convergence, so the left-out row's measurement does not enter its prediction.
// LibTorch-free.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "lab/published_rows.hpp"
#include "profiles/cluster.hpp"
#include "profiles/runtime_calibration.hpp"

namespace loom::fit {

struct ParameterSpec {
  std::string name;
  double start = 0;   // the cluster's value, or the cost model's default without one
  double centre = 0;  // the prior's centre
  double lower = 0;   // box
  double upper = 0;
  double offset = 0;      // fitted as log(value + offset): > 0 where 0 is a valid value
  bool hardware = false;  // a hardware parameter: its box is the stated range around the datasheet
};

// The free parameters of `cluster` (the list in the header comment, those it has).
std::vector<ParameterSpec> free_parameters(const profiles::Cluster& cluster);

// `cluster` with parameter i set to values[i].
profiles::Cluster with_parameters(const profiles::Cluster& cluster,
                                  const std::vector<ParameterSpec>& parameters,
                                  const std::vector<double>& values);

struct FitOptions {
  double loss_scale = 0.1;  // soft-L1 scale f, in log error (about 10 %)
  // The prior's standard deviation in log(value + offset), relative to a row off by loss_scale:
  // moving a parameter by prior_sigma costs what one such row does.
  double prior_sigma = 1.0;
  int max_iterations = 100;
  double step_tolerance = 1e-7;  // stop when no log-parameter moves more than this
  bool leave_one_out = true;
  // Parameters (free_parameters() names) kept at the cluster's values, not fitted.
  std::vector<std::string> fixed;
};

struct ParameterFit {
  std::string name;
  double start = 0;
  double value = 0;
  double uncertainty = 0;  // one standard deviation, in value units (0 when not informed)
  bool informed = true;
  bool fixed = false;  // FitOptions::fixed: the cluster's value, kept
};

// One measured row's predictions: in sample (the full fit) and leave-one-out.
struct RowFit {
  std::string id;
  std::string file;
  std::string unit;
  double measured = 0;  // 0 without a measured throughput
  double predicted = 0;
  double loo_predicted = 0;
  std::optional<double> measured_memory_gib;
  double predicted_memory_gib = 0;
  double loo_predicted_memory_gib = 0;
  std::optional<double> error_pct() const;  // (predicted - measured) / measured, in percent
  std::optional<double> loo_error_pct() const;
  std::optional<double> memory_error_pct() const;
  std::optional<double> loo_memory_error_pct() const;
};

struct FitResult {
  std::vector<ParameterFit> parameters;
  profiles::Cluster cluster;  // the input cluster with the fitted values
  std::vector<RowFit> rows;   // every row with a residual, in input order
  int iterations = 0;
  // Median |error| over the rows, in percent (nullopt without such rows).
  std::optional<double> median_error_pct;
  std::optional<double> loo_median_error_pct;
  std::optional<double> memory_median_error_pct;
  std::optional<double> loo_memory_median_error_pct;
};

// A row of RUNS that calibrate cannot use, and why: "fsdp_blog.json $.rows[3] (id): fp8 ...".
struct SkippedRow {
  std::string where;
  std::string reason;
};
struct Runs {
  std::vector<published::PreparedRow> rows;  // usable, prepared on the cluster
  std::vector<SkippedRow> skipped;
  std::vector<std::string> files;  // file names (without folders) with at least one usable row
};
// Reads measured runs for `cluster` from JSON or JSONL files: a published document ({"rows":
// [...]}, bench/published/README.md), one published row (with "model"), an array of them, or a
// `loom validate --json` document that carries its plan ("plan": loom-plan/1, "measured":
// {"step_time_s", "peak_memory_bytes"}), predicted as runtime loom on `cluster` with the plan's
// strategy, stages and rank mapping; JSONL: one such object per line. Rows that are not usable
// (another GPU, dp x tp x pp not the GPU count, a runtime or setting Loom does not model, no
// measurement, out of memory, doubtful, a malformed field) are skipped, each with its reason.
// InputError only for a file that cannot be read.
Runs read_runs(const std::vector<std::string>& paths, const profiles::Cluster& cluster);

// Whether a prepared row gives a residual: expressible, not doubtful, not out of memory, with a
// measured throughput or memory.
bool usable(const published::PreparedRow& row);

// Fits `cluster`'s free parameters to `rows` (prepared on `cluster`, every one usable());
// std::invalid_argument without rows.
FitResult calibrate(const profiles::Cluster& cluster,
                    const std::vector<published::PreparedRow>& rows,
                    const FitOptions& options = {});

// `cluster` with the calibration record of `fit` (rows, files, date, errors, parameters).
profiles::Cluster with_record(const FitResult& fit, const std::vector<std::string>& files,
                              const std::string& date);

// The fit as a runtime calibration (loom-calibration/1) named `name` of `runtime` on the fitted
// cluster's device: every informed or fixed parameter's value, and the record with_record writes.
profiles::RuntimeCalibration runtime_calibration(const FitResult& fit,
                                                 const std::vector<std::string>& files,
                                                 const std::string& date, const std::string& name,
                                                 const std::string& runtime,
                                                 const std::string& stack);

// `target` (another cluster of the same GPU die) with the device parameters of `fit`, each as
// the ratio fitted / start times the target's own value, and a record naming `from`.
profiles::Cluster transfer_device_parameters(const FitResult& fit, const profiles::Cluster& target,
                                             const std::string& from,
                                             const std::vector<std::string>& files,
                                             const std::string& date);

}  // namespace loom::fit
