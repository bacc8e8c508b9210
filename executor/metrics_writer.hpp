// What loom train writes while it runs, without LibTorch (the io library): metrics.jsonl
// (docs/formats.md), the --dump-batches file, and on stderr the log lines and the progress bar.
// One writer serves the one-rank and the many-rank loops, so both write the same lines.
//
// Lines of metrics.jsonl, one JSON object each:
//   {"step", "epoch", "loss", "lr", "samples_per_s", "step_time_s", "peak_memory_bytes", "rank",
//    "time", "peak_rss_bytes", "phases_s"} after a logged step (write_step);
//   {"eval": true, "step", "accuracy", "loss", "split"} after an evaluation (write_evaluation;
//   "split" names the evaluation set: "validation", "test", ...).
// Log lines on stderr (format_step_line, format_eval_line), one per logged step or evaluation:
//   step 10/40, epoch 0.25: loss 0.6931, lr 7.50e-04, 512.3 samples/s, ETA 0:00:03
//   step 40/40, epoch 1.00: test accuracy 91.20 %, loss 0.2300
#pragma once

#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace loom::executor {

// A JSON-lines file, one line per write. A line that cannot be written whole (disk full,
// file-size limit) is cut back off the file and reported (std::runtime_error naming the file),
// so the file never ends in half a line. An empty path writes nothing.
class JsonlWriter {
 public:
  // Appends when `append` (a resumed run), else truncates. Throws InputError (source: path) when
  // the file cannot be opened; `what` names it ("metrics", "batches").
  JsonlWriter(const std::string& path, bool append, const char* what);
  ~JsonlWriter();
  JsonlWriter(const JsonlWriter&) = delete;
  JsonlWriter& operator=(const JsonlWriter&) = delete;

  void write(const nlohmann::ordered_json& line);

 private:
  std::string path_;
  std::string what_;
  int fd_ = -1;
};

// Seconds spent in each phase of a step (phases_s): each phase adds the time of the scopes it
// measures; "other" is what the step took beyond them (batches, zeroing, ZeRO-3's gather before
// the step, the loss's all-reduces). Keyed as the simulator names its predicted phases
// (costmodel::Phase), so loom validate can pair them.
struct StepPhases {
  double forward_s = 0;        // forward passes and the loss
  double backward_s = 0;       // backward passes, with what their gradient hooks start
  double pipeline_wait_s = 0;  // receives and the step's last sends
  double gradients_s = 0;      // reduction over dp (what the backward pass left), norm, clipping
  double optimizer_s = 0;      // AdamW and ZeRO-1/2's parameter all-gather

  using Clock = std::chrono::steady_clock;
  // Adds the time since `from` to `phase` and returns now.
  static Clock::time_point add(double& phase, Clock::time_point from);
  nlohmann::ordered_json to_json(double step_time_s) const;
};

// One logged training step.
struct StepRecord {
  std::int64_t step = 0;  // completed optimizer steps (1-based)
  std::int64_t epoch = 0;
  double loss = 0;  // mean training loss over the step's global batch
  double lr = 0;    // the rate the step used
  std::int64_t global_batch = 0;
  double step_time_s = 0;
  std::int64_t peak_memory_bytes = 0;
  int rank = 0;
  StepPhases phases;
  // The device's memory in use at the step's end (CUDA only; 0: not written).
  std::int64_t device_used_bytes = 0;
};

// metrics.jsonl. An empty path writes nothing (ranks other than world rank 0).
class MetricsWriter {
 public:
  MetricsWriter(const std::string& path, bool append) : file_(path, append, "metrics") {}
  // samples_per_s = global_batch / step_time_s; "time" is now (ISO-8601 UTC); peak_rss_bytes is
  // the process's peak resident set.
  void write_step(const StepRecord& record);
  void write_evaluation(std::int64_t step, double accuracy, double loss, const std::string& split);

 private:
  JsonlWriter file_;
};

// What a log line of a training step says. `epoch` counts epochs done, fractional (step /
// steps_per_epoch); samples_per_s is over the steps since the previous line; eta_s is the time
// the rest of the run should take.
struct StepLog {
  std::int64_t step = 0;  // completed optimizer steps (1-based)
  std::int64_t total_steps = 0;
  double epoch = 0;
  double loss = 0;
  double lr = 0;
  double samples_per_s = 0;
  double eta_s = 0;
};
// "step 10/40, epoch 0.25: loss 0.6931, lr 7.50e-04, 512.3 samples/s, ETA 0:00:03" (no newline;
// the ETA as H:MM:SS, rounded to the second).
std::string format_step_line(const StepLog& log);
// "step 40/40, epoch 1.00: test accuracy 91.20 %, loss 0.2300" (no newline).
std::string format_eval_line(std::int64_t step, std::int64_t total_steps, double epoch,
                             const std::string& split, double accuracy, double loss);

// A progress bar on stderr when `wanted` and both stdout and stderr are terminals, and the log
// lines around it.
class ProgressBar {
 public:
  ProgressBar(bool wanted, std::int64_t total_steps);
  void update(std::int64_t step, double loss) const;
  // Writes `line` and a newline to stderr, whether or not the bar is shown; a shown bar's line is
  // cleared first (the next update draws the bar again below the line).
  void print_line(const std::string& line) const;
  void finish() const;

 private:
  bool enabled_;
  std::int64_t total_;
};

// The process's peak resident set (code, libraries and allocator slack included), in bytes.
std::int64_t peak_rss_bytes();
// Now as "YYYY-MM-DDTHH:MM:SSZ".
std::string utc_now_iso8601();
// The median (the mean of the middle two for an even count); 0 for none.
double median(std::vector<double> values);

}  // namespace loom::executor
