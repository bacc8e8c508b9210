// Predicting published rows and summarising a file's errors and ordering (published_rows.hpp).
#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "costmodel/runtime.hpp"
#include "lab/published_rows.hpp"
#include "planner/mapping.hpp"
#include "planner/partition.hpp"
#include "planner/search.hpp"
#include "profiles/errors.hpp"
#include "profiles/model_spec.hpp"

namespace loom::published {

namespace {

constexpr double kGib = 1024.0 * 1024.0 * 1024.0;

// Measured throughput units, in the order a row's first one is taken. Model TFLOP/s per GPU only
// where a source publishes nothing else (NeMo's long-sequence table), counted as NeMo counts it.
constexpr const char* kUnits[] = {"tokens_per_s_per_gpu", "samples_per_s", "samples_per_s_per_gpu",
                                  "model_tflops_per_gpu"};

// Model FLOPs per token as NeMo's nemo/utils/flops_formulas.py counts them for GPT-3 and Llama:
// 6 x (the transformer layers' matrix weights + the output layer's) + 12 s h L, the attention
// scores and their weighted sum over the whole s x s grid (no causal halving), norms, biases and
// the input embedding left out.
double nemo_flops_per_token(const profiles::ModelSpec& m, double seq) {
  const double h = static_cast<double>(m.hidden);
  const double f = static_cast<double>(m.ffn_hidden);
  const double kv = h * static_cast<double>(m.key_value_heads()) / static_cast<double>(m.heads);
  const double layer = h * (h + 2 * kv) + h * h + (m.gated_mlp ? 3 : 2) * h * f;
  const double layers = static_cast<double>(m.layers);
  return 6 * (layers * layer + static_cast<double>(m.vocab) * h) + 12 * seq * h * layers;
}

double predicted_in(const std::string& unit, const costmodel::Prediction& p, double gpus,
                    const RowMapping& m) {
  if (unit == "tokens_per_s_per_gpu") return p.tokens_per_s / gpus;
  if (unit == "samples_per_s_per_gpu") return p.samples_per_s / gpus;
  if (unit == "model_tflops_per_gpu") {
    return p.tokens_per_s / gpus *
           nemo_flops_per_token(m.model, static_cast<double>(m.job.seq_len)) / 1e12;
  }
  return p.samples_per_s;
}

std::string text_or(const nlohmann::json& object, const char* key, const std::string& fallback) {
  auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : fallback;
}

bool flag(const nlohmann::json& object, const char* key) {
  auto it = object.find(key);
  return it != object.end() && it->is_boolean() && it->get<bool>();
}

// The measured throughput (first unit present) and memory of `row` into `out`.
void read_measured(const nlohmann::json& row, const std::string& file, const std::string& path,
                   RowResult* out) {
  auto it = row.find("measured");
  if (it == row.end() || it->is_null()) return;
  if (!it->is_object()) throw InputError(file, path + ".measured", "expected an object");
  for (const char* unit : kUnits) {
    auto v = it->find(unit);
    if (v == it->end() || v->is_null()) continue;
    if (!v->is_number() || v->get<double>() <= 0) {
      throw InputError(file, path + ".measured." + unit, "expected a number > 0");
    }
    out->unit = unit;
    out->measured = v->get<double>();
    break;
  }
  auto memory = it->find("memory_gib");
  if (memory != it->end() && !memory->is_null()) {
    if (!memory->is_number() || memory->get<double>() <= 0) {
      throw InputError(file, path + ".measured.memory_gib", "expected a number > 0");
    }
    out->measured_memory_gib = memory->get<double>();
    out->memory_kind = text_or(*it, "memory_kind", "");
  }
}

}  // namespace

std::optional<double> RowResult::throughput_error_pct() const {
  if (not_expressible || measured <= 0) return std::nullopt;
  return (predicted - measured) / measured * 100;
}

std::optional<double> RowResult::memory_error_pct() const {
  if (not_expressible || !measured_memory_gib) return std::nullopt;
  return (predicted_memory_gib - *measured_memory_gib) / *measured_memory_gib * 100;
}

namespace {

// The prediction as the row's figure timed it: less what a step skipped on fp16 overflow leaves
// out when the figure was timed over such steps (RowMapping::timed_overflowed_steps).
costmodel::Prediction as_timed(const RowMapping& m, costmodel::Prediction p) {
  if (!m.timed_overflowed_steps) return p;
  const costmodel::RuntimeRules rules = costmodel::runtime_rules(m.job.runtime);
  if (rules.overflow_skipped_s == nullptr) return p;
  const double skipped =
      rules.overflow_skipped_s(m.strategy, p.optimizer_s, p.exposed_communication_s.zero);
  const double timed_s = p.step_time_s - skipped;
  if (skipped <= 0 || timed_s <= 0) return p;
  const double faster = p.step_time_s / timed_s;
  p.step_time_s = timed_s;
  p.samples_per_s *= faster;
  p.tokens_per_s *= faster;
  p.model_tflops_per_gpu *= faster;
  p.hardware_tflops_per_gpu *= faster;
  p.mfu *= faster;
  return p;
}

// `p` in the row's units: throughput, and the memory the row's source read (allocator or device).
RowFigures figures_of(const RowResult& row, const RowMapping& m, const costmodel::Prediction& raw,
                      const profiles::Cluster& cluster) {
  const costmodel::Prediction p = as_timed(m, raw);
  RowFigures out;
  out.throughput = predicted_in(row.unit, p, static_cast<double>(cluster.device_count()), m);
  // What the caching allocator hands out is the tensors; what it reserves adds its fragmentation;
  // what the device shows as used adds the CUDA context, workspaces and NCCL buffers (the plan's
  // total).
  const bool allocated = row.memory_kind.find("allocated") != std::string::npos;
  double allocator_bytes = 0;
  for (const costmodel::MemoryBreakdown& b : p.memory_by_stage) {
    allocator_bytes =
        std::max(allocator_bytes, b.tensor_bytes() + (allocated ? 0 : b.fragmentation_bytes));
  }
  const bool allocator = row.memory_kind.find("allocator") != std::string::npos;
  out.memory_gib = (allocator ? allocator_bytes : p.peak_memory_bytes) / kGib;
  out.fits = p.peak_memory_bytes <= static_cast<double>(cluster.device.memory_bytes);
  out.prediction = p;
  return out;
}

void set_figures(const RowFigures& f, const profiles::Cluster& cluster, RowResult* out) {
  out->predicted = f.throughput;
  out->predicted_memory_gib = f.memory_gib;
  out->device_memory_gib = static_cast<double>(cluster.device.memory_bytes) / kGib;
  out->predicted_fits = f.fits;
  out->prediction = f.prediction;
}

}  // namespace

RowFigures predict_prepared(const PreparedRow& row, const profiles::Cluster& cluster_file) {
  const RowMapping& m = *row.result.mapping;
  const profiles::Cluster cluster = sized_cluster(cluster_file, m.sizing, row.result.file);
  const costmodel::CostModel cost(m.model, cluster, m.options, row.device_of_rank);
  return figures_of(row.result, m, cost.estimate(m.job, m.strategy, row.stages), cluster);
}

PreparedRow prepare_row(const nlohmann::json& row, const std::string& file, const std::string& path,
                        const profiles::Cluster* cluster) {
  if (!row.is_object()) throw InputError(file, path, "expected an object");
  PreparedRow prepared;
  RowResult& out = prepared.result;
  out.file = file;
  out.id = text_or(row, "id", path);
  if (auto model = row.find("model"); model != row.end() && model->is_object()) {
    out.job_key = text_or(*model, "name", "") + "|" + text_or(row, "gpu", "") + "|" +
                  row.value("gpus", nlohmann::json()).dump() + "|" +
                  model->value("seq_len", nlohmann::json()).dump();
  }
  out.oom = flag(row, "oom");
  out.doubtful = flag(row, "doubtful");
  read_measured(row, file, path, &out);
  MappedRow mapped = map_row(row, file, path, cluster);
  if (auto* why = std::get_if<std::string>(&mapped)) {
    out.not_expressible = *why;
    return prepared;
  }
  const RowMapping& m = std::get<RowMapping>(mapped);
  out.assumptions = m.assumptions;
  try {
    // As the planner predicts a pinned strategy: its rank-to-device mapping, and for pp > 1 the
    // balanced partition within its memory margin when that is faster than the even one.
    const costmodel::CostModel base(m.model, m.cluster, m.options);
    const costmodel::CostModel cost =
        base.with_mapping(planner::map_ranks(base.topology(), m.cluster, m.strategy));
    const double memory = static_cast<double>(m.cluster.device.memory_bytes);
    prepared.stages = costmodel::even_partition(m.model, m.strategy.pp * m.strategy.virtual_stages);
    costmodel::Prediction p = cost.estimate(m.job, m.strategy, prepared.stages);
    if (m.strategy.pp > 1 && m.strategy.schedule != costmodel::Schedule::kInterleaved) {
      const double limit = planner::SearchOptions{}.memory_margin * memory;
      if (auto balanced = planner::balanced_partition(cost, m.job, m.strategy, limit)) {
        costmodel::Prediction q = cost.estimate(m.job, m.strategy, *balanced);
        if (q.step_time_s < p.step_time_s) {
          p = q;
          prepared.stages = *balanced;
        }
      }
    }
    prepared.device_of_rank = cost.device_of_rank();
    set_figures(figures_of(out, m, p, m.cluster), m.cluster, &out);
    out.mapping = m;
  } catch (const std::invalid_argument& e) {
    out.not_expressible = e.what();
  } catch (const InputError& e) {
    out.not_expressible = e.what();
  }
  return prepared;
}

RowResult predict_row(const nlohmann::json& row, const std::string& file, const std::string& path,
                      const profiles::Cluster* cluster) {
  return prepare_row(row, file, path, cluster).result;
}

std::vector<RowResult> predict_file(const nlohmann::json& document, const std::string& file) {
  std::vector<RowResult> out;
  for (PreparedRow& r : prepare_file(document, file)) out.push_back(std::move(r.result));
  return out;
}

std::vector<PreparedRow> prepare_file(const nlohmann::json& document, const std::string& file,
                                      const profiles::Cluster* cluster) {
  auto rows = document.is_object() ? document.find("rows") : document.end();
  if (!document.is_object() || rows == document.end() || !rows->is_array() || rows->empty()) {
    throw InputError(file, "$.rows", "expected a non-empty array of training rows");
  }
  std::vector<PreparedRow> out;
  for (std::size_t i = 0; i < rows->size(); ++i) {
    out.push_back(prepare_row((*rows)[i], file, "$.rows[" + std::to_string(i) + "]", cluster));
  }
  return out;
}

std::optional<double> OrderingShare::share() const {
  if (pairs == 0) return std::nullopt;
  return static_cast<double>(ordered) / static_cast<double>(pairs);
}

OrderingShare ordering_share(const std::vector<std::pair<double, double>>& points) {
  OrderingShare out;
  for (std::size_t i = 0; i < points.size(); ++i) {
    for (std::size_t j = i + 1; j < points.size(); ++j) {
      const auto& [mi, pi] = points[i];
      const auto& [mj, pj] = points[j];
      if (std::max(mi, mj) <= 1.05 * std::min(mi, mj)) continue;
      ++out.pairs;
      if ((mi > mj) == (pi > pj) && pi != pj) ++out.ordered;
    }
  }
  return out;
}

std::optional<double> median(std::vector<double> values) {
  if (values.empty()) return std::nullopt;
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

FileSummary summarize(const std::string& file, const std::vector<RowResult>& rows) {
  FileSummary s;
  s.file = file;
  s.num_rows = static_cast<std::int64_t>(rows.size());
  std::vector<double> throughput_errors;
  std::vector<double> memory_errors;
  std::map<std::string, std::vector<std::pair<double, double>>> by_unit;
  std::map<std::string, std::vector<std::pair<double, double>>> by_job;
  for (const RowResult& r : rows) {
    if (r.not_expressible) {
      ++s.num_not_expressible;
      continue;
    }
    if (r.doubtful) {
      ++s.num_doubtful;
      continue;
    }
    if (r.oom) {
      ++s.num_oom;
      if (!r.predicted_fits) ++s.num_oom_agreeing;
      continue;
    }
    if (!r.predicted_fits) ++s.num_ran_predicted_not_to_fit;
    if (auto e = r.throughput_error_pct()) {
      ++s.num_predicted;
      throughput_errors.push_back(std::abs(*e));
      by_unit[r.unit].emplace_back(r.measured, r.predicted);
      by_job[r.unit + "|" + r.job_key].emplace_back(r.measured, r.predicted);
    }
    if (auto e = r.memory_error_pct()) memory_errors.push_back(std::abs(*e));
  }
  s.median_throughput_error_pct = median(throughput_errors);
  s.num_memory = static_cast<std::int64_t>(memory_errors.size());
  s.median_memory_error_pct = median(memory_errors);
  for (const auto& [unit, points] : by_unit) {
    OrderingShare o = ordering_share(points);
    s.ordering.pairs += o.pairs;
    s.ordering.ordered += o.ordered;
  }
  for (const auto& [job, points] : by_job) {
    OrderingShare o = ordering_share(points);
    s.ordering_same_job.pairs += o.pairs;
    s.ordering_same_job.ordered += o.ordered;
  }
  return s;
}

nlohmann::json row_to_json(const RowResult& r, bool detail) {
  nlohmann::json j = {{"id", r.id}, {"file", r.file}, {"oom", r.oom}, {"doubtful", r.doubtful}};
  if (r.not_expressible) {
    j["not_expressible"] = *r.not_expressible;
    return j;
  }
  if (!r.unit.empty()) {
    j["unit"] = r.unit;
    j["measured"] = r.measured;
    j["predicted"] = r.predicted;
    j["error_pct"] = *r.throughput_error_pct();
  }
  if (r.measured_memory_gib) {
    j["measured_memory_gib"] = *r.measured_memory_gib;
    j["memory_kind"] = r.memory_kind;
    j["memory_error_pct"] = *r.memory_error_pct();
  }
  j["predicted_memory_gib"] = r.predicted_memory_gib;
  j["device_memory_gib"] = r.device_memory_gib;
  j["predicted_fits"] = r.predicted_fits;
  j["assumptions"] = r.assumptions;
  if (detail && r.mapping) {
    const RowMapping& m = *r.mapping;
    j["model"] = profiles::model_to_json(m.model);
    j["cluster"] = profiles::cluster_to_json(m.cluster);
    j["job"] = costmodel::job_to_json(m.job);
    j["strategy"] = costmodel::strategy_to_json(m.strategy);
    j["cost_options"] = costmodel::cost_options_to_json(m.options);
    j["prediction"] = costmodel::prediction_to_json(r.prediction);
  }
  return j;
}

nlohmann::json summary_to_json(const FileSummary& s) {
  auto opt = [](const std::optional<double>& v) { return v ? nlohmann::json(*v) : nullptr; };
  return {{"file", s.file},
          {"rows", s.num_rows},
          {"predicted", s.num_predicted},
          {"not_expressible", s.num_not_expressible},
          {"oom", s.num_oom},
          {"oom_predicted_not_to_fit", s.num_oom_agreeing},
          {"doubtful", s.num_doubtful},
          {"ran_predicted_not_to_fit", s.num_ran_predicted_not_to_fit},
          {"median_abs_throughput_error_pct", opt(s.median_throughput_error_pct)},
          {"memory_rows", s.num_memory},
          {"median_abs_memory_error_pct", opt(s.median_memory_error_pct)},
          {"ordering_pairs", s.ordering.pairs},
          {"ordering_ordered", s.ordering.ordered},
          {"ordering_share", opt(s.ordering.share())},
          {"same_job_ordering_pairs", s.ordering_same_job.pairs},
          {"same_job_ordering_ordered", s.ordering_same_job.ordered},
          {"same_job_ordering_share", opt(s.ordering_same_job.share())}};
}

}  // namespace loom::published
