#include "executor/metrics_writer.hpp"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <stdexcept>

#include "costmodel/simulator.hpp"
#include "profiles/errors.hpp"

namespace loom::executor {

JsonlWriter::JsonlWriter(const std::string& path, bool append, const char* what)
    : path_(path), what_(what) {
  if (path.empty()) return;
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | (append ? O_APPEND : O_TRUNC), 0644);
  if (fd_ < 0) {
    throw InputError(path, "",
                     std::string("a writable ") + what + " file (" + std::strerror(errno) + ")");
  }
}

JsonlWriter::~JsonlWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void JsonlWriter::write(const nlohmann::ordered_json& line) {
  if (fd_ < 0) return;
  const std::string text = line.dump() + "\n";
  const off_t before = ::lseek(fd_, 0, SEEK_END);
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd_, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error = n < 0 ? errno : ENOSPC;
      if (before >= 0 && ::ftruncate(fd_, before) != 0) {
        // Nothing more to do: the error below names the file.
      }
      throw std::runtime_error("cannot write " + what_ + " " + path_ + ": " + std::strerror(error));
    }
    done += static_cast<std::size_t>(n);
  }
}

StepPhases::Clock::time_point StepPhases::add(double& phase, Clock::time_point from) {
  const Clock::time_point now = Clock::now();
  phase += std::chrono::duration<double>(now - from).count();
  return now;
}

nlohmann::ordered_json StepPhases::to_json(double step_time_s) const {
  const double known = forward_s + backward_s + pipeline_wait_s + gradients_s + optimizer_s;
  using costmodel::Phase;
  nlohmann::ordered_json j;
  j[to_string(Phase::kForward)] = forward_s;
  j[to_string(Phase::kBackward)] = backward_s;
  j[to_string(Phase::kPipelineWait)] = pipeline_wait_s;
  j[to_string(Phase::kGradients)] = gradients_s;
  j[to_string(Phase::kOptimizer)] = optimizer_s;
  j[to_string(Phase::kOther)] = std::max(0.0, step_time_s - known);
  return j;
}

void MetricsWriter::write_step(const StepRecord& r) {
  nlohmann::ordered_json line;
  line["step"] = r.step;
  line["epoch"] = r.epoch;
  line["loss"] = r.loss;
  line["lr"] = r.lr;
  line["samples_per_s"] = static_cast<double>(r.global_batch) / r.step_time_s;
  line["step_time_s"] = r.step_time_s;
  line["peak_memory_bytes"] = r.peak_memory_bytes;
  line["rank"] = r.rank;
  line["time"] = utc_now_iso8601();
  line["peak_rss_bytes"] = peak_rss_bytes();           // an extension: code and libraries included
  line["phases_s"] = r.phases.to_json(r.step_time_s);  // an extension
  if (r.device_used_bytes > 0) line["device_used_bytes"] = r.device_used_bytes;  // CUDA only
  file_.write(line);
}

void MetricsWriter::write_evaluation(std::int64_t step, double accuracy, double loss,
                                     const std::string& split) {
  nlohmann::ordered_json line;
  line["eval"] = true;
  line["step"] = step;
  line["accuracy"] = accuracy;
  line["loss"] = loss;
  line["split"] = split;
  file_.write(line);
}

namespace {

// "step 10/40, epoch 0.25: "
std::string step_prefix(std::int64_t step, std::int64_t total_steps, double epoch) {
  char text[96];
  std::snprintf(text, sizeof text, "step %lld/%lld, epoch %.2f: ", static_cast<long long>(step),
                static_cast<long long>(total_steps), epoch);
  return text;
}

}  // namespace

std::string format_step_line(const StepLog& log) {
  const auto eta_s = static_cast<long long>(std::llround(std::max(0.0, log.eta_s)));
  char text[160];
  std::snprintf(text, sizeof text, "loss %.4f, lr %.2e, %.1f samples/s, ETA %lld:%02lld:%02lld",
                log.loss, log.lr, log.samples_per_s, eta_s / 3600, eta_s / 60 % 60, eta_s % 60);
  return step_prefix(log.step, log.total_steps, log.epoch) + text;
}

std::string format_eval_line(std::int64_t step, std::int64_t total_steps, double epoch,
                             const std::string& split, double accuracy, double loss) {
  char text[96];
  std::snprintf(text, sizeof text, " accuracy %.2f %%, loss %.4f", 100 * accuracy, loss);
  return step_prefix(step, total_steps, epoch) + split + text;
}

ProgressBar::ProgressBar(bool wanted, std::int64_t total_steps)
    : enabled_(wanted && isatty(STDOUT_FILENO) != 0 && isatty(STDERR_FILENO) != 0),
      total_(std::max<std::int64_t>(total_steps, 1)) {}

void ProgressBar::update(std::int64_t step, double loss) const {
  if (!enabled_) return;
  constexpr int kWidth = 30;
  const auto filled = static_cast<int>(kWidth * step / total_);
  std::string bar(static_cast<std::size_t>(filled), '#');
  bar.resize(kWidth, '.');
  std::fprintf(stderr, "\r[%s] step %lld/%lld loss %.4f", bar.c_str(), static_cast<long long>(step),
               static_cast<long long>(total_), loss);
  std::fflush(stderr);
}

void ProgressBar::print_line(const std::string& line) const {
  // "\r\033[K": back to the start of the bar's line and erase it.
  std::fprintf(stderr, "%s%s\n", enabled_ ? "\r\033[K" : "", line.c_str());
  std::fflush(stderr);
}

void ProgressBar::finish() const {
  if (enabled_) std::fprintf(stderr, "\n");
}

std::int64_t peak_rss_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<std::int64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

std::string utc_now_iso8601() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
}

double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const std::size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

}  // namespace loom::executor
