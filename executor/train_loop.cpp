#include "executor/train_loop.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <string>

namespace loom::executor {

std::int64_t warmup_steps(const TrainOptions& o, std::int64_t total) {
  if (o.warmup_steps > 0) return o.warmup_steps;
  return std::llround(o.warmup_share * static_cast<double>(total));
}

double learning_rate(const TrainOptions& o, std::int64_t step, std::int64_t total) {
  const std::int64_t warmup = warmup_steps(o, total);
  if (step < warmup) {
    return o.lr * static_cast<double>(step) /
           static_cast<double>(std::max<std::int64_t>(1, warmup));
  }
  const double rest = static_cast<double>(total - step) /
                      static_cast<double>(std::max<std::int64_t>(1, total - warmup));
  return o.lr * std::max(0.0, rest);
}

namespace {

// The loop's state between steps.
class Loop {
 public:
  Loop(const TrainOptions& o, const RunSize& size, std::int64_t train_examples, bool has_validation,
       TrainRank& rank)
      : o_(o),
        size_(size),
        train_examples_(train_examples),
        has_validation_(has_validation),
        rank_(rank),
        metrics_(rank.lead() || o.metrics_every_rank ? o.metrics_path : std::string(),
                 rank.resumed_from_step().has_value()),
        progress_(o.progress && rank.lead(), size.total_steps),
        print_every_(!rank.lead() ? 0
                     : o.print_every == TrainOptions::kAutoPrintEvery
                         ? std::max<std::int64_t>(1, size.total_steps / 20)
                         : std::max<std::int64_t>(0, o.print_every)) {
    summary_.total_steps = size.total_steps;
    summary_.precision = rank.precision();
    summary_.resumed_from_step = rank.resumed_from_step();
    summary_.steps = rank.resumed_from_step().value_or(0);
    rank_.begin();
  }

  TrainSummary run() {
    const std::int64_t end_step = o_.stop_after_step > 0
                                      ? std::min(o_.stop_after_step, size_.total_steps)
                                      : size_.total_steps;
    if (print_every_ != 0 && !o_.first_log_line.empty()) progress_.print_line(o_.first_log_line);
    if (print_every_ != 0 && summary_.resumed_from_step) {
      progress_.print_line("resumed from step " + std::to_string(*summary_.resumed_from_step) +
                           " of " + std::to_string(size_.total_steps) +
                           " (the latest checkpoint in " + o_.checkpoint_dir + ")");
    }
    run_started_ = std::chrono::steady_clock::now();
    first_step_ = summary_.steps;
    for (std::int64_t step = summary_.steps; step < end_step; ++step) {
      if (!run_step(step, end_step)) break;
    }
    progress_.finish();
    const bool finished = summary_.steps == size_.total_steps && summary_.stopped_by_signal == 0;
    // A stop signal during the final evaluation abandons it: the run reports the signal.
    if (finished && last_eval_step_ != summary_.steps && !evaluate(summary_.steps)) {
      summary_.stopped_by_signal = rank_.stop_signal();
    }
    if (finished && summary_.stopped_by_signal == 0 && !o_.output_dir.empty()) {
      rank_.write_output(o_.output_dir);
    }
    rank_.finish();
    summary_.final_loss = summary_.losses.empty() ? 0.0 : summary_.losses.back();
    summary_.median_step_time_s = median(step_times_s_);
    summary_.samples_per_s =
        summary_.median_step_time_s > 0.0
            ? static_cast<double>(size_.global_batch) / summary_.median_step_time_s
            : 0.0;
    summary_.peak_memory_bytes = rank_.peak_memory_bytes();
    return summary_;
  }

 private:
  // Runs one step and what follows it; false when a stop signal ends the run after it.
  bool run_step(std::int64_t step, std::int64_t end_step) {
    const auto started = std::chrono::steady_clock::now();
    const std::int64_t epoch = step / size_.steps_per_epoch;
    const std::int64_t offset = (step % size_.steps_per_epoch) * size_.global_batch;
    if (epoch != cached_epoch_) {
      order_ = epoch_order(o_.seed, epoch, train_examples_);
      cached_epoch_ = epoch;
    }
    const double lr = learning_rate(o_, step, size_.total_steps);
    StepPhases phases;
    const double loss = rank_.train_step(step, order_, offset, lr, phases);
    const double step_time_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();

    step_times_s_.push_back(step_time_s);
    summary_.losses.push_back(loss);
    summary_.steps = step + 1;
    if ((step + 1) % o_.log_every == 0 || step + 1 == end_step) {
      metrics_.write_step({step + 1, epoch, loss, lr, size_.global_batch, step_time_s,
                           rank_.peak_memory_bytes(), rank_.rank(), phases,
                           rank_.device_used_bytes()});
    }
    print_step(step, end_step, loss, lr);
    progress_.update(step + 1, loss);
    // Not started once a stop signal arrived; abandoned when one arrives during it.
    if (rank_.stop_signal() == 0 && o_.eval_every > 0 && (step + 1) % o_.eval_every == 0) {
      evaluate(step + 1);
    }
    const int signal = rank_.stop_signal();
    const bool last = step + 1 == end_step || signal != 0;
    if (!o_.checkpoint_dir.empty() &&
        ((o_.checkpoint_every > 0 && (step + 1) % o_.checkpoint_every == 0) || last)) {
      rank_.save_checkpoint(step + 1);
    }
    if (signal != 0) {
      summary_.stopped_by_signal = signal;
      return false;
    }
    return true;
  }

  // The log line of `step` (0-based) when it is due: every print_every steps and the run's last.
  void print_step(std::int64_t step, std::int64_t end_step, double loss, double lr) {
    if (print_every_ == 0 || ((step + 1) % print_every_ != 0 && step + 1 != end_step)) return;
    // The steps since the previous line.
    const double interval_s =
        std::accumulate(step_times_s_.begin() + static_cast<std::ptrdiff_t>(printed_steps_),
                        step_times_s_.end(), 0.0);
    const auto interval_steps = static_cast<double>(step_times_s_.size() - printed_steps_);
    printed_steps_ = step_times_s_.size();
    const double elapsed_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - run_started_).count();
    const auto done = static_cast<double>(step + 1 - first_step_);
    StepLog log;
    log.step = step + 1;
    log.total_steps = size_.total_steps;
    log.epoch = epochs_done(step + 1);
    log.loss = loss;
    log.lr = lr;
    log.samples_per_s =
        interval_s > 0 ? interval_steps * static_cast<double>(size_.global_batch) / interval_s : 0;
    log.eta_s = elapsed_s / done * static_cast<double>(end_step - step - 1);
    progress_.print_line(format_step_line(log));
  }

  double epochs_done(std::int64_t steps) const {
    return static_cast<double>(steps) / static_cast<double>(size_.steps_per_epoch);
  }

  // False, with nothing written, when a stop signal abandoned it.
  bool evaluate(std::int64_t step) {
    if (!has_validation_) return true;
    const std::optional<Evaluation> result = rank_.evaluate();
    if (!result) return false;
    summary_.validation_accuracy = result->accuracy;
    summary_.validation_loss = result->loss;
    last_eval_step_ = step;
    metrics_.write_evaluation(step, result->accuracy, result->loss, o_.eval_split_name);
    if (print_every_ != 0) {
      progress_.print_line(format_eval_line(step, size_.total_steps, epochs_done(step),
                                            o_.eval_split_name, result->accuracy, result->loss));
    }
    return true;
  }

  const TrainOptions& o_;
  RunSize size_;
  std::int64_t train_examples_;
  bool has_validation_;
  TrainRank& rank_;
  MetricsWriter metrics_;
  ProgressBar progress_;
  std::int64_t print_every_;  // 0: no log lines (ranks other than world rank 0)
  std::chrono::steady_clock::time_point run_started_;
  std::int64_t first_step_ = 0;    // the first step this call runs (a resumed run's is not 0)
  std::size_t printed_steps_ = 0;  // step times counted in earlier log lines
  TrainSummary summary_;
  std::vector<double> step_times_s_;
  std::int64_t cached_epoch_ = -1;
  std::vector<std::int64_t> order_;
  std::int64_t last_eval_step_ = -1;
};

}  // namespace

TrainSummary run_training(const TrainOptions& options, const RunSize& size,
                          std::int64_t train_examples, bool has_validation, TrainRank& rank) {
  return Loop(options, size, train_examples, has_validation, rank).run();
}

}  // namespace loom::executor
