#include "executor/train.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <sstream>

#include "executor/model.hpp"
#include "executor/torch_compat.hpp"
#include "profiles/errors.hpp"
#include "profiles/loader.hpp"

namespace loom::executor {

namespace fs = std::filesystem;
using profiles::ModelSpec;
using profiles::Precision;

const char* to_string(Device device) { return device == Device::kCuda ? "cuda" : "cpu"; }

std::optional<Device> parse_device(const std::string& text) {
  if (text == "cpu") return Device::kCpu;
  if (text == "cuda") return Device::kCuda;
  return std::nullopt;
}

TrainOptions train_options_from_plan(const planner::Plan& plan) {
  const costmodel::Strategy& s = plan.strategy;
  if (s.world_size() != 1) {
    throw InputError("plan", "$.strategy",
                     "dp = tp = pp = 1 for single-rank training, got dp=" + std::to_string(s.dp) +
                         " tp=" + std::to_string(s.tp) + " pp=" + std::to_string(s.pp));
  }
  TrainOptions options;
  options.model = plan.model;
  options.micro_batch = s.micro_batch;
  options.num_micro_batches = s.num_micro_batches;
  options.precision = plan.job.precision;
  return options;
}

namespace {

constexpr const char* kCheckpointFormat = "loom-checkpoint/1";
constexpr const char* kStateFile = "trainer_state.json";

// ---------------------------------------------------------------------------------------------
// Data

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// The example order of one epoch: a Fisher-Yates shuffle driven by (seed, epoch) only.
std::vector<std::int64_t> epoch_order(std::uint64_t seed, std::int64_t epoch, std::int64_t count) {
  std::vector<std::int64_t> order(static_cast<std::size_t>(count));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(splitmix64(seed ^ splitmix64(static_cast<std::uint64_t>(epoch) + 1)));
  for (std::int64_t i = count - 1; i > 0; --i) {
    const auto j = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(i + 1));
    std::swap(order[static_cast<std::size_t>(i)], order[static_cast<std::size_t>(j)]);
  }
  return order;
}

// Checks that every example fits the model; sets (or checks) the common sequence length.
void check_data(const std::vector<EncodedExample>& data, const std::string& source,
                const ModelSpec& spec, std::size_t& seq_len) {
  const std::int64_t types = std::max<std::int64_t>(spec.type_vocab, 1);
  const std::int64_t labels = classifier_labels(spec);
  for (std::size_t i = 0; i < data.size(); ++i) {
    const EncodedExample& e = data[i];
    const std::string where = "example " + std::to_string(i);
    if (seq_len == 0) seq_len = e.input_ids.size();
    if (e.input_ids.size() != seq_len || e.attention_mask.size() != seq_len ||
        e.token_type_ids.size() != seq_len || seq_len == 0) {
      throw InputError(source, where,
                       "input_ids, attention_mask and token_type_ids of one common length " +
                           std::to_string(seq_len));
    }
    for (std::size_t t = 0; t < seq_len; ++t) {
      if (e.input_ids[t] < 0 || e.input_ids[t] >= spec.vocab) {
        throw InputError(source, where,
                         "token ids in [0, " + std::to_string(spec.vocab) + "), found " +
                             std::to_string(e.input_ids[t]));
      }
      if (e.token_type_ids[t] < 0 || e.token_type_ids[t] >= types) {
        throw InputError(source, where, "token types in [0, " + std::to_string(types) + ")");
      }
      if (e.attention_mask[t] != 0 && e.attention_mask[t] != 1) {
        throw InputError(source, where, "an attention mask of 0 and 1");
      }
    }
    if (e.attention_mask[0] != 1) {
      throw InputError(source, where, "a first token that is not padding (attention_mask[0] = 1)");
    }
    if (e.label < 0 || e.label >= labels) {
      throw InputError(source, where, "a label in [0, " + std::to_string(labels) + ")");
    }
  }
  // RoBERTa numbers positions from padding_idx + 1.
  const std::int64_t needed =
      spec.model_type == profiles::ModelType::kRoberta
          ? static_cast<std::int64_t>(seq_len) + pad_token_id(spec.model_type) + 1
          : static_cast<std::int64_t>(seq_len);
  if (!data.empty() && needed > spec.max_positions) {
    throw InputError(source, "sequence length",
                     "at most " + std::to_string(spec.max_positions) +
                         " positions (the model's max_positions), sequences need " +
                         std::to_string(needed));
  }
}

struct Batch {
  EncoderInputs inputs;
  torch::Tensor labels;
};

Batch make_batch(const std::vector<EncodedExample>& data, const std::vector<std::int64_t>& order,
                 std::int64_t begin, std::int64_t count, const torch::Device& device) {
  const auto seq =
      static_cast<std::int64_t>(data[static_cast<std::size_t>(order[0])].input_ids.size());
  const auto options = torch::TensorOptions().dtype(torch::kLong);
  torch::Tensor ids = torch::empty({count, seq}, options);
  torch::Tensor mask = torch::empty({count, seq}, options);
  torch::Tensor types = torch::empty({count, seq}, options);
  torch::Tensor labels = torch::empty({count}, options);
  const std::size_t row_bytes = static_cast<std::size_t>(seq) * sizeof(std::int64_t);
  for (std::int64_t r = 0; r < count; ++r) {
    const EncodedExample& e =
        data[static_cast<std::size_t>(order[static_cast<std::size_t>(begin + r)])];
    std::memcpy(ids.data_ptr<std::int64_t>() + r * seq, e.input_ids.data(), row_bytes);
    std::memcpy(mask.data_ptr<std::int64_t>() + r * seq, e.attention_mask.data(), row_bytes);
    std::memcpy(types.data_ptr<std::int64_t>() + r * seq, e.token_type_ids.data(), row_bytes);
    labels.data_ptr<std::int64_t>()[r] = e.label;
  }
  return {{ids.to(device), mask.to(device), types.to(device)}, labels.to(device)};
}

// ---------------------------------------------------------------------------------------------
// Precision, memory, time

struct MixedPrecision {
  bool autocast = false;
  c10::ScalarType dtype = c10::ScalarType::Float;
  bool loss_scaling = false;
  std::string name = "fp32";
};

MixedPrecision mixed_precision(Device device, Precision precision) {
  MixedPrecision mp;
  if (device != Device::kCuda) return mp;  // CPU trains in fp32
  switch (precision) {
    case Precision::kBf16:
      return {true, c10::ScalarType::BFloat16, false, "bf16"};
    case Precision::kFp16:
      return {true, c10::ScalarType::Half, true, "fp16"};
    case Precision::kTf32:
      mp.name = "tf32";
      return mp;
    case Precision::kFp32:
      return mp;
  }
  return mp;
}

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

std::int64_t peak_memory_bytes(Device device, int device_index) {
  if (device == Device::kCuda) return compat::cuda_peak_allocated_bytes(device_index);
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

// ---------------------------------------------------------------------------------------------
// Optimisation

// Hugging Face's get_linear_schedule_with_warmup, as a rate for the 0-based step.
double learning_rate(const TrainOptions& o, std::int64_t step, std::int64_t total) {
  if (step < o.warmup_steps) {
    return o.lr * static_cast<double>(step) /
           static_cast<double>(std::max<std::int64_t>(1, o.warmup_steps));
  }
  const double rest = static_cast<double>(total - step) /
                      static_cast<double>(std::max<std::int64_t>(1, total - o.warmup_steps));
  return o.lr * std::max(0.0, rest);
}

// AdamW with two groups: weights decay, biases and LayerNorm weights do not (as transformers).
std::unique_ptr<torch::optim::AdamW> make_optimizer(const EncoderClassifier& model,
                                                    const TrainOptions& o) {
  std::vector<torch::Tensor> decay;
  std::vector<torch::Tensor> no_decay;
  for (const auto& [name, parameter] : model.local_parameters()) {
    const bool exempt = name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
    (exempt || name.find("LayerNorm.") != std::string::npos ? no_decay : decay)
        .push_back(parameter);
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

// Total L2 norm of the gradients (as torch.nn.utils.clip_grad_norm_), scaled down to max_norm
// when larger (max_norm > 0). Returns the norm before clipping (inf/nan when a gradient is).
double clip_gradients(const std::vector<torch::Tensor>& parameters, double max_norm) {
  std::vector<torch::Tensor> norms;
  for (const torch::Tensor& p : parameters) {
    if (p.grad().defined()) norms.push_back(p.grad().detach().norm(2).to(torch::kFloat));
  }
  if (norms.empty()) return 0.0;
  const double total = torch::stack(norms).norm(2).item<double>();
  if (max_norm > 0.0 && std::isfinite(total)) {
    const double coefficient = max_norm / (total + 1e-6);
    if (coefficient < 1.0) {
      for (const torch::Tensor& p : parameters) {
        if (p.grad().defined()) p.grad().detach().mul_(coefficient);
      }
    }
  }
  return total;
}

// ---------------------------------------------------------------------------------------------
// Evaluation

struct Evaluation {
  double accuracy = 0.0;
  double loss = 0.0;
};

Evaluation evaluate(EncoderClassifier& model, const std::vector<EncodedExample>& data,
                    std::int64_t batch_size, const torch::Device& device,
                    const MixedPrecision& mp) {
  torch::NoGradGuard no_grad;
  model.eval();
  std::vector<std::int64_t> order(data.size());
  std::iota(order.begin(), order.end(), 0);
  const auto count = static_cast<std::int64_t>(data.size());
  double loss_sum = 0.0;
  std::int64_t correct = 0;
  for (std::int64_t begin = 0; begin < count; begin += batch_size) {
    const std::int64_t n = std::min(batch_size, count - begin);
    const Batch batch = make_batch(data, order, begin, n, device);
    torch::Tensor logits;
    {
      compat::AutocastGuard autocast(device.type(), mp.dtype, mp.autocast);
      logits = model.forward(batch.inputs);
    }
    logits = logits.to(torch::kFloat);
    loss_sum += torch::nn::functional::cross_entropy(
                    logits, batch.labels,
                    torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                    .item<double>();
    correct += logits.argmax(1).eq(batch.labels).sum().item<std::int64_t>();
  }
  model.train();
  return {static_cast<double>(correct) / static_cast<double>(count),
          loss_sum / static_cast<double>(count)};
}

// ---------------------------------------------------------------------------------------------
// Checkpoints

std::string step_folder(std::int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step-%08lld", static_cast<long long>(step));
  return name;
}

// The step of a `step-NNNNNNNN` folder name, or -1.
std::int64_t folder_step(const std::string& name) {
  if (name.size() <= 5 || name.compare(0, 5, "step-") != 0) return -1;
  const std::string digits = name.substr(5);
  if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return -1;
  }
  return std::stoll(digits);
}

std::vector<torch::Tensor> capture_rng(Device device, int device_index) {
  std::vector<torch::Tensor> states;
  at::Generator cpu = at::globalContext().defaultGenerator(c10::DeviceType::CPU);
  {
    std::lock_guard<std::mutex> lock(cpu.mutex());
    states.push_back(cpu.get_state());
  }
  if (device == Device::kCuda) {
    at::Generator cuda = at::globalContext().defaultGenerator(
        c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device_index)));
    std::lock_guard<std::mutex> lock(cuda.mutex());
    states.push_back(cuda.get_state());
  }
  return states;
}

void restore_rng(const std::vector<torch::Tensor>& states, Device device, int device_index,
                 const std::string& source) {
  const std::size_t expected = device == Device::kCuda ? 2 : 1;
  if (states.size() != expected) {
    throw InputError(source, "", "the RNG states of a " + std::string(to_string(device)) + " run");
  }
  at::Generator cpu = at::globalContext().defaultGenerator(c10::DeviceType::CPU);
  {
    std::lock_guard<std::mutex> lock(cpu.mutex());
    cpu.set_state(states[0]);
  }
  if (device == Device::kCuda) {
    at::Generator cuda = at::globalContext().defaultGenerator(
        c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device_index)));
    std::lock_guard<std::mutex> lock(cuda.mutex());
    cuda.set_state(states[1]);
  }
}

void write_checkpoint(const fs::path& dir, std::int64_t step, EncoderClassifier& model,
                      torch::optim::AdamW& optimizer, const std::vector<torch::Tensor>& rng,
                      const nlohmann::ordered_json& state) {
  fs::create_directories(dir);
  const std::string name = step_folder(step);
  const std::string pid = std::to_string(static_cast<long long>(getpid()));
  const fs::path tmp = dir / (".tmp-" + name + "-" + pid);
  fs::remove_all(tmp);
  fs::create_directory(tmp);
  model.save_safetensors((tmp / "model.safetensors").string());
  torch::save(optimizer, (tmp / "optimizer.pt").string());
  torch::save(rng, (tmp / "rng.pt").string());
  profiles::write_file_atomically((tmp / kStateFile).string(), state.dump(2) + "\n");
  const fs::path target = dir / name;
  if (fs::exists(target)) {  // the same step written again: swap, then drop the old one
    const fs::path old = dir / (".old-" + name + "-" + pid);
    fs::remove_all(old);
    fs::rename(target, old);
    fs::rename(tmp, target);
    fs::remove_all(old);
  } else {
    fs::rename(tmp, target);
  }
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::int64_t other = folder_step(entry.path().filename().string());
    if (other >= 0 && other < step) fs::remove_all(entry.path());
  }
}

nlohmann::json read_json_file(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw InputError(path.string(), "", "a readable file");
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw InputError(path.string(), "", std::string("valid JSON (") + e.what() + ")");
  }
}

// ---------------------------------------------------------------------------------------------
// Output

class ProgressBar {
 public:
  ProgressBar(bool wanted, std::int64_t total)
      : enabled_(wanted && isatty(STDOUT_FILENO) != 0 && isatty(STDERR_FILENO) != 0),
        total_(std::max<std::int64_t>(total, 1)) {}
  void update(std::int64_t step, double loss) const {
    if (!enabled_) return;
    constexpr int kWidth = 30;
    const auto filled = static_cast<int>(kWidth * step / total_);
    std::string bar(static_cast<std::size_t>(filled), '#');
    bar.resize(kWidth, '.');
    std::fprintf(stderr, "\r[%s] step %lld/%lld loss %.4f", bar.c_str(),
                 static_cast<long long>(step), static_cast<long long>(total_), loss);
    std::fflush(stderr);
  }
  void finish() const {
    if (enabled_) std::fprintf(stderr, "\n");
  }

 private:
  bool enabled_;
  std::int64_t total_;
};

class MetricsWriter {
 public:
  MetricsWriter(const std::string& path, bool append) {
    if (path.empty()) return;
    out_.open(path, append ? std::ios::app : std::ios::trunc);
    if (!out_) throw InputError(path, "", "a writable metrics file");
  }
  void write(const nlohmann::ordered_json& line) {
    if (!out_.is_open()) return;
    out_ << line.dump() << '\n';
    out_.flush();
  }

 private:
  std::ofstream out_;
};

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
}

}  // namespace

std::optional<std::string> latest_checkpoint(const std::string& checkpoint_dir) {
  std::error_code error;
  if (checkpoint_dir.empty() || !fs::is_directory(checkpoint_dir, error)) return std::nullopt;
  std::int64_t best = -1;
  fs::path best_path;
  for (const auto& entry : fs::directory_iterator(checkpoint_dir, error)) {
    const std::int64_t step = folder_step(entry.path().filename().string());
    if (step > best && fs::exists(entry.path() / kStateFile, error)) {
      best = step;
      best_path = entry.path();
    }
  }
  if (best < 0) return std::nullopt;
  return best_path.string();
}

TrainSummary train_classifier(const TrainOptions& o, const std::vector<EncodedExample>& train_data,
                              const std::vector<EncodedExample>& validation_data) {
  check_options(o);
  const ModelSpec& spec = o.model;
  parameter_table(spec);  // refuses non-encoder specs with an InputError
  std::size_t seq_len = 0;
  check_data(train_data, "training data", spec, seq_len);
  check_data(validation_data, "validation data", spec, seq_len);

  const std::int64_t global_batch = o.micro_batch * o.num_micro_batches;
  const auto train_count = static_cast<std::int64_t>(train_data.size());
  if (train_count < global_batch) {
    throw InputError("training data", "",
                     "at least one global batch (" + std::to_string(global_batch) +
                         " examples), got " + std::to_string(train_count));
  }
  const std::int64_t steps_per_epoch = train_count / global_batch;
  const std::int64_t total_steps = o.steps > 0 ? o.steps : o.epochs * steps_per_epoch;

  if (o.device == Device::kCuda && !compat::cuda_available()) {
    throw InputError("--device", "",
                     "cuda needs a CUDA build of LibTorch and a visible GPU; use --device cpu");
  }
  const int device_index = o.device_index;
  const torch::Device device =
      o.device == Device::kCuda
          ? torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(device_index))
          : torch::Device(torch::kCPU);
  const MixedPrecision mp = mixed_precision(o.device, o.precision);
  if (o.device == Device::kCuda) {
    at::globalContext().setAllowTF32CuBLAS(o.precision == Precision::kTf32);
    at::globalContext().setAllowTF32CuDNN(o.precision == Precision::kTf32);
  }

  torch::manual_seed(o.seed);  // dropout draws from LibTorch's default generators
  EncoderOptions model_options;
  model_options.dropout = o.dropout;
  model_options.seed = o.seed;
  model_options.device = device;
  EncoderClassifier model(spec, model_options);
  model.train();

  // Resume, or start from the init weights.
  std::int64_t start_step = 0;
  LossScaler scaler;
  std::optional<std::string> checkpoint =
      o.resume ? latest_checkpoint(o.checkpoint_dir) : std::nullopt;
  if (checkpoint) {
    const fs::path dir(*checkpoint);
    const nlohmann::json state = read_json_file(dir / kStateFile);
    const std::string source = (dir / kStateFile).string();
    auto expect = [&](const char* key, const nlohmann::json& value, const std::string& what) {
      if (!state.contains(key) || state[key] != value) {
        throw InputError(source, std::string("$.") + key,
                         what + " of this run (" + value.dump() + ")");
      }
    };
    expect("format", kCheckpointFormat, "the format");
    expect("model", profiles::model_to_json(spec), "the model");
    expect("seed", o.seed, "the seed");
    expect("global_batch", global_batch, "the global batch");
    expect("train_examples", train_count, "the number of training examples");
    try {
      start_step = state.at("step").get<std::int64_t>();
      scaler.scale = state.at("loss_scale").get<double>();
      scaler.good_steps = state.at("loss_scale_good_steps").get<std::int64_t>();
    } catch (const nlohmann::json::exception& e) {
      throw InputError(source, "", std::string("step and loss-scale fields (") + e.what() + ")");
    }
    model.load_safetensors((dir / "model.safetensors").string());
  } else if (!o.init_weights.empty()) {
    model.load_safetensors(o.init_weights);
  }

  std::vector<torch::Tensor> parameters;
  for (const auto& entry : model.local_parameters()) parameters.push_back(entry.second);
  std::unique_ptr<torch::optim::AdamW> optimizer = make_optimizer(model, o);
  if (checkpoint) {
    const fs::path dir(*checkpoint);
    std::vector<torch::Tensor> rng;
    try {
      torch::load(*optimizer, (dir / "optimizer.pt").string());
      torch::load(rng, (dir / "rng.pt").string());
    } catch (const c10::Error& e) {
      throw InputError(
          dir.string(), "optimizer.pt / rng.pt",
          std::string("a readable optimizer and RNG state (") + e.what_without_backtrace() + ")");
    }
    move_optimizer_state(*optimizer, device);
    restore_rng(rng, o.device, device_index, (dir / "rng.pt").string());
  }

  TrainSummary summary;
  summary.total_steps = total_steps;
  summary.precision = mp.name;
  if (checkpoint) summary.resumed_from_step = start_step;
  summary.steps = start_step;

  MetricsWriter metrics(o.metrics_path, checkpoint.has_value());
  ProgressBar progress(o.progress, total_steps);
  if (o.device == Device::kCuda) compat::cuda_reset_peak(device_index);
  const std::int64_t eval_batch = o.eval_batch > 0 ? o.eval_batch : o.micro_batch;
  std::vector<double> step_times_s;
  std::int64_t cached_epoch = -1;
  std::vector<std::int64_t> order;
  std::int64_t last_eval_step = -1;

  auto run_evaluation = [&](std::int64_t step) {
    if (validation_data.empty()) return;
    const Evaluation result = evaluate(model, validation_data, eval_batch, device, mp);
    summary.validation_accuracy = result.accuracy;
    summary.validation_loss = result.loss;
    last_eval_step = step;
    nlohmann::ordered_json line;
    line["eval"] = true;
    line["step"] = step;
    line["accuracy"] = result.accuracy;
    line["loss"] = result.loss;
    metrics.write(line);
  };

  const std::int64_t end_step =
      o.stop_after_step > 0 ? std::min(o.stop_after_step, total_steps) : total_steps;
  for (std::int64_t step = start_step; step < end_step; ++step) {
    const auto started = std::chrono::steady_clock::now();
    const std::int64_t epoch = step / steps_per_epoch;
    const std::int64_t offset = (step % steps_per_epoch) * global_batch;
    if (epoch != cached_epoch) {
      order = epoch_order(o.seed, epoch, train_count);
      cached_epoch = epoch;
    }

    optimizer->zero_grad();
    double step_loss = 0.0;
    for (std::int64_t m = 0; m < o.num_micro_batches; ++m) {
      const Batch batch =
          make_batch(train_data, order, offset + m * o.micro_batch, o.micro_batch, device);
      torch::Tensor logits;
      {
        compat::AutocastGuard autocast(device.type(), mp.dtype, mp.autocast);
        logits = model.forward(batch.inputs);
      }
      const torch::Tensor loss =
          torch::nn::functional::cross_entropy(logits.to(torch::kFloat), batch.labels) /
          static_cast<double>(o.num_micro_batches);
      if (mp.loss_scaling) {
        (loss * scaler.scale).backward();
      } else {
        loss.backward();
      }
      step_loss += loss.item<double>();
    }

    bool apply = true;
    if (mp.loss_scaling) {
      for (const torch::Tensor& p : parameters) {
        if (p.grad().defined()) p.grad().detach().mul_(1.0 / scaler.scale);
      }
    }
    const double grad_norm = clip_gradients(parameters, o.max_grad_norm);
    if (mp.loss_scaling) apply = scaler.update(std::isfinite(grad_norm));
    const double lr = learning_rate(o, step, total_steps);
    set_learning_rate(*optimizer, lr);
    if (apply) optimizer->step();
    if (o.device == Device::kCuda) compat::cuda_synchronize(device_index);
    const double step_time_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();

    step_times_s.push_back(step_time_s);
    summary.losses.push_back(step_loss);
    summary.steps = step + 1;
    if ((step + 1) % o.log_every == 0 || step + 1 == end_step) {
      nlohmann::ordered_json line;
      line["step"] = step + 1;
      line["epoch"] = epoch;
      line["loss"] = step_loss;
      line["lr"] = lr;
      line["samples_per_s"] = static_cast<double>(global_batch) / step_time_s;
      line["step_time_s"] = step_time_s;
      line["peak_memory_bytes"] = peak_memory_bytes(o.device, device_index);
      line["rank"] = o.rank;
      line["time"] = utc_now_iso8601();
      metrics.write(line);
    }
    progress.update(step + 1, step_loss);

    if (o.eval_every > 0 && (step + 1) % o.eval_every == 0) run_evaluation(step + 1);

    const bool last = step + 1 == end_step;
    if (!o.checkpoint_dir.empty() &&
        ((o.checkpoint_every > 0 && (step + 1) % o.checkpoint_every == 0) || last)) {
      nlohmann::ordered_json state;
      state["format"] = kCheckpointFormat;
      state["step"] = step + 1;
      state["epoch"] = (step + 1) / steps_per_epoch;
      state["sample_offset"] = ((step + 1) % steps_per_epoch) * global_batch;
      state["seed"] = o.seed;
      state["global_batch"] = global_batch;
      state["micro_batch"] = o.micro_batch;
      state["num_micro_batches"] = o.num_micro_batches;
      state["total_steps"] = total_steps;
      state["train_examples"] = train_count;
      state["loss_scale"] = scaler.scale;
      state["loss_scale_good_steps"] = scaler.good_steps;
      state["model"] = profiles::model_to_json(spec);
      write_checkpoint(o.checkpoint_dir, step + 1, model, *optimizer,
                       capture_rng(o.device, device_index), state);
    }
  }
  progress.finish();

  const bool finished = summary.steps == total_steps;
  if (finished && last_eval_step != summary.steps) run_evaluation(summary.steps);

  summary.final_loss = summary.losses.empty() ? 0.0 : summary.losses.back();
  summary.median_step_time_s = median(step_times_s);
  summary.samples_per_s = summary.median_step_time_s > 0.0
                              ? static_cast<double>(global_batch) / summary.median_step_time_s
                              : 0.0;
  summary.peak_memory_bytes = peak_memory_bytes(o.device, device_index);
  return summary;
}

}  // namespace loom::executor
