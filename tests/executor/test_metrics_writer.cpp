// metrics.jsonl lines and the JSON-lines writer (executor/metrics_writer.hpp).
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "executor/metrics_writer.hpp"
#include "profiles/errors.hpp"

namespace fs = std::filesystem;

namespace {

std::vector<nlohmann::json> read_lines(const fs::path& path) {
  std::ifstream in(path);
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

std::string read_first_line(const fs::path& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

}  // namespace

TEST_CASE("MetricsWriter: step and evaluation lines, truncated or appended", "[metrics_writer]") {
  const fs::path dir = fs::temp_directory_path() / "loom_test_metrics_writer";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path path = dir / "metrics.jsonl";
  {
    loom::executor::MetricsWriter metrics(path.string(), false);
    loom::executor::StepRecord r;
    r.step = 3;
    r.epoch = 1;
    r.loss = 0.5;
    r.lr = 1e-4;
    r.global_batch = 16;
    r.step_time_s = 2.0;
    r.peak_memory_bytes = 1234;
    r.rank = 2;
    r.phases.forward_s = 0.5;
    r.phases.backward_s = 1.0;
    metrics.write_step(r);
    metrics.write_evaluation(3, 0.75, 0.25, "test");
  }
  std::vector<nlohmann::json> lines = read_lines(path);
  REQUIRE(lines.size() == 2);
  const nlohmann::json& step = lines[0];
  std::vector<std::string> keys;
  const nlohmann::ordered_json in_order = nlohmann::ordered_json::parse(read_first_line(path));
  for (const auto& item : in_order.items()) keys.push_back(item.key());
  CHECK(keys == std::vector<std::string>{"step", "epoch", "loss", "lr", "samples_per_s",
                                         "step_time_s", "peak_memory_bytes", "rank", "time",
                                         "peak_rss_bytes", "phases_s"});
  CHECK(step["step"] == 3);
  CHECK(step["epoch"] == 1);
  CHECK(step["loss"] == 0.5);
  CHECK(step["samples_per_s"] == 8.0);
  CHECK(step["peak_memory_bytes"] == 1234);
  CHECK(step["rank"] == 2);
  CHECK(step["time"].get<std::string>().size() == 20);
  CHECK(step["peak_rss_bytes"].get<std::int64_t>() > 0);
  CHECK(step["phases_s"]["forward"] == 0.5);
  CHECK(step["phases_s"]["other"] == 0.5);  // 2.0 - 0.5 - 1.0
  CHECK(lines[1] ==
        nlohmann::json{
            {"eval", true}, {"step", 3}, {"accuracy", 0.75}, {"loss", 0.25}, {"split", "test"}});
  {
    loom::executor::MetricsWriter appended(path.string(), true);
    appended.write_evaluation(4, 1.0, 0.0, "validation");
  }
  CHECK(read_lines(path).size() == 3);
  {
    loom::executor::MetricsWriter fresh(path.string(), false);
    fresh.write_evaluation(1, 1.0, 0.0, "validation");
  }
  CHECK(read_lines(path).size() == 1);
  CHECK_THROWS_AS(loom::executor::MetricsWriter((dir / "no" / "such.jsonl").string(), false),
                  loom::InputError);
  fs::remove_all(dir);
}

TEST_CASE("Log lines of steps and evaluations", "[metrics_writer]") {
  loom::executor::StepLog log;
  log.step = 10;
  log.total_steps = 40;
  log.epoch = 0.25;
  log.loss = 0.693147;
  log.lr = 7.5e-4;
  log.samples_per_s = 512.34;
  log.eta_s = 3.4;
  CHECK(loom::executor::format_step_line(log) ==
        "step 10/40, epoch 0.25: loss 0.6931, lr 7.50e-04, 512.3 samples/s, ETA 0:00:03");
  log.eta_s = 2 * 3600 + 5 * 60 + 7.6;  // rounded to the second
  log.lr = 2e-5;
  CHECK(loom::executor::format_step_line(log) ==
        "step 10/40, epoch 0.25: loss 0.6931, lr 2.00e-05, 512.3 samples/s, ETA 2:05:08");
  CHECK(loom::executor::format_eval_line(40, 40, 1.0, "test", 0.912, 0.23) ==
        "step 40/40, epoch 1.00: test accuracy 91.20 %, loss 0.2300");
  CHECK(loom::executor::format_eval_line(5, 400, 1.0 / 3, "validation", 0.5, 0.69314) ==
        "step 5/400, epoch 0.33: validation accuracy 50.00 %, loss 0.6931");
}

TEST_CASE("median of step times", "[metrics_writer]") {
  CHECK(loom::executor::median({}) == 0.0);
  CHECK(loom::executor::median({3.0, 1.0, 2.0}) == 2.0);
  CHECK(loom::executor::median({4.0, 1.0, 2.0, 3.0}) == 2.5);
}
