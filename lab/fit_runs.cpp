// Reading measured runs for calibration: published rows and loom validate records (fit.hpp).
#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "costmodel/runtime.hpp"
#include "lab/fit.hpp"
#include "planner/plan.hpp"
#include "planner/validate_record.hpp"
#include "profiles/errors.hpp"
#include "profiles/json_reader.hpp"
#include "profiles/loader.hpp"

namespace loom::fit {

namespace {

using nlohmann::json;
using published::PreparedRow;

constexpr double kGib = 1024.0 * 1024.0 * 1024.0;

// A `loom validate --json` record with its plan: Loom's executor ran the plan, so it is
// predicted as runtime loom, on `cluster` sized to the plan's devices.
PreparedRow validate_row(const json& doc, const std::string& file, const std::string& path,
                         const profiles::Cluster& cluster) {
  PreparedRow out;
  published::RowResult& r = out.result;
  r.file = file;
  r.id = path;
  const planner::Plan plan = planner::plan_from_json(doc.at("plan"), file + " " + path + ".plan");
  const planner::MeasuredRun measured = planner::measured_run_from_json(doc, file, path);
  r.unit = "samples_per_s";
  r.measured = static_cast<double>(plan.job.global_batch) / measured.step_time_s;
  // The device's used memory where the run had one (CUDA: the process lines count too), else the
  // allocator's peak of tensors.
  if (measured.device_used_bytes) {
    r.measured_memory_gib = *measured.device_used_bytes / kGib;
    r.memory_kind = "device used (loom validate)";
  } else if (measured.peak_memory_bytes > 0) {
    r.measured_memory_gib = measured.peak_memory_bytes / kGib;
    r.memory_kind = "allocator peak allocated (loom validate)";
  }
  if (plan.cluster.device.name != cluster.device.name) {
    r.not_expressible = "device \"" + plan.cluster.device.name +
                        "\" is not the cluster's device (" + cluster.device.name + ")";
    return out;
  }
  published::RowMapping m;
  m.model = plan.model;
  m.job = costmodel::executor_job(plan.job);
  m.strategy = plan.strategy;
  m.options = plan.cost_options;
  m.cluster_file = cluster.name;
  m.sizing.gpus = plan.cluster.device_count();
  m.sizing.gpus_per_node = plan.cluster.devices_per_node;
  try {
    m.cluster = published::sized_cluster(cluster, m.sizing, file);
  } catch (const InputError& e) {
    r.not_expressible = std::string("the plan's devices do not fit the cluster: ") + e.what();
    return out;
  }
  m.assumptions.push_back("run by Loom's executor: runtime loom");
  r.job_key = plan.model.name + "|" + cluster.device.name;
  out.device_of_rank = planner::device_of_rank(plan);
  out.stages = plan.stages;
  r.mapping = m;
  const published::RowFigures f = published::predict_prepared(out, cluster);
  r.predicted = f.throughput;
  r.predicted_memory_gib = f.memory_gib;
  r.predicted_fits = f.fits;
  r.prediction = f.prediction;
  return out;
}

std::string where_of(const std::string& file, const std::string& path, const json& row) {
  std::string where = file + " " + path;
  if (row.is_object()) {
    auto id = row.find("id");
    if (id != row.end() && id->is_string()) where += " (" + id->get<std::string>() + ")";
  }
  return where;
}

// Why a prepared row gives no residual ("" when it does).
std::string unusable_reason(const PreparedRow& row) {
  const published::RowResult& r = row.result;
  if (r.not_expressible) return *r.not_expressible;
  if (r.doubtful) return "doubtful as published";
  if (r.oom && !r.measured_memory_gib) return "out of memory as published: nothing measured";
  if (!usable(row)) return "no measured throughput or memory";
  return "";
}

class Reader {
 public:
  Reader(const profiles::Cluster& cluster, Runs* out) : cluster_(cluster), out_(out) {}

  // One object (a row or a record) or a document of rows.
  void value(const json& v, const std::string& file, const std::string& path) {
    if (v.is_array()) {
      for (std::size_t i = 0; i < v.size(); ++i) {
        row(v[i], file, path + "[" + std::to_string(i) + "]");
      }
      return;
    }
    if (v.is_object() && v.contains("rows") && !v.contains("model")) {
      const json& rows = v.at("rows");
      if (!rows.is_array() || rows.empty()) {
        skip(file + " " + path + ".rows", "expected a non-empty array of rows");
        return;
      }
      for (std::size_t i = 0; i < rows.size(); ++i) {
        row(rows[i], file, path + ".rows[" + std::to_string(i) + "]");
      }
      return;
    }
    row(v, file, path);
  }

 private:
  void row(const json& v, const std::string& file, const std::string& path) {
    const std::string where = where_of(file, path, v);
    if (!v.is_object()) {
      skip(where, "expected an object (a published row or a loom validate record)");
      return;
    }
    try {
      PreparedRow prepared;
      if (v.contains("model")) {
        prepared = published::prepare_row(v, file, path, &cluster_);
      } else if (v.contains("plan") && v.contains("measured")) {
        prepared = validate_row(v, file, path, cluster_);
      } else if (v.contains("measured")) {
        skip(where, "a loom validate record without its plan (\"plan\": the loom-plan/1 it ran)");
        return;
      } else {
        skip(where,
             "neither a published row (\"model\") nor a loom validate record (\"plan\", "
             "\"measured\")");
        return;
      }
      if (std::string why = unusable_reason(prepared); !why.empty()) {
        skip(where, why);
        return;
      }
      out_->rows.push_back(std::move(prepared));
      const std::string name = std::filesystem::path(file).filename().string();
      if (std::find(out_->files.begin(), out_->files.end(), name) == out_->files.end()) {
        out_->files.push_back(name);
      }
    } catch (const InputError& e) {
      skip(where, e.what());
    } catch (const std::invalid_argument& e) {
      skip(where, e.what());
    }
  }
  void skip(const std::string& where, const std::string& reason) {
    out_->skipped.push_back({where, reason});
  }

  const profiles::Cluster& cluster_;
  Runs* out_;
};

}  // namespace

Runs read_runs(const std::vector<std::string>& paths, const profiles::Cluster& cluster) {
  Runs out;
  Reader reader(cluster, &out);
  for (const std::string& path : paths) {
    const std::string text = profiles::read_text_file(path);
    json document;
    bool whole = true;
    try {
      document = profiles::parse_json_text(text, path);
    } catch (const InputError&) {
      whole = false;
    }
    if (whole) {
      reader.value(document, path, "$");
      continue;
    }
    // JSONL: one object per line; blank lines are allowed.
    std::istringstream lines(text);
    std::string line;
    for (int number = 1; std::getline(lines, line); ++number) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      const std::string where = "line " + std::to_string(number);
      try {
        reader.value(profiles::parse_json_text(line, path), path, where);
      } catch (const InputError& e) {
        std::string at = path;
        at += " ";
        at += where;
        out.skipped.push_back({at, e.what()});
      }
    }
  }
  return out;
}

}  // namespace loom::fit
