// Predicts every published training row of a folder (default bench/published) with the analytical
// cost model and compares the predictions with the measured throughput and memory: per row, then
// per file the median |error| and the share of pairs ordered as measured, in sample (the shipped,
// clusters with the shipped calibration of each row's runtime), leave-one-out, leave-one-source-out
// and on the hardware alone (the cluster files' values, no calibration).
// Rows Loom cannot express are listed with the reason. Files without training rows (GEMM,
// collectives) are named and skipped. Usage: bench_published [DIR] [--json] [--explain ID]
//   --json: one document (per file summaries, per row outcomes with their mapping and prediction,
//           and each expressible row's leave-one-out, leave-one-source-out and
//           before-calibration predictions)
//   --explain ID: that row's mapping and whole prediction, as JSON
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "lab/fit.hpp"
#include "lab/published_rows.hpp"
#include "profiles/errors.hpp"
#include "profiles/json_reader.hpp"
#include "profiles/loader.hpp"

using namespace loom;
using namespace loom::published;

namespace {

struct FileResult {
  std::string name;
  std::vector<PreparedRow> prepared;
  std::vector<RowResult> rows;
  FileSummary summary;
  std::vector<RowResult> loo_rows;  // each usable row predicted by a fit that did not see it
  FileSummary loo_summary;
  std::vector<RowResult> loso_rows;  // each row predicted by a fit that saw no row of this file
  FileSummary loso_summary;
  std::vector<RowResult> datasheet_rows;  // each row on its cluster's datasheet values
  FileSummary datasheet_summary;
};

// What a calibration is fitted per: the cluster file a row was mapped on and the row's runtime.
std::string group_of(const PreparedRow& row) {
  const RowMapping& m = *row.result.mapping;
  return m.cluster_file + "|" + costmodel::to_string(m.job.runtime);
}
std::string cluster_of_group(const std::string& group) { return group.substr(0, group.find('|')); }

// `file`'s expressible rows predicted again, each on the cluster `cluster_of` gives for its
// calibration group (group_of), into `out` (a copy of file.rows with the predictions replaced).
void predict_again(const FileResult& file,
                   const std::function<const profiles::Cluster&(const std::string&)>& cluster_of,
                   std::vector<RowResult>* out) {
  *out = file.rows;
  for (std::size_t r = 0; r < file.prepared.size(); ++r) {
    const PreparedRow& row = file.prepared[r];
    if (!row.result.mapping) continue;
    const RowFigures figures = predict_prepared(row, cluster_of(group_of(row)));
    (*out)[r].predicted = figures.throughput;
    (*out)[r].predicted_memory_gib = figures.memory_gib;
    (*out)[r].predicted_fits = figures.fits;
  }
}

// The hardware values of the cluster file of calibration group `group`.
profiles::Cluster hardware_of(const std::string& group) {
  return profiles::datasheet_cluster(profiles::load_cluster(cluster_of_group(group)));
}

// Hardware alone: every expressible row predicted on its cluster file's values (the hardware,
// where every calibration starts), as the model stands without any runtime calibration.
void on_datasheets(std::vector<FileResult>* files) {
  std::map<std::string, profiles::Cluster> datasheets;
  auto datasheet = [&](const std::string& group) -> const profiles::Cluster& {
    if (!datasheets.count(group)) datasheets.emplace(group, hardware_of(group));
    return datasheets.at(group);
  };
  for (FileResult& file : *files) {
    predict_again(file, datasheet, &file.datasheet_rows);
    file.datasheet_summary = summarize(file.name, file.datasheet_rows);
  }
}

// Leave-one-out over every file: the usable rows of each cluster and runtime (all files
// together) fitted from the hardware values with loom calibrate's fit, as the shipped runtime
// calibrations are, each row's prediction taken from the fit without it.
void leave_one_out(std::vector<FileResult>* files) {
  std::map<std::string, std::vector<std::pair<std::size_t, std::size_t>>> by_cluster;
  for (std::size_t f = 0; f < files->size(); ++f) {
    FileResult& file = (*files)[f];
    file.loo_rows = file.rows;
    for (std::size_t r = 0; r < file.prepared.size(); ++r) {
      if (fit::usable(file.prepared[r])) {
        by_cluster[group_of(file.prepared[r])].emplace_back(f, r);
      }
    }
  }
  for (const auto& [name, members] : by_cluster) {
    std::vector<PreparedRow> rows;
    for (const auto& [f, r] : members) rows.push_back((*files)[f].prepared[r]);
    const fit::FitResult result = fit::calibrate(hardware_of(name), rows);
    for (std::size_t i = 0; i < members.size(); ++i) {
      RowResult& out = (*files)[members[i].first].loo_rows[members[i].second];
      out.predicted = result.rows[i].loo_predicted;
      out.predicted_memory_gib = result.rows[i].loo_predicted_memory_gib;
    }
  }
  for (FileResult& file : *files) file.loo_summary = summarize(file.name, file.loo_rows);
}

// The usable rows of calibration group `group` of every file but `skip`.
std::vector<PreparedRow> rows_on(const std::vector<FileResult>& files, const std::string& group,
                                 std::size_t skip) {
  std::vector<PreparedRow> out;
  for (std::size_t f = 0; f < files.size(); ++f) {
    if (f == skip) continue;
    for (const PreparedRow& row : files[f].prepared) {
      if (fit::usable(row) && group_of(row) == group) out.push_back(row);
    }
  }
  return out;
}

// Leave-one-source-out: each file's rows predicted on its cluster with a runtime calibration
// fitted, from the hardware values, to the usable rows of the same runtime on that cluster in the
// other files (calibrate's fit, without its leave-one-out), or on the hardware values alone where
// no other file has such rows. The shipped calibrations are fitted to every file, so they do not
// start the fit: this is how the model does on a source that no calibration has seen.
void leave_one_source_out(std::vector<FileResult>* files) {
  fit::FitOptions options;
  options.leave_one_out = false;
  for (std::size_t f = 0; f < files->size(); ++f) {
    std::map<std::string, profiles::Cluster> fitted;
    auto fitted_without = [&](const std::string& group) -> const profiles::Cluster& {
      if (!fitted.count(group)) {
        profiles::Cluster start = hardware_of(group);
        const std::vector<PreparedRow> others = rows_on(*files, group, f);
        if (!others.empty()) start = fit::calibrate(start, others, options).cluster;
        fitted.emplace(group, std::move(start));
      }
      return fitted.at(group);
    };
    FileResult& file = (*files)[f];
    predict_again(file, fitted_without, &file.loso_rows);
    file.loso_summary = summarize(file.name, file.loso_rows);
  }
}

bool has_training_rows(const nlohmann::json& document) {
  if (!document.is_object()) return false;
  auto rows = document.find("rows");
  return rows != document.end() && rows->is_array() && !rows->empty() && (*rows)[0].is_object() &&
         (*rows)[0].contains("model");
}

const char* unit_text(const std::string& unit) {
  if (unit == "tokens_per_s_per_gpu") return "tok/s/gpu";
  if (unit == "samples_per_s_per_gpu") return "smp/s/gpu";
  if (unit == "samples_per_s") return "samples/s";
  if (unit == "model_tflops_per_gpu") return "TFLOP/s/gpu";
  return "-";
}

std::string pct(const std::optional<double>& v) {
  if (!v) return "-";
  char text[32];
  std::snprintf(text, sizeof text, "%+.1f", *v);
  return text;
}

std::string share_text(const OrderingShare& o) {
  if (!o.share()) return "-";
  char text[64];
  std::snprintf(text, sizeof text, "%.1f %% (%lld/%lld)", 100 * *o.share(),
                static_cast<long long>(o.ordered), static_cast<long long>(o.pairs));
  return text;
}

// The throughput error of `row` predicted again (leave-one-out, on datasheets), when measured.
std::optional<double> again_pct(const RowResult& row, const std::vector<RowResult>& again,
                                std::size_t index) {
  if (index >= again.size() || !(row.measured > 0)) return std::nullopt;
  return 100 * (again[index].predicted - row.measured) / row.measured;
}

void print_rows(const FileResult& f) {
  std::printf("\n== %s (%zu rows)\n", f.name.c_str(), f.rows.size());
  std::printf("%-50s %-9s %10s %10s %7s %7s %7s %7s %8s %8s %7s  %s\n", "id", "unit", "measured",
              "predicted", "err %", "LOO %", "LOSO %", "sheet %", "mem GiB", "pred GiB", "err %",
              "note");
  for (std::size_t i = 0; i < f.rows.size(); ++i) {
    const RowResult& r = f.rows[i];
    if (r.not_expressible) continue;
    std::string note = r.doubtful ? "doubtful" : "";
    if (r.oom) note += std::string(note.empty() ? "" : ", ") + "oom as published";
    if (!r.predicted_fits) note += std::string(note.empty() ? "" : ", ") + "predicted not to fit";
    if (r.oom && r.predicted_fits) note += " (predicted to fit)";
    char measured[32] = "-";
    char predicted[32] = "-";
    if (r.measured > 0) {
      std::snprintf(measured, sizeof measured, "%.1f", r.measured);
      std::snprintf(predicted, sizeof predicted, "%.1f", r.predicted);
    }
    char memory[32] = "-";
    if (r.measured_memory_gib) std::snprintf(memory, sizeof memory, "%.1f", *r.measured_memory_gib);
    std::printf("%-50s %-9s %10s %10s %7s %7s %7s %7s %8s %8.1f %7s  %s\n", r.id.c_str(),
                unit_text(r.unit), measured, predicted, pct(r.throughput_error_pct()).c_str(),
                pct(again_pct(r, f.loo_rows, i)).c_str(), pct(again_pct(r, f.loso_rows, i)).c_str(),
                pct(again_pct(r, f.datasheet_rows, i)).c_str(), memory, r.predicted_memory_gib,
                pct(r.memory_error_pct()).c_str(), note.c_str());
  }
  bool header = false;
  for (const RowResult& r : f.rows) {
    if (!r.not_expressible) continue;
    if (!header) std::printf("not expressible:\n");
    header = true;
    std::printf("  %-48s %s\n", r.id.c_str(), r.not_expressible->c_str());
  }
}

// "12.3 %", or "-" without a figure.
std::string abs_pct(const std::optional<double>& v) {
  if (!v) return "-";
  char text[32];
  std::snprintf(text, sizeof text, "%.1f %%", *v);
  return text;
}

// One line per file of `summary`'s median errors and ordering, under `title`.
void print_short(const std::vector<FileResult>& files, FileSummary FileResult::*summary,
                 const char* title) {
  std::printf("\n%s:\n", title);
  std::printf("%-26s %10s %10s  %s\n", "file", "|err| thr", "|err| mem",
              "ordering (pairs > 5 % apart): all; same job");
  for (const FileResult& f : files) {
    const FileSummary& s = f.*summary;
    std::printf("%-26s %10s %10s  %s; %s\n", s.file.c_str(),
                abs_pct(s.median_throughput_error_pct).c_str(),
                abs_pct(s.median_memory_error_pct).c_str(), share_text(s.ordering).c_str(),
                share_text(s.ordering_same_job).c_str());
  }
}

void print_summary(const std::vector<FileResult>& files) {
  std::printf("\n%-26s %5s %5s %5s %9s %7s %10s %9s %10s  %s\n", "file", "rows", "pred", "n/e",
              "oom(agr)", "ran>mem", "|err| thr", "mem rows", "|err| mem",
              "ordering (pairs > 5 % apart): all; same job");
  for (const FileResult& f : files) {
    const FileSummary& s = f.summary;
    char oom[32];
    std::snprintf(oom, sizeof oom, "%lld(%lld)", static_cast<long long>(s.num_oom),
                  static_cast<long long>(s.num_oom_agreeing));
    std::printf("%-26s %5lld %5lld %5lld %9s %7lld %10s %9lld %10s  %s; %s\n", s.file.c_str(),
                static_cast<long long>(s.num_rows), static_cast<long long>(s.num_predicted),
                static_cast<long long>(s.num_not_expressible), oom,
                static_cast<long long>(s.num_ran_predicted_not_to_fit),
                abs_pct(s.median_throughput_error_pct).c_str(),
                static_cast<long long>(s.num_memory), abs_pct(s.median_memory_error_pct).c_str(),
                share_text(s.ordering).c_str(), share_text(s.ordering_same_job).c_str());
  }
  print_short(files, &FileResult::loo_summary,
              "leave-one-out (each row predicted by a fit of its cluster's other rows)");
  print_short(
      files, &FileResult::loso_summary,
      "leave-one-source-out (each file predicted by a calibration, fitted from the hardware "
      "values, of its runtime's rows on its cluster in the other files; the hardware "
      "alone where there are none)");
  print_short(files, &FileResult::datasheet_summary,
              "hardware alone (each row on its cluster file's values, no calibration)");
  std::fputs(
      "(pred: rows predicted against a measured throughput; n/e: not expressible; oom(agr): rows "
      "published as out of memory (those the model also says do not fit); ran>mem: rows that ran "
      "but are predicted not to fit; |err|: median |error|; same job: pairs of rows of one model, "
      "sequence length, GPU and GPU count; doubtful rows are shown above but left "
      "out of these figures; per row, err %: calibrated, LOO %: leave-one-out, sheet %: on the "
      "hardware alone, LOSO %: leave-one-source-out)\n",
      stdout);
}

int run(const std::string& dir, bool json, const std::string& explain) {
  std::vector<std::filesystem::path> paths;
  if (!std::filesystem::is_directory(dir)) throw InputError(dir, "", "expected a folder");
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() == ".json") paths.push_back(entry.path());
  }
  std::sort(paths.begin(), paths.end());
  std::vector<FileResult> files;
  std::vector<std::string> skipped;
  for (const auto& path : paths) {
    const std::string name = path.filename().string();
    nlohmann::json document =
        profiles::parse_json_text(profiles::read_text_file(path.string()), path.string());
    if (!has_training_rows(document)) {
      skipped.push_back(name);
      continue;
    }
    FileResult f;
    f.name = name;
    f.prepared = prepare_file(document, name);
    for (const PreparedRow& r : f.prepared) f.rows.push_back(r.result);
    f.summary = summarize(name, f.rows);
    files.push_back(std::move(f));
  }
  if (files.empty()) throw InputError(dir, "", "expected JSON files with training rows");
  if (explain.empty()) {
    leave_one_out(&files);
    leave_one_source_out(&files);
    on_datasheets(&files);
  }
  if (!explain.empty()) {
    for (const FileResult& f : files) {
      for (const RowResult& r : f.rows) {
        if (r.id == explain) std::cout << row_to_json(r, true).dump(2) << "\n";
        if (r.id == explain) return 0;
      }
    }
    throw InputError("--explain", "", "expected the id of a row in " + dir + ", found " + explain);
  }
  if (json) {
    nlohmann::json doc = {{"folder", dir}, {"skipped", skipped}};
    for (const FileResult& f : files) {
      nlohmann::json summary = summary_to_json(f.summary);
      summary["leave_one_out"] = summary_to_json(f.loo_summary);
      summary["leave_one_source_out"] = summary_to_json(f.loso_summary);
      summary["datasheet"] = summary_to_json(f.datasheet_summary);
      doc["files"].push_back(summary);
      for (std::size_t r = 0; r < f.rows.size(); ++r) {
        nlohmann::json row = row_to_json(f.rows[r], true);
        if (!f.rows[r].not_expressible) {
          row["leave_one_out_predicted"] = f.loo_rows[r].predicted;
          row["leave_one_source_out_predicted"] = f.loso_rows[r].predicted;
          row["before_calibration_predicted"] = f.datasheet_rows[r].predicted;
          row["before_calibration_memory_gib"] = f.datasheet_rows[r].predicted_memory_gib;
        }
        doc["rows"].push_back(row);
      }
    }
    std::cout << doc.dump(2) << "\n";
    return 0;
  }
  for (const FileResult& f : files) print_rows(f);
  print_summary(files);
  for (const std::string& name : skipped)
    std::printf("skipped %s: no training rows\n", name.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = "bench/published";
  bool json = false;
  std::string explain;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--json") {
      json = true;
    } else if (arg == "--explain" && i + 1 < argc) {
      explain = argv[++i];
    } else if (arg == "-h" || arg == "--help") {
      std::printf("usage: bench_published [DIR] [--json] [--explain ID]\n");
      return 0;
    } else {
      dir = arg;
    }
  }
  try {
    return run(dir, json, explain);
  } catch (const InputError& e) {
    std::fprintf(stderr, "bench_published: error: %s\n", e.what());
    return 2;
  }
}
