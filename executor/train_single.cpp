// The one-rank engine of the training loop (train_loop.hpp): one EncoderClassifier, gradient
// accumulation over the micro-batches, torch::optim::AdamW state stepped by adamw_step, and
// fp16's dynamic loss scaling on cuda.
#include <csignal>
#include <filesystem>
#include <memory>
#include <numeric>

#include "executor/checkpoint.hpp"
#include "executor/device.hpp"
#include "executor/device_batch.hpp"
#include "executor/flat_adamw.hpp"
#include "executor/hf_export.hpp"
#include "executor/model.hpp"
#include "executor/reshard.hpp"
#include "executor/torch_compat.hpp"
#include "executor/train_loop.hpp"
#include "profiles/errors.hpp"
#include "profiles/loader.hpp"

namespace loom::executor {

namespace {

namespace fs = std::filesystem;

// Dynamic loss scaling for fp16 (the defaults of torch.cuda.amp.GradScaler).
struct LossScaler {
  double scale = 65536.0;
  std::int64_t good_steps = 0;
  static constexpr std::int64_t kGrowthInterval = 2000;

  // After an unscaled step: false (skip the step, halve the scale) when gradients overflowed.
  bool update(bool finite) {
    if (!finite) {
      scale *= 0.5;
      good_steps = 0;
      return false;
    }
    if (++good_steps == kGrowthInterval) {
      scale *= 2.0;
      good_steps = 0;
    }
    return true;
  }
};

// AdamW with two groups: weights decay, biases and LayerNorm weights do not (as transformers).
std::unique_ptr<torch::optim::AdamW> make_optimizer(const EncoderClassifier& model,
                                                    const TrainOptions& o) {
  std::vector<torch::Tensor> decay;
  std::vector<torch::Tensor> no_decay;
  for (const auto& [name, parameter] : model.local_parameters()) {
    (weight_decay_applies(name) ? decay : no_decay).push_back(parameter);
  }
  auto options = [&o](double weight_decay) {
    return torch::optim::AdamWOptions(o.lr)
        .betas(std::make_tuple(0.9, 0.999))
        .eps(1e-8)
        .weight_decay(weight_decay);
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(options(o.weight_decay)));
  groups.emplace_back(no_decay, std::make_unique<torch::optim::AdamWOptions>(options(0.0)));
  return std::make_unique<torch::optim::AdamW>(groups, options(o.weight_decay));
}

void set_learning_rate(torch::optim::AdamW& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) {
    static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
  }
}

// Moves loaded optimizer state to `device` (torch::load keeps the device it was saved from). All
// parameters live on one device, so the state's keys need not be matched to them.
void move_optimizer_state(torch::optim::AdamW& optimizer, const torch::Device& device) {
  for (auto& entry : optimizer.state()) {
    auto& state = static_cast<torch::optim::AdamWParamState&>(*entry.second);
    state.exp_avg(state.exp_avg().to(device));
    state.exp_avg_sq(state.exp_avg_sq().to(device));
    if (state.max_exp_avg_sq().defined()) state.max_exp_avg_sq(state.max_exp_avg_sq().to(device));
  }
}

// Scores `data` in batches of `batch_size`, summing on the device and reading once. nullopt when
// `stop_signal` (checked before every batch) became non-zero first.
std::optional<Evaluation> evaluate_model(EncoderClassifier& model,
                                         const std::vector<EncodedExample>& data,
                                         std::int64_t batch_size, const torch::Device& device,
                                         const MixedPrecision& mp,
                                         const std::atomic<int>* stop_signal) {
  torch::NoGradGuard no_grad;
  model.eval();
  std::vector<std::int64_t> order(data.size());
  std::iota(order.begin(), order.end(), 0);
  const auto count = static_cast<std::int64_t>(data.size());
  torch::Tensor sums =
      torch::zeros({2}, torch::TensorOptions().dtype(torch::kDouble).device(device));
  for (std::int64_t begin = 0; begin < count; begin += batch_size) {
    if (stop_signal != nullptr && stop_signal->load() != 0) {
      model.train();
      return std::nullopt;
    }
    const std::int64_t n = std::min(batch_size, count - begin);
    const Batch batch = make_batch(data, order, begin, n, device);
    torch::Tensor logits;
    {
      compat::AutocastGuard autocast(device.type(), mp.dtype, mp.autocast);
      logits = model.forward(batch.inputs);
    }
    logits = logits.to(torch::kFloat);
    sums[0] += torch::nn::functional::cross_entropy(
        logits, batch.labels,
        torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
    sums[1] += logits.argmax(1).eq(batch.labels).sum();
  }
  model.train();
  const torch::Tensor host = sums.to(torch::kCPU);
  return Evaluation{host[1].item<double>() / static_cast<double>(count),
                    host[0].item<double>() / static_cast<double>(count)};
}

EncoderOptions model_options(const TrainOptions& o, const torch::Device& device) {
  EncoderOptions options;
  options.dropout = o.dropout;
  options.seed = o.seed;
  options.device = device;
  options.recompute = o.recompute;
  options.recompute_layers = o.recompute_layers;
  options.attention = o.attention;
  return options;
}

class SingleRank final : public TrainRank {
 public:
  SingleRank(const TrainOptions& o, const RunSize& size,
             const std::vector<EncodedExample>& train_data,
             const std::vector<EncodedExample>& validation_data, CpuMemoryCounter& cpu_memory)
      : o_(o),
        size_(size),
        train_data_(train_data),
        validation_data_(validation_data),
        device_(prepare_device(o.device, o.device_index, o.precision)),
        mp_(mixed_precision(o.device, o.precision)),
        model_((torch::manual_seed(o.seed), o.model), model_options(o, device_)),
        device_memory_(o.device == Device::kCuda, o.device_index, cpu_memory,
                       o.ranks_in_process > 1) {
    hf_ = hf_folder_of(o, true);  // refuses bad labels, tokenizer files or --output now
    model_.train();
    const std::optional<std::string> checkpoint =
        o.resume ? latest_checkpoint(o.checkpoint_dir) : std::nullopt;
    if (checkpoint) {
      load_trainer_state(*checkpoint);
      if (!resharded_) {
        model_.load_safetensors((fs::path(*checkpoint) / "model.safetensors").string());
      }
    } else if (!o.init_weights.empty()) {
      model_.load_safetensors(o.init_weights);
    }
    for (const auto& entry : model_.local_parameters()) parameters_.push_back(entry.second);
    optimizer_ = make_optimizer(model_, o);
    if (checkpoint) load_optimizer_and_rng(*checkpoint);
  }

  std::optional<std::int64_t> resumed_from_step() const override { return resumed_from_; }
  const char* precision() const override { return mp_.name.c_str(); }
  int rank() const override { return o_.rank; }
  bool lead() const override { return true; }
  void begin() override {
    batches_ = std::make_unique<JsonlWriter>(o_.batches_path, resumed_from_.has_value(), "batches");
    // Peak bytes of this rank's tensors (what the cost model predicts), the training steps' alone.
    device_memory_.reset_peak();
  }
  double train_step(std::int64_t step, const std::vector<std::int64_t>& order, std::int64_t offset,
                    double lr, StepPhases& phases) override;
  int stop_signal() override { return o_.stop_signal != nullptr ? o_.stop_signal->load() : 0; }
  std::optional<Evaluation> evaluate() override {
    const std::int64_t batch = o_.eval_batch > 0 ? o_.eval_batch : o_.micro_batch;
    return evaluate_model(model_, validation_data_, batch, device_, mp_, o_.stop_signal);
  }
  void save_checkpoint(std::int64_t step_done) override;
  void write_output(const std::string& dir) override {
    write_hf_folder(dir, hf_, model_.full_state());
  }
  std::int64_t peak_memory_bytes() const override { return device_memory_.peak_bytes(); }
  std::int64_t device_used_bytes() const override { return device_memory_.device_used_bytes(); }
  void finish() override {}

 private:
  void load_trainer_state(const std::string& checkpoint);
  void load_optimizer_and_rng(const std::string& checkpoint);
  void zero_gradients();

  const TrainOptions& o_;
  RunSize size_;
  const std::vector<EncodedExample>& train_data_;
  const std::vector<EncodedExample>& validation_data_;
  torch::Device device_;
  MixedPrecision mp_;
  EncoderClassifier model_;
  DeviceMemory device_memory_;
  std::vector<torch::Tensor> parameters_;
  std::unique_ptr<torch::optim::AdamW> optimizer_;
  LossScaler scaler_;
  std::optional<std::int64_t> resumed_from_;
  std::unique_ptr<JsonlWriter> batches_;
  // A many-rank checkpoint's state as full tensors, from the trainer state to the optimizer's
  // creation (executor/reshard.hpp).
  std::unique_ptr<TrainingState> resharded_;
  HfFolder hf_;  // what step folders and the output folder say besides the weights
};

void SingleRank::load_trainer_state(const std::string& checkpoint) {
  const fs::path dir(checkpoint);
  const nlohmann::json state = read_trainer_state(dir);
  const std::string source = (dir / kTrainerStateFile).string();
  check_trainer_state(state, source, o_.model, o_.seed, size_.global_batch,
                      static_cast<std::int64_t>(train_data_.size()));
  if (needs_reshard(state, o_)) {  // a many-rank checkpoint: no loss scale (no fp16 there)
    resharded_ = std::make_unique<TrainingState>(read_training_state(dir, state));
    resumed_from_ = state.value("step", std::int64_t{0});
    return;
  }
  try {
    resumed_from_ = state.at("step").get<std::int64_t>();
    scaler_.scale = state.at("loss_scale").get<double>();
    scaler_.good_steps = state.at("loss_scale_good_steps").get<std::int64_t>();
  } catch (const nlohmann::json::exception& e) {
    throw InputError(source, "", std::string("step and loss-scale fields (") + e.what() + ")");
  }
}

void SingleRank::load_optimizer_and_rng(const std::string& checkpoint) {
  if (resharded_) {
    load_training_state(*resharded_, model_, *optimizer_, device_);
    restore_resharded_rng(*resharded_, o_.device, o_.device_index);
    resharded_.reset();
    return;
  }
  const fs::path dir(checkpoint);
  std::vector<torch::Tensor> rng;
  try {
    torch::load(*optimizer_, (dir / "optimizer.pt").string());
    torch::load(rng, (dir / "rng.pt").string());
  } catch (const c10::Error& e) {
    throw InputError(
        dir.string(), "optimizer.pt / rng.pt",
        std::string("a readable optimizer and RNG state (") + e.what_without_backtrace() + ")");
  }
  move_optimizer_state(*optimizer_, device_);
  restore_rng(rng, o_.device, o_.device_index, (dir / "rng.pt").string());
}

// As torch's zero_grad differs by version (1.13 zeroes in place, 2.x sets to none): in place on
// the CPU, where a fresh gradient's first-touched pages cost more than zeroing; set to none on
// CUDA, where the caching allocator hands the memory back at once (what the cost model charges:
// zeroed_gradient_parameters).
void SingleRank::zero_gradients() {
  for (torch::Tensor& p : parameters_) {
    torch::Tensor& grad = p.mutable_grad();
    if (!grad.defined()) continue;
    if (device_.is_cpu()) {
      grad.zero_();
    } else {
      grad = torch::Tensor();
    }
  }
}

double SingleRank::train_step(std::int64_t step, const std::vector<std::int64_t>& order,
                              std::int64_t offset, double lr, StepPhases& phases) {
  zero_gradients();
  // The step's loss, summed on the device: read once the step's work is queued.
  torch::Tensor loss_sum = torch::zeros({}, torch::TensorOptions().device(device_));
  for (std::int64_t m = 0; m < o_.num_micro_batches; ++m) {
    const std::int64_t begin = offset + m * o_.micro_batch;
    const Batch batch = make_batch(train_data_, order, begin, o_.micro_batch, device_);
    if (!o_.batches_path.empty()) {
      batches_->write(batch_json(step + 1, m, train_data_, order, begin, o_.micro_batch));
    }
    torch::Tensor logits;
    auto at = StepPhases::Clock::now();
    {
      compat::AutocastGuard autocast(device_.type(), mp_.dtype, mp_.autocast);
      logits = model_.forward(batch.inputs);
    }
    const torch::Tensor loss =
        torch::nn::functional::cross_entropy(logits.to(torch::kFloat), batch.labels) /
        static_cast<double>(o_.num_micro_batches);
    at = StepPhases::add(phases.forward_s, at);
    if (mp_.loss_scaling) {
      (loss * scaler_.scale).backward();
    } else {
      loss.backward();
    }
    StepPhases::add(phases.backward_s, at);
    loss_sum += loss.detach();
    if (o_.fault_kill_in_step == step + 1) ::raise(SIGKILL);  // fault injection
  }

  auto at = StepPhases::Clock::now();
  bool apply = true;
  if (mp_.loss_scaling) {
    for (const torch::Tensor& p : parameters_) {
      if (p.grad().defined()) p.grad().detach().mul_(1.0 / scaler_.scale);
    }
  }
  const torch::Tensor grad_norm = clip_gradients(parameters_, o_.max_grad_norm);
  // fp16's dynamic loss scaling decides on the host whether the step applies (a read of the
  // norm); bf16 and fp32 steps never wait for the device before their end.
  if (mp_.loss_scaling) apply = scaler_.update(std::isfinite(grad_norm.item<double>()));
  at = StepPhases::add(phases.gradients_s, at);
  set_learning_rate(*optimizer_, lr);
  if (apply) adamw_step(*optimizer_);
  const double step_loss = loss_sum.item<double>();
  if (o_.device == Device::kCuda) cuda_synchronize(o_.device_index);
  StepPhases::add(phases.optimizer_s, at);
  return step_loss;
}

void SingleRank::save_checkpoint(std::int64_t step_done) {
  nlohmann::ordered_json state;
  state["format"] = kCheckpointFormat;
  state["step"] = step_done;
  state["epoch"] = step_done / size_.steps_per_epoch;
  state["sample_offset"] = (step_done % size_.steps_per_epoch) * size_.global_batch;
  state["seed"] = o_.seed;
  state["global_batch"] = size_.global_batch;
  state["micro_batch"] = o_.micro_batch;
  state["num_micro_batches"] = o_.num_micro_batches;
  state["total_steps"] = size_.total_steps;
  state["train_examples"] = static_cast<std::int64_t>(train_data_.size());
  state["loss_scale"] = scaler_.scale;
  state["loss_scale_good_steps"] = scaler_.good_steps;
  state["model"] = profiles::model_to_json(o_.model);
  StepFolderExtras extras;
  extras.write_files = [this](const fs::path& folder) { write_hf_files(folder, hf_); };
  extras.keep = o_.keep_checkpoints;
  write_checkpoint(o_.checkpoint_dir, step_done, model_, *optimizer_,
                   capture_rng(o_.device, o_.device_index), state, extras,
                   o_.fault_kill_in_checkpoint == step_done);
}

}  // namespace

std::unique_ptr<TrainRank> make_single_rank(const TrainOptions& options, const RunSize& size,
                                            const std::vector<EncodedExample>& train_data,
                                            const std::vector<EncodedExample>& validation_data,
                                            CpuMemoryCounter& cpu_memory) {
  return std::make_unique<SingleRank>(options, size, train_data, validation_data, cpu_memory);
}

}  // namespace loom::executor
