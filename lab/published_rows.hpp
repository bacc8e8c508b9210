// Published and measured training rows in Loom's terms, and Loom's predictions beside them.
//
// A row (bench/published/README.md gives the schema) describes one published training run: the
// model, the GPUs, the strategy as run, the framework and what was measured. map_row() turns it
// into Loom's terms (model, cluster, job, strategy, cost options) or says why Loom cannot express
// it (fp8, an unknown GPU, checkpointing every n-th block, ...);
// predict_row() runs the analytical estimate on it and sets the prediction beside the measured
// figures in the row's own unit; summarize() gives each file's median |error| and the share of
// its pairs that the model orders as measured. LibTorch-free.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "costmodel/estimate.hpp"
#include "profiles/cluster.hpp"
#include "profiles/model_spec.hpp"

namespace loom::published {

// How a row's cluster is made from a cluster file: that many GPUs (with_devices), the row's GPUs
// per node, inter-node rate (the bus-bandwidth ceiling scaled with it) and device memory.
struct ClusterSizing {
  std::int64_t gpus = 1;
  std::optional<std::int64_t> gpus_per_node;
  std::optional<double> inter_node_gbps;
  std::optional<double> memory_gib;
};
// Throws InputError (naming `file`) when the GPU count does not fit the cluster.
profiles::Cluster sized_cluster(const profiles::Cluster& base, const ClusterSizing& sizing,
                                const std::string& file);

// A row in Loom's terms. `assumptions` lists what the mapping had to assume or leave out
// ("biases not modelled", "a DGX-2 assumed for an unstated V100 node"), in words.
struct RowMapping {
  profiles::ModelSpec model;
  profiles::Cluster cluster;
  costmodel::Job job;
  costmodel::Strategy strategy;
  costmodel::CostOptions options;
  std::vector<std::string> assumptions;
  std::string cluster_file;  // the cluster the row was sized from (its name)
  ClusterSizing sizing;      // cluster = sized_cluster(that cluster, sizing)
  // The figure was timed over steps that overflowed the fp16 loss scale, which the runtime skips
  // (RuntimeRules::overflow_skipped_s): DeepSpeed's autotuner metric of an fp16 run, timed over
  // steps 3-5, while the default initial loss scale of 2^32 overflows for the first 16 or so.
  bool timed_overflowed_steps = false;
};

// The mapping, or the reason the row cannot be expressed. Throws InputError (naming `file` and
// the row's JSON path) when a field has the wrong type or a required one is missing. The cluster
// is the shipped file for the row's GPU, or `cluster` when given (the row's GPU must be its
// device, else that is the reason).
using MappedRow = std::variant<RowMapping, std::string>;
MappedRow map_row(const nlohmann::json& row, const std::string& file, const std::string& path,
                  const profiles::Cluster* cluster = nullptr);

// One row's outcome. Throughput is in `unit`, the row's own: "tokens_per_s_per_gpu" (per GPU),
// "samples_per_s" (the whole system) or "samples_per_s_per_gpu", the first the row measured.
struct RowResult {
  std::string id;
  std::string file;
  // Rows with the same key train the same model at the same sequence length on the same GPUs
  // and differ only in how (micro-batch, ZeRO stage, recomputation, framework): "name|gpu|n|seq".
  std::string job_key;
  std::optional<std::string> not_expressible;  // the reason; nothing else is set then
  bool oom = false;                            // the source says it did not fit or run
  bool doubtful = false;                       // the source contradicts itself (summary skips it)
  std::string unit;
  double measured = 0;   // 0 for oom rows
  double predicted = 0;  // in `unit`
  std::optional<double> measured_memory_gib;
  std::string memory_kind;  // what the source read, as it says
  double predicted_memory_gib = 0;
  double device_memory_gib = 0;
  bool predicted_fits = true;  // the predicted peak is within the device's memory
  std::vector<std::string> assumptions;
  std::optional<RowMapping> mapping;  // what was predicted (absent when not expressible)
  costmodel::Prediction prediction;

  // (predicted - measured) / measured in percent; nullopt without a measurement.
  std::optional<double> throughput_error_pct() const;
  std::optional<double> memory_error_pct() const;
};

// Maps and predicts `row` of `file` (the pipeline partition is the planner's balanced one for
// pp > 1) on the shipped cluster of its GPU, or on `cluster` (map_row()).
RowResult predict_row(const nlohmann::json& row, const std::string& file, const std::string& path,
                      const profiles::Cluster* cluster = nullptr);

// A row mapped and predicted once (`result`), with what predicting it again on the same cluster
// with other parameter values keeps: the rank-to-device mapping and the stage partition.
struct PreparedRow {
  RowResult result;  // mapping absent: not expressible (result.not_expressible says why)
  std::vector<int> device_of_rank;
  std::vector<costmodel::StageRange> stages;
};
PreparedRow prepare_row(const nlohmann::json& row, const std::string& file, const std::string& path,
                        const profiles::Cluster* cluster = nullptr);

// A prediction in the row's units: throughput in its `unit`, memory as its source read it (the
// allocator's reserved bytes when memory_kind names the allocator, else the device's total).
struct RowFigures {
  double throughput = 0;
  double memory_gib = 0;
  bool fits = true;  // the predicted peak is within the device's memory
  costmodel::Prediction prediction;
};
// Predicts a prepared, expressible row on `cluster_file`: the cluster it was mapped with, its
// parameters changed (sized as the row ran, result.mapping->sizing). Throws what estimate() throws.
RowFigures predict_prepared(const PreparedRow& row, const profiles::Cluster& cluster_file);

// Every training row of the file prepared (on `cluster` when given); InputError as predict_file.
std::vector<PreparedRow> prepare_file(const nlohmann::json& document, const std::string& file,
                                      const profiles::Cluster* cluster = nullptr);

// Every training row of the file (its "rows" array); InputError naming the file when it has none.
std::vector<RowResult> predict_file(const nlohmann::json& document, const std::string& file);

// The share of pairs ordered as measured: pairs (i, j) whose measured values differ by more than
// 5 % (the larger above 1.05 times the smaller) count, and are ordered when the prediction puts
// them the same way round. nullopt when no pair counts. Entries are (measured, predicted).
struct OrderingShare {
  std::int64_t pairs = 0;
  std::int64_t ordered = 0;
  std::optional<double> share() const;
};
OrderingShare ordering_share(const std::vector<std::pair<double, double>>& points);

// A file's figures over its predicted, not doubtful rows with a measurement; ordering within
// each throughput unit, pooled, and again within each job (same job_key): the close calls.
struct FileSummary {
  std::string file;
  std::int64_t num_rows = 0;
  std::int64_t num_predicted = 0;  // expressible rows with a measured throughput
  std::int64_t num_not_expressible = 0;
  std::int64_t num_oom = 0;
  std::int64_t num_oom_agreeing = 0;  // oom rows the model also says do not fit
  std::int64_t num_doubtful = 0;
  std::int64_t num_ran_predicted_not_to_fit = 0;      // measured runs the model says do not fit
  std::optional<double> median_throughput_error_pct;  // median of |error|
  std::int64_t num_memory = 0;
  std::optional<double> median_memory_error_pct;
  OrderingShare ordering;
  OrderingShare ordering_same_job;
};
FileSummary summarize(const std::string& file, const std::vector<RowResult>& rows);

// The median of `values` (the mean of the middle two for an even count); nullopt when empty.
std::optional<double> median(std::vector<double> values);

// The row's outcome; with `detail`, also its mapping (model, cluster, job, strategy, cost
// options) and the whole prediction (stage memory, exposed communication).
nlohmann::json row_to_json(const RowResult& row, bool detail);
nlohmann::json summary_to_json(const FileSummary& summary);

}  // namespace loom::published
