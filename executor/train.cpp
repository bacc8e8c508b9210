#include "executor/train.hpp"

#include <cmath>
#include <exception>
#include <numeric>
#include <thread>

#include "costmodel/schedule.hpp"
#include "executor/device.hpp"
#include "executor/device_batch.hpp"
#include "executor/distributed.hpp"
#include "executor/model.hpp"
#include "executor/torch_compat.hpp"
#include "executor/train_loop.hpp"
#include "profiles/errors.hpp"

namespace loom::executor {

using profiles::Precision;

const char* to_string(Device device) { return device == Device::kCuda ? "cuda" : "cpu"; }

std::optional<Device> parse_device(const std::string& text) {
  if (text == "cpu") return Device::kCpu;
  if (text == "cuda") return Device::kCuda;
  return std::nullopt;
}

TrainOptions train_options_from_plan(const planner::Plan& plan) {
  const costmodel::Strategy& s = plan.strategy;
  TrainOptions options;
  options.model = plan.model;
  options.micro_batch = s.micro_batch;
  options.num_micro_batches = s.num_micro_batches;
  options.precision = plan.job.precision;
  options.dp = s.dp;
  options.tp = s.tp;
  options.pp = s.pp;
  options.zero = s.zero;
  options.schedule = s.schedule;
  options.virtual_stages = s.virtual_stages;
  options.recompute = s.recompute;
  options.recompute_layers = s.recompute_layers;
  options.sequence_parallel = s.sequence_parallel;
  options.attention = s.attention;
  options.stages = plan.stages;
  return options;
}

namespace {

void check_options(const TrainOptions& o) {
  if (o.micro_batch <= 0) throw InputError("plan", "$.strategy.micro_batch", "a positive number");
  if (o.num_micro_batches <= 0) {
    throw InputError("plan", "$.strategy.num_micro_batches", "a positive number");
  }
  if ((o.steps > 0) == (o.epochs > 0) || o.steps < 0 || o.epochs < 0) {
    throw InputError("--steps", "", "exactly one of --steps and --epochs, positive");
  }
  if (!(o.lr > 0.0) || !std::isfinite(o.lr)) throw InputError("--lr", "", "a positive rate");
  if (o.warmup_steps < 0) throw InputError("--warmup-steps", "", "a non-negative count");
  if (!(o.warmup_share >= 0.0 && o.warmup_share < 1.0)) {
    throw InputError("--warmup-steps", "", "a warm-up share in [0, 1)");
  }
  if (o.weight_decay < 0.0) throw InputError("--weight-decay", "", "a non-negative value");
  if (o.max_grad_norm < 0.0) throw InputError("--max-grad-norm", "", "a non-negative value");
  if (o.eval_every < 0) throw InputError("--eval-every", "", "a non-negative count");
  if (o.eval_batch < 0) throw InputError("--eval-batch", "", "a non-negative count");
  if (o.log_every <= 0) throw InputError("--log-every", "", "a positive count");
  if (o.checkpoint_every < 0) throw InputError("--checkpoint-every", "", "a non-negative count");
  if (o.stop_after_step < 0) throw InputError("--stop-after-step", "", "a non-negative count");
  if (o.device_index < 0) throw InputError("--device", "", "a non-negative CUDA device index");
  if (o.resume && o.checkpoint_dir.empty()) {
    throw InputError("--resume", "", "a checkpoint directory (--checkpoint DIR)");
  }
  if (o.sequence_parallel && o.tp < 2) {
    throw InputError("plan", "$.strategy.sequence_parallel",
                     "false with tp = 1 (sequence parallelism splits the sequence over the "
                     "tensor-parallel ranks): re-plan with --sp off or tp > 1");
  }
  if (!runs_attention(o.attention)) {
    throw InputError("plan", "$.strategy.attention",
                     std::string("a kernel this LibTorch runs: ") +
                         costmodel::to_string(o.attention) +
                         " needs LibTorch 2 or later (scaled_dot_product_attention); re-plan "
                         "with --attention math");
  }
}

void check_parallel_options(const TrainOptions& o, ParallelGroups& groups) {
  if (groups.dp_size() != o.dp || groups.tp_size() != o.tp || groups.pp_size() != o.pp) {
    throw InputError(
        "plan", "$.strategy",
        "a layout matching the process groups (dp=" + std::to_string(groups.dp_size()) +
            " tp=" + std::to_string(groups.tp_size()) + " pp=" + std::to_string(groups.pp_size()) +
            "), got dp=" + std::to_string(o.dp) + " tp=" + std::to_string(o.tp) +
            " pp=" + std::to_string(o.pp));
  }
  if (o.zero < 0 || o.zero > 3) throw InputError("plan", "$.strategy.zero", "0, 1, 2 or 3");
  if (auto why =
          costmodel::check_schedule(o.schedule, o.pp, o.num_micro_batches, o.virtual_stages)) {
    throw InputError("plan", "$.strategy", "a schedule the pipeline can run: " + *why);
  }
  if (o.device == Device::kCuda && o.precision == Precision::kFp16) {
    throw InputError("--device", "", "bf16, tf32 or fp32 with many ranks on cuda (no fp16 yet)");
  }
  if (!o.batches_path.empty()) {
    throw InputError("--dump-batches", "", "a one-rank plan (dp = tp = pp = 1)");
  }
  if (!o.stages.empty() && static_cast<int>(o.stages.size()) != o.pp * o.virtual_stages) {
    throw InputError("plan", "$.stages",
                     "pp * virtual_stages = " + std::to_string(o.pp * o.virtual_stages) +
                         " stages, got " + std::to_string(o.stages.size()));
  }
}

// The checks both entry points share; returns the data's sequence length.
std::size_t check_data(const TrainOptions& o, const std::vector<EncodedExample>& train_data,
                       const std::vector<EncodedExample>& validation_data) {
  parameter_table(o.model);  // refuses non-encoder specs with an InputError
  std::size_t seq_len = 0;
  check_examples(train_data, "training data", o.model, seq_len);
  check_examples(validation_data, "validation data", o.model, seq_len);
  if (o.sequence_parallel && o.tp > 0 && seq_len % static_cast<std::size_t>(o.tp) != 0) {
    throw InputError("plan", "$.strategy.sequence_parallel",
                     "a sequence length divisible by tp = " + std::to_string(o.tp) +
                         " (each tensor-parallel rank holds an equal part), got " +
                         std::to_string(seq_len) + ": re-plan with --sp off or pad the data");
  }
  return seq_len;
}

}  // namespace

TrainSummary train_classifier(const TrainOptions& o, const std::vector<EncodedExample>& train_data,
                              const std::vector<EncodedExample>& validation_data) {
  check_options(o);
  CpuMemoryScope memory;  // counts this thread's CPU tensors from here on
  if (o.dp * o.tp * o.pp != 1) {
    throw InputError("plan", "$.strategy",
                     "dp = tp = pp = 1 for single-rank training (many ranks need process groups), "
                     "got dp=" +
                         std::to_string(o.dp) + " tp=" + std::to_string(o.tp) +
                         " pp=" + std::to_string(o.pp));
  }
  check_data(o, train_data, validation_data);
  const RunSize size =
      run_size(o.dp, o.micro_batch, o.num_micro_batches, o.steps, o.epochs, train_data.size());
  const std::unique_ptr<TrainRank> rank =
      make_single_rank(o, size, train_data, validation_data, memory.counter());
  return run_training(o, size, static_cast<std::int64_t>(train_data.size()),
                      !validation_data.empty(), *rank);
}

TrainSummary train_classifier(const TrainOptions& o, const std::vector<EncodedExample>& train_data,
                              const std::vector<EncodedExample>& validation_data,
                              ParallelGroups& groups) {
  check_options(o);
  CpuMemoryScope memory;  // counts this thread's CPU tensors from here on
  check_parallel_options(o, groups);
  const std::size_t seq_len = check_data(o, train_data, validation_data);
  const RunSize size =
      run_size(o.dp, o.micro_batch, o.num_micro_batches, o.steps, o.epochs, train_data.size());
  const std::unique_ptr<TrainRank> rank =
      make_parallel_rank(o, size, train_data, validation_data, seq_len, groups, memory.counter());
  return run_training(o, size, static_cast<std::int64_t>(train_data.size()),
                      !validation_data.empty(), *rank);
}

TrainSummary train_local_ranks(const TrainOptions& o, const std::vector<EncodedExample>& train_data,
                               const std::vector<EncodedExample>& validation_data) {
  const int world = static_cast<int>(o.dp * o.tp * o.pp);
  if (world == 1) return train_classifier(o, train_data, validation_data);
  const auto store = make_local_store();
  std::vector<TrainSummary> summaries(static_cast<std::size_t>(world));
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(world));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        GroupOptions g;
        g.timeout = std::chrono::seconds(60);
        ParallelGroups groups(store, rank, static_cast<int>(o.dp), static_cast<int>(o.tp),
                              static_cast<int>(o.pp), g);
        TrainOptions mine = o;
        mine.rank = rank;
        mine.progress = o.progress && rank == 0;
        mine.ranks_in_process = world;
        summaries[static_cast<std::size_t>(rank)] =
            train_classifier(mine, train_data, validation_data, groups);
      } catch (...) {
        errors[static_cast<std::size_t>(rank)] = std::current_exception();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const std::exception_ptr& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  return summaries.front();
}

std::vector<std::vector<double>> classifier_logits(const LogitsRequest& r) {
  parameter_table(r.model);  // refuses non-encoder specs with an InputError
  const std::size_t count = r.input_ids.size();
  if (count == 0) throw InputError(r.source, "$.input_ids", "at least one row of token ids");
  for (const auto& [rows, field] : {std::pair{&r.attention_mask, "$.attention_mask"},
                                    std::pair{&r.token_type_ids, "$.token_type_ids"}}) {
    if (!rows->empty() && rows->size() != count) {
      throw InputError(r.source, field, std::to_string(count) + " rows, as many as input_ids");
    }
  }
  // The rows as examples (label 0), checked as training data is.
  std::vector<EncodedExample> rows(count);
  for (std::size_t i = 0; i < count; ++i) {
    EncodedExample& e = rows[i];
    e.input_ids = r.input_ids[i];
    const std::size_t length = e.input_ids.size();
    e.attention_mask =
        r.attention_mask.empty() ? std::vector<std::int64_t>(length, 1) : r.attention_mask[i];
    e.token_type_ids =
        r.token_type_ids.empty() ? std::vector<std::int64_t>(length, 0) : r.token_type_ids[i];
  }
  std::size_t seq_len = 0;
  check_examples(rows, r.source, r.model, seq_len);
  const torch::Device device = prepare_device(r.device, r.device_index, r.precision);
  const MixedPrecision mp = mixed_precision(r.device, r.precision);
  EncoderOptions options;
  options.dropout = 0.0;
  options.seed = r.seed;
  options.device = device;
  EncoderClassifier model(r.model, options);
  if (!r.weights.empty()) model.load_safetensors(r.weights);
  model.eval();
  torch::NoGradGuard no_grad;
  std::vector<std::int64_t> order(count);
  std::iota(order.begin(), order.end(), 0);
  const Batch batch = make_batch(rows, order, 0, static_cast<std::int64_t>(count), device);
  torch::Tensor logits;
  {
    compat::AutocastGuard autocast(device.type(), mp.dtype, mp.autocast);
    logits = model.forward(batch.inputs);
  }
  logits = logits.to(torch::kCPU).to(torch::kDouble).contiguous();
  std::vector<std::vector<double>> out(count);
  const double* data = logits.data_ptr<double>();
  const std::int64_t labels = logits.size(1);
  for (std::size_t i = 0; i < count; ++i) {
    const double* row = data + static_cast<std::int64_t>(i) * labels;
    out[i].assign(row, row + labels);
  }
  return out;
}

}  // namespace loom::executor
