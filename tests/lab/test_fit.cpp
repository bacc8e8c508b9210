// Calibration (lab/fit.hpp): the fit recovers parameters from rows the model itself generated
// with 2 % noise, leave-one-out does not see the left-out row, parameters no row depends on stay,
// and bad rows of RUNS are skipped one line each.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <string_view>

#include "lab/fit.hpp"
#include "profiles/json_reader.hpp"
#include "profiles/loader.hpp"

using namespace loom;
using loom::published::PreparedRow;

namespace {

const std::string kMpt = std::string(LOOM_SOURCE_DIR) + "/bench/published/mpt_llm_foundry.json";

// The shipped DGX A100 80GB at its datasheet values (whether or not the file is calibrated).
profiles::Cluster a100() {
  return profiles::datasheet_cluster(profiles::load_cluster("dgx-a100-80g"));
}

// The 8-GPU MPT rows on A100 80GB, prepared on `cluster`; at most `limit` of them.
std::vector<PreparedRow> mpt_rows(const profiles::Cluster& cluster, std::size_t limit) {
  const nlohmann::json doc =
      profiles::parse_json_text(profiles::read_text_file(kMpt), "mpt_llm_foundry.json");
  std::vector<PreparedRow> out;
  for (std::size_t i = 0; i < doc.at("rows").size() && out.size() < limit; ++i) {
    const nlohmann::json& row = doc.at("rows")[i];
    if (row.at("gpu") != "A100-80GB" || row.at("gpus") != 8) continue;
    PreparedRow p =
        published::prepare_row(row, "mpt.json", "$.rows[" + std::to_string(i) + "]", &cluster);
    if (fit::usable(p)) out.push_back(std::move(p));
  }
  return out;
}

// The truth the synthetic rows come from: three parameters away from the datasheet.
struct Truth {
  double bf16_tflops = 0;
  double memory_efficiency = 0.6;
  double overlap_slowdown = 0.3;
};

profiles::Cluster true_cluster(const profiles::Cluster& start, const Truth& t) {
  profiles::Cluster c = start;
  c.device.achievable_tflops.bf16 = t.bf16_tflops;
  c.device.memory_efficiency = t.memory_efficiency;
  c.overlap_slowdown = t.overlap_slowdown;
  return c;
}

// Sets each row's measured throughput to the truth's prediction times exp(N(0, 0.02)).
void measure(std::vector<PreparedRow>* rows, const profiles::Cluster& truth, unsigned seed) {
  std::mt19937 random(seed);
  std::normal_distribution<double> noise(0, 0.02);
  for (PreparedRow& r : *rows) {
    r.result.measured = published::predict_prepared(r, truth).throughput * std::exp(noise(random));
  }
}

// `name` by value: a reference parameter bound to a temporary string makes GCC 14 and later warn
// that the returned reference may dangle (-Wdangling-reference), though it points into `f`.
const fit::ParameterFit& parameter(const fit::FitResult& f, std::string_view name) {
  for (const fit::ParameterFit& p : f.parameters) {
    if (p.name == name) return p;
  }
  FAIL("no parameter " << name);
  return f.parameters.front();
}

}  // namespace

TEST_CASE("the fit recovers parameters from the model's own rows with 2 % noise", "[fit]") {
  const profiles::Cluster start = a100();
  Truth truth;
  // Inside the GEMM ceiling's stated range, 0.9-1.1 times the file's (cluster_parameters.hpp).
  truth.bf16_tflops = 0.94 * start.device.achievable_tflops.bf16;  // 254.9 of 271.2
  std::vector<PreparedRow> rows = mpt_rows(start, 1000);
  REQUIRE(rows.size() == 59);
  measure(&rows, true_cluster(start, truth), 7);
  fit::FitOptions options;
  options.leave_one_out = false;
  const fit::FitResult f = fit::calibrate(start, rows, options);
  // Tolerance: the GEMM ceiling, which every row's time depends on, within 3 % of the truth and
  // 3 uncertainties; the memory efficiency, which only the memory-bound kernels see, within 10 %.
  const fit::ParameterFit& bf16 = parameter(f, "device.achievable_tflops.bf16");
  CHECK(bf16.informed);
  CHECK(bf16.start == Approx(271.2));
  CHECK(bf16.value == Approx(truth.bf16_tflops).epsilon(0.03));
  CHECK(std::abs(bf16.value - truth.bf16_tflops) < 3 * bf16.uncertainty + 1e-9);
  const fit::ParameterFit& memory = parameter(f, "device.memory_efficiency");
  CHECK(memory.start == Approx(0.8));
  CHECK(memory.value == Approx(truth.memory_efficiency).epsilon(0.10));
  // The overlap slowdown only acts on the communication FSDP hides on 8 GPUs, a few per cent of
  // a step: weakly informed, so only within 3 uncertainties.
  const fit::ParameterFit& overlap = parameter(f, "overlap_slowdown");
  INFO("overlap " << overlap.value << " +/- " << overlap.uncertainty);
  CHECK(overlap.informed);
  CHECK(std::abs(overlap.value - truth.overlap_slowdown) < 3 * overlap.uncertainty);
  // 2 % noise: the fitted model is within the noise of the rows.
  REQUIRE(f.median_error_pct.has_value());
  CHECK(*f.median_error_pct < 2.5);
}

TEST_CASE("a hardware parameter stays inside its range, software ones take up the rest", "[fit]") {
  // Rows generated with a GEMM ceiling of 0.75 of the file's, out of its 0.9-1.1 range.
  const profiles::Cluster start = a100();
  Truth truth;
  truth.bf16_tflops = 0.75 * start.device.achievable_tflops.bf16;
  std::vector<PreparedRow> rows = mpt_rows(start, 1000);
  measure(&rows, true_cluster(start, truth), 7);
  fit::FitOptions options;
  options.leave_one_out = false;
  const fit::FitResult f = fit::calibrate(start, rows, options);
  const fit::ParameterFit& bf16 = parameter(f, "device.achievable_tflops.bf16");
  CHECK(bf16.value == Approx(0.9 * 271.2).epsilon(1e-6));  // the range's lower end
  CHECK(f.cluster.device.achievable_tflops.bf16 >= 0.9 * 271.2 * (1 - 1e-9));
  // The memory efficiency (software) goes below the truth's 0.6 to make up the time.
  CHECK(parameter(f, "device.memory_efficiency").value < 0.6);
  for (const fit::ParameterSpec& p : fit::free_parameters(start)) {
    INFO(p.name);
    const fit::ParameterFit& q = parameter(f, p.name);
    CHECK(q.value >= p.lower * (1 - 1e-9));
    CHECK(q.value <= p.upper * (1 + 1e-9));
  }
}

TEST_CASE("parameters no row depends on are not informed and keep their value", "[fit]") {
  const profiles::Cluster start = a100();
  std::vector<PreparedRow> rows = mpt_rows(start, 6);
  REQUIRE(rows.size() == 6);
  measure(&rows, start, 3);
  fit::FitOptions options;
  options.leave_one_out = false;
  const fit::FitResult f = fit::calibrate(start, rows, options);
  // No row measures memory, none uses tf32, and all run on one node.
  for (const char* name : {"device.fragmentation", "device.achievable_tflops.tf32",
                           "inter_node.bus_bandwidth_gbps", "inter_node.latency_us"}) {
    INFO(name);
    const fit::ParameterFit& p = parameter(f, name);
    CHECK_FALSE(p.informed);
    CHECK(p.value == p.start);
    CHECK(p.uncertainty == 0);
  }
  CHECK(f.cluster.device.achievable_tflops.tf32 == start.device.achievable_tflops.tf32);
  CHECK_FALSE(f.cluster.device.fragmentation.has_value());
}

TEST_CASE("leave-one-out does not see the left-out row's measurement", "[fit]") {
  const profiles::Cluster start = a100();
  Truth truth;
  truth.bf16_tflops = 0.95 * start.device.achievable_tflops.bf16;
  std::vector<PreparedRow> rows = mpt_rows(start, 10);
  REQUIRE(rows.size() == 10);
  measure(&rows, true_cluster(start, truth), 11);
  const fit::FitResult before = fit::calibrate(start, rows);
  // The fourth row measured three times faster: the full fit moves, its leave-one-out
  // prediction (a fit of the other nine) does not.
  rows[3].result.measured *= 3;
  const fit::FitResult after = fit::calibrate(start, rows);
  REQUIRE(before.rows.size() == 10);
  CHECK(std::abs(after.rows[3].predicted / before.rows[3].predicted - 1) > 1e-3);
  CHECK(after.rows[3].loo_predicted == Approx(before.rows[3].loo_predicted).epsilon(1e-4));
  // The other rows' own leave-one-out fits saw the change.
  CHECK(std::abs(after.rows[0].loo_predicted / before.rows[0].loo_predicted - 1) > 1e-4);
  // In sample the changed row is far off, out of sample it is predicted from the others.
  CHECK(std::abs(*after.rows[3].loo_error_pct()) > 60);
}

TEST_CASE("a fixed parameter keeps the cluster's value and the record says so", "[fit]") {
  // The shipped file with a measured ceiling to keep (inside its range around the datasheet's).
  profiles::Cluster start = profiles::load_cluster("dgx-a100-80g");
  start.device.achievable_tflops.bf16 = 250;
  Truth truth;
  truth.bf16_tflops = 0.75 * 271.2;
  std::vector<PreparedRow> rows = mpt_rows(start, 10);
  REQUIRE(rows.size() == 10);
  measure(&rows, true_cluster(start, truth), 13);
  fit::FitOptions options;
  options.leave_one_out = false;
  options.fixed = {"device.achievable_tflops.bf16"};
  const fit::FitResult f = fit::calibrate(start, rows, options);
  const fit::ParameterFit& bf16 = parameter(f, "device.achievable_tflops.bf16");
  CHECK(bf16.fixed);
  CHECK_FALSE(bf16.informed);
  CHECK(bf16.value == 250);
  CHECK(f.cluster.device.achievable_tflops.bf16 == 250);
  // The others still move: the memory efficiency takes up what the kept ceiling leaves.
  CHECK(parameter(f, "device.memory_efficiency").informed);
  CHECK(parameter(f, "device.memory_efficiency").value != Approx(0.8).epsilon(0.01));
  const profiles::Cluster out = fit::with_record(f, {"mpt.json"}, "2026-11-27");
  CHECK(out.device.achievable_tflops.bf16 == 250);
  const nlohmann::json j = profiles::cluster_to_json(out);
  const nlohmann::json& record =
      j.at("calibration").at("parameters").at("device.achievable_tflops.bf16");
  CHECK(record.at("fixed") == true);
  CHECK(record.at("value") == 250);
  CHECK(record.at("start") == 250);  // the file's value: it has no record of another
  CHECK_FALSE(record.contains("uncertainty"));
  CHECK(profiles::cluster_to_json(profiles::cluster_from_json(j, "fixed.json")) == j);
}

TEST_CASE("the calibration record round-trips through the cluster file", "[fit]") {
  const profiles::Cluster start = a100();
  std::vector<PreparedRow> rows = mpt_rows(start, 6);
  measure(&rows, start, 5);
  fit::FitOptions options;
  options.leave_one_out = false;
  const profiles::Cluster out =
      fit::with_record(fit::calibrate(start, rows, options), {"mpt.json"}, "2026-11-25");
  REQUIRE(out.calibration.has_value());
  CHECK(out.calibration->rows == 6);
  CHECK(out.calibration->files == std::vector<std::string>{"mpt.json"});
  CHECK(out.calibration->date == "2026-11-25");
  const nlohmann::json j = profiles::cluster_to_json(out);
  CHECK(j.at("calibration").at("parameters").at("device.fragmentation").at("informed") == false);
  const profiles::Cluster again = profiles::cluster_from_json(j, "calibrated.json");
  CHECK(profiles::cluster_to_json(again) == j);
  // Calibrating the calibrated file starts from its record's datasheet values again.
  CHECK(profiles::datasheet_cluster(again).device.achievable_tflops.bf16 == Approx(271.2));
}

TEST_CASE("bad rows of RUNS are skipped, one line each", "[fit]") {
  const nlohmann::json doc =
      profiles::parse_json_text(profiles::read_text_file(kMpt), "mpt_llm_foundry.json");
  nlohmann::json good;
  for (const nlohmann::json& row : doc.at("rows")) {
    if (row.at("gpu") == "A100-80GB" && row.at("gpus") == 8) good = row;
  }
  REQUIRE(good.is_object());
  nlohmann::json tpu = good;
  tpu["id"] = "tpu";
  tpu["gpu"] = "TPU-v5";
  nlohmann::json world = good;
  world["id"] = "world";
  world["dp"] = 4;
  nlohmann::json h100 = good;
  h100["id"] = "h100";
  h100["gpu"] = "H100-80GB";
  nlohmann::json runtime = good;
  runtime["id"] = "runtime";
  runtime["runtime"] = "jax";
  nlohmann::json oom = good;
  oom["id"] = "oom";
  oom["oom"] = true;
  oom.erase("measured");
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / "loom-test-fit-runs.jsonl";
  {
    std::ofstream out(path);
    for (const nlohmann::json& row : {good, tpu, world, h100, runtime, oom}) {
      out << row.dump() << "\n";
    }
    out << "{not json\n";
    out << R"({"measured": {"step_time_s": 0.1}})"
        << "\n";
    out << "\n";
  }
  const fit::Runs runs = fit::read_runs({path.string()}, a100());
  std::filesystem::remove(path);
  CHECK(runs.rows.size() == 1);
  CHECK(runs.files == std::vector<std::string>{"loom-test-fit-runs.jsonl"});
  REQUIRE(runs.skipped.size() == 7);
  auto reason = [&](std::size_t i) {
    return runs.skipped[i].where + ": " + runs.skipped[i].reason;
  };
  using Catch::Contains;
  CHECK_THAT(reason(0), Contains("line 2 (tpu)") && Contains("unknown GPU \"TPU-v5\""));
  CHECK_THAT(reason(1), Contains("line 3 (world)") && Contains("dp*tp*pp = 4 is not the 8 GPUs"));
  CHECK_THAT(reason(2),
             Contains("(h100)") && Contains("GPU \"H100-80GB\" is not the cluster's device "
                                            "(A100-SXM4-80GB)"));
  CHECK_THAT(reason(3), Contains("(runtime)") && Contains("loom, megatron, deepspeed, fsdp, nemo"));
  CHECK_THAT(reason(4), Contains("(oom)") && Contains("out of memory as published"));
  CHECK_THAT(reason(5), Contains("line 7"));
  CHECK_THAT(reason(6), Contains("line 8") && Contains("without its plan"));
}
