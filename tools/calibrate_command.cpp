// loom calibrate: fits a cluster's free parameters to measured runs and writes a runtime
// calibration (--runtime) or the calibrated cluster (docs/calibrate.md).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "costmodel/runtime.hpp"
#include "lab/fit.hpp"
#include "profiles/errors.hpp"
#include "profiles/loader.hpp"
#include "tools/commands.hpp"

namespace loom::tools {

namespace {

struct CalibrateArgs {
  std::vector<std::string> runs;
  std::string cluster;
  std::string output;
  std::string date;
  std::vector<std::string> apply_to;
  std::vector<std::string> fix;
  std::string runtime;  // set: fit that runtime's rows only and write a loom-calibration file
  std::string name;     // the calibration's name (default RUNTIME-CLUSTER)
  std::string stack;    // words: the software stack the rows ran
};

std::string today() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[16];
  std::strftime(text, sizeof text, "%Y-%m-%d", &utc);
  return text;
}

bool is_date(const std::string& text) {
  if (text.size() != 10 || text[4] != '-' || text[7] != '-') return false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (i != 4 && i != 7 && (text[i] < '0' || text[i] > '9')) return false;
  }
  return true;
}

std::string number(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.4g", value);
  return text;
}

std::string pct(const std::optional<double>& v) {
  if (!v) return "-";
  char text[32];
  std::snprintf(text, sizeof text, "%.1f %%", *v);
  return text;
}

void print_fit(const fit::FitResult& result, std::size_t throughput_rows, std::size_t memory_rows) {
  char line[256];
  std::snprintf(line, sizeof line, "%-34s %10s %10s %12s\n", "parameter", "start", "fitted",
                "uncertainty");
  std::cout << line;
  for (const fit::ParameterFit& p : result.parameters) {
    if (p.fixed) {
      std::snprintf(line, sizeof line, "%-34s %10s %10s %12s\n", p.name.c_str(),
                    number(p.start).c_str(), number(p.value).c_str(), "fixed");
    } else if (p.informed) {
      std::snprintf(line, sizeof line, "%-34s %10s %10s %12s\n", p.name.c_str(),
                    number(p.start).c_str(), number(p.value).c_str(),
                    ("+/- " + number(p.uncertainty)).c_str());
    } else {
      std::snprintf(line, sizeof line, "%-34s %10s %10s %12s\n", p.name.c_str(),
                    number(p.start).c_str(), "-", "not informed");
    }
    std::cout << line;
  }
  std::snprintf(line, sizeof line, "\n%-24s %10s %14s\n", "median |error|", "in sample",
                "leave-one-out");
  std::cout << line;
  std::snprintf(line, sizeof line, "%-24s %10s %14s\n",
                ("throughput (" + std::to_string(throughput_rows) + " rows)").c_str(),
                pct(result.median_error_pct).c_str(), pct(result.loo_median_error_pct).c_str());
  std::cout << line;
  std::snprintf(line, sizeof line, "%-24s %10s %14s\n",
                ("memory (" + std::to_string(memory_rows) + " rows)").c_str(),
                pct(result.memory_median_error_pct).c_str(),
                pct(result.loo_memory_median_error_pct).c_str());
  std::cout << line;
}

// The cluster's JSON with its top-level keys in the order the shipped files use (the record
// last), so that a calibrated file reads like the datasheet one it came from.
void write_cluster(const std::string& path, const profiles::Cluster& cluster) {
  const nlohmann::json j = profiles::cluster_to_json(cluster);
  nlohmann::ordered_json out;
  for (const char* key :
       {"format", "name", "nodes", "devices_per_node", "device", "intra_node", "inter_node",
        "links", "collective_launch_us", "overlap_slowdown", "source", "calibration"}) {
    if (j.contains(key)) out[key] = j.at(key);
  }
  for (const auto& [key, value] : j.items()) {
    if (!out.contains(key)) out[key] = value;
  }
  profiles::write_file_atomically(path, out.dump(2) + "\n");
}

// The calibration's JSON with the keys in reading order (the record last).
void write_calibration(const std::string& path, const profiles::RuntimeCalibration& calibration) {
  const nlohmann::json j = profiles::runtime_calibration_to_json(calibration);
  nlohmann::ordered_json out;
  for (const char* key : {"format", "name", "runtime", "device", "stack", "parameters", "record"}) {
    if (j.contains(key)) out[key] = j.at(key);
  }
  profiles::write_file_atomically(path, out.dump(2) + "\n");
}

// Keeps the rows of `runtime` (the others become skipped rows, with that reason) and the names
// of the files that still have rows.
void keep_runtime(const std::string& runtime, fit::Runs* runs) {
  std::vector<published::PreparedRow> kept;
  std::vector<std::string> files;
  for (published::PreparedRow& row : runs->rows) {
    const std::string of = costmodel::to_string(row.result.mapping->job.runtime);
    if (of == runtime) {
      if (std::find(files.begin(), files.end(), row.result.file) == files.end()) {
        files.push_back(row.result.file);
      }
      kept.push_back(std::move(row));
    } else {
      std::string where = row.result.file;
      where += " ";
      where += row.result.id;
      std::string why = "runtime ";
      why += of;
      why += ", not ";
      why += runtime;
      runs->skipped.push_back({where, why});
    }
  }
  runs->rows = std::move(kept);
  std::vector<std::string> used;
  for (const std::string& f : runs->files) {
    if (std::find(files.begin(), files.end(), f) != files.end()) used.push_back(f);
  }
  runs->files = used;
}

int run_calibrate(const CalibrateArgs& a) {
  const std::string date = a.date.empty() ? today() : a.date;
  if (!is_date(date)) throw InputError("--date", "", "expected YYYY-MM-DD, found " + a.date);
  const profiles::Cluster cluster = profiles::load_cluster(a.cluster);
  const std::vector<fit::ParameterSpec> free = fit::free_parameters(cluster);
  for (const std::string& name : a.fix) {
    if (std::none_of(free.begin(), free.end(),
                     [&](const fit::ParameterSpec& p) { return p.name == name; })) {
      std::string expected = "a parameter of " + cluster.name + " (";
      for (std::size_t i = 0; i < free.size(); ++i) {
        if (i > 0) expected += ", ";
        expected += free[i].name;
      }
      expected += "), found ";
      expected += name;
      throw InputError("--fix", "", expected);
    }
  }
  std::vector<profiles::Cluster> targets;
  for (const std::string& path : a.apply_to) targets.push_back(profiles::load_cluster(path));
  // Rows are mapped on the datasheet values, as on the first calibration of the file.
  // Rows are prepared on the datasheet values, so that calibrating a calibrated file again maps
  // them the same way.
  fit::Runs runs = fit::read_runs(a.runs, profiles::datasheet_cluster(cluster));
  if (!a.runtime.empty()) keep_runtime(a.runtime, &runs);
  std::cout << "calibrating " << cluster.name << " (" << cluster.device.name << ") on "
            << runs.rows.size() << " usable rows of " << a.runs.size() << " file"
            << (a.runs.size() == 1 ? "" : "s") << "\n";
  if (!runs.skipped.empty()) {
    std::cout << "skipped " << runs.skipped.size() << " row"
              << (runs.skipped.size() == 1 ? "" : "s") << ":\n";
    for (const fit::SkippedRow& s : runs.skipped) {
      std::cout << "  " << one_line(s.where + ": " + s.reason) << "\n";
    }
  }
  if (runs.rows.empty()) {
    std::string files;
    for (const std::string& f : a.runs) files += (files.empty() ? "" : ", ") + f;
    throw InputError(files, "",
                     "expected at least one usable measured row for " + cluster.device.name + " (" +
                         std::to_string(runs.skipped.size()) + " skipped, reasons above)");
  }
  std::size_t throughput_rows = 0;
  std::size_t memory_rows = 0;
  for (const auto& r : runs.rows) {
    throughput_rows += r.result.measured > 0 && !r.result.oom ? 1 : 0;
    memory_rows += r.result.measured_memory_gib ? 1 : 0;
  }
  fit::FitOptions options;
  options.fixed = a.fix;
  const fit::FitResult result = fit::calibrate(cluster, runs.rows, options);
  std::cout << "\n";
  print_fit(result, throughput_rows, memory_rows);
  if (!a.runtime.empty()) {
    const std::string name = a.name.empty() ? a.runtime + "-" + cluster.name : a.name;
    write_calibration(a.output,
                      fit::runtime_calibration(result, runs.files, date, name, a.runtime, a.stack));
    std::cout << "\nwrote " << a.output << " (calibration " << name << " of runtime " << a.runtime
              << " on " << cluster.device.name << ")\n";
    return 0;
  }
  write_cluster(a.output, fit::with_record(result, runs.files, date));
  std::cout << "\nwrote " << a.output << "\n";
  for (std::size_t i = 0; i < targets.size(); ++i) {
    write_cluster(a.apply_to[i], fit::transfer_device_parameters(result, targets[i], cluster.name,
                                                                 runs.files, date));
    std::cout << "wrote " << a.apply_to[i] << " (the device parameters, as ratios to "
              << cluster.name << "'s starting values)\n";
  }
  return 0;
}

}  // namespace

Runner add_calibrate_command(CLI::App& app) {
  auto args = std::make_shared<CalibrateArgs>();
  CLI::App* cmd = add_subcommand(app, "calibrate");
  cmd->add_option("runs", args->runs,
                  "measured runs: JSON or JSONL (published rows, or loom validate --json records "
                  "with their plan)")
      ->required();
  cmd->add_option("--cluster", args->cluster, "cluster to calibrate (name or loom-cluster JSON)")
      ->required();
  cmd->add_option("-o,--output", args->output, "where to write the calibrated cluster")->required();
  cmd->add_option("--date", args->date, "date of the calibration record (default today, UTC)");
  cmd->add_option("--apply-to", args->apply_to,
                  "cluster file of the same GPU die to receive the fitted device parameters, in "
                  "place (repeatable)")
      ->allow_extra_args(false);
  cmd->add_option("--fix", args->fix,
                  "parameter kept at the cluster's value instead of fitted, as the table names it "
                  "(repeatable)")
      ->allow_extra_args(false);
  cmd->add_option("--runtime", args->runtime,
                  "fit the rows of this runtime only and write a runtime calibration "
                  "(loom-calibration/1) instead of a cluster")
      ->check(CLI::IsMember(costmodel::runtime_names()));
  cmd->add_option("--name", args->name, "the calibration's name (default RUNTIME-CLUSTER)");
  cmd->add_option("--stack", args->stack,
                  "words for the software stack the rows ran (written into the calibration)");
  return [args]() { return run_calibrate(*args); };
}

}  // namespace loom::tools
