#include "executor/train.hpp"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
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
#include <thread>

#include "costmodel/simulator.hpp"
#include "executor/distributed.hpp"
#include "executor/flat_adamw.hpp"
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
  options.stages = plan.stages;
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
  // RoBERTa numbers positions from padding_idx + 1 (profiles::max_sequence_length).
  const std::int64_t longest = profiles::max_sequence_length(spec);
  if (!data.empty() && static_cast<std::int64_t>(seq_len) > longest) {
    throw InputError(source, "sequence length",
                     "at most " + std::to_string(longest) + " tokens (the model's max_positions " +
                         std::to_string(spec.max_positions) + "), found " +
                         std::to_string(seq_len));
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
  // On CUDA the batch is staged in pinned host memory and copied without blocking: a copy from
  // pageable memory would wait for the device's queue to drain (between micro-batches too).
  const bool pinned = device.is_cuda();
  const auto options = torch::TensorOptions().dtype(torch::kLong).pinned_memory(pinned);
  torch::Tensor ids = torch::empty({count, seq}, options);
  torch::Tensor mask = torch::empty({count, seq}, options);
  torch::Tensor types = torch::empty({count, seq}, options);
  torch::Tensor labels = torch::empty({count}, options);
  const std::size_t row_bytes = static_cast<std::size_t>(seq) * sizeof(std::int64_t);
  bool padded = false;
  for (std::int64_t r = 0; r < count; ++r) {
    const EncodedExample& e =
        data[static_cast<std::size_t>(order[static_cast<std::size_t>(begin + r)])];
    std::memcpy(ids.data_ptr<std::int64_t>() + r * seq, e.input_ids.data(), row_bytes);
    std::memcpy(mask.data_ptr<std::int64_t>() + r * seq, e.attention_mask.data(), row_bytes);
    std::memcpy(types.data_ptr<std::int64_t>() + r * seq, e.token_type_ids.data(), row_bytes);
    labels.data_ptr<std::int64_t>()[r] = e.label;
    padded = padded || std::find(e.attention_mask.begin(), e.attention_mask.end(), 0) !=
                           e.attention_mask.end();
  }
  // A batch without padding carries no mask (EncoderInputs: undefined = no padding), so attention
  // may use the kernels that take none (flash attention on CUDA); known here on the host, so no
  // device synchronisation (transformers checks the mask on the device for the same purpose).
  auto to_device = [&](const torch::Tensor& t) { return t.to(device, /*non_blocking=*/pinned); };
  return {{to_device(ids), padded ? to_device(mask) : torch::Tensor(), to_device(types)},
          to_device(labels)};
}

// One line of TrainOptions::batches_path: the micro-batch of `count` examples from position
// `begin` of `order`, as make_batch builds it, written from the host's examples (no copy back from
// the device, so no synchronisation inside the step).
nlohmann::ordered_json batch_json(std::int64_t step, std::int64_t micro_batch,
                                  const std::vector<EncodedExample>& data,
                                  const std::vector<std::int64_t>& order, std::int64_t begin,
                                  std::int64_t count) {
  nlohmann::ordered_json line;
  line["step"] = step;
  line["micro_batch"] = micro_batch;
  for (const char* key : {"input_ids", "attention_mask", "token_type_ids"}) {
    line[key] = nlohmann::ordered_json::array();
  }
  std::vector<std::int64_t> labels;
  for (std::int64_t r = 0; r < count; ++r) {
    const EncodedExample& e =
        data[static_cast<std::size_t>(order[static_cast<std::size_t>(begin + r)])];
    line["input_ids"].push_back(e.input_ids);
    line["attention_mask"].push_back(e.attention_mask);
    line["token_type_ids"].push_back(e.token_type_ids);
    labels.push_back(e.label);
  }
  line["labels"] = labels;
  return line;
}

// ---------------------------------------------------------------------------------------------
// Precision, memory, time

struct MixedPrecision {
  bool autocast = false;
  c10::ScalarType dtype = c10::ScalarType::Float;
  bool loss_scaling = false;
  std::string name = "fp32";
};

// What one run's options and data fix before training: the global batch (dp * micro_batch *
// num_micro_batches), steps per epoch and in all, and the device. Shared by the single-rank and
// the many-rank loops.
struct RunShape {
  std::int64_t global_batch = 0;
  std::int64_t steps_per_epoch = 0;
  std::int64_t total_steps = 0;
  torch::Device device = torch::kCPU;
};

// The torch device that `device` names (CUDA: GPU `device_index`), or an InputError for cuda
// without a GPU. On CUDA it also sets LibTorch's global TF32 switches: on for tf32, off for every
// other precision (fp32 stays exact fp32, as in torch.backends with allow_tf32 = False).
torch::Device prepare_device(Device device, int device_index, Precision precision) {
  if (device != Device::kCuda) return torch::kCPU;
  if (!compat::cuda_available()) {
    throw InputError("--device", "",
                     "cuda needs a CUDA build of LibTorch and a visible GPU; use --device cpu");
  }
  compat::cuda_set_device(device_index);
  at::globalContext().setAllowTF32CuBLAS(precision == Precision::kTf32);
  at::globalContext().setAllowTF32CuDNN(precision == Precision::kTf32);
  return {torch::kCUDA, static_cast<c10::DeviceIndex>(device_index)};
}

RunShape run_shape(const TrainOptions& o, std::size_t train_examples) {
  RunShape r;
  r.global_batch = o.dp * o.micro_batch * o.num_micro_batches;
  const auto train_count = static_cast<std::int64_t>(train_examples);
  if (train_count < r.global_batch) {
    throw InputError("training data", "",
                     "at least one global batch (" + std::to_string(r.global_batch) +
                         " examples), got " + std::to_string(train_count));
  }
  r.steps_per_epoch = train_count / r.global_batch;
  r.total_steps = o.steps > 0 ? o.steps : o.epochs * r.steps_per_epoch;
  r.device = prepare_device(o.device, o.device_index, o.precision);
  return r;
}

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

// The process's peak resident set (code, libraries and allocator slack included).
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

// Seconds spent in each phase of a step (metrics.jsonl's phases_s): each phase adds the time of
// the scopes it measures; "other" is what the step took beyond them (batches, zeroing, ZeRO-3's
// gather before the step, the loss's all-reduces).
struct StepPhases {
  double forward_s = 0;        // forward passes and the loss
  double backward_s = 0;       // backward passes, with what their gradient hooks start
  double pipeline_wait_s = 0;  // receives and the step's last sends
  double gradients_s = 0;      // reduction over dp (what the backward pass left), norm, clipping
  double optimizer_s = 0;      // AdamW and ZeRO-1/2's parameter all-gather

  using Clock = std::chrono::steady_clock;
  // Adds the time since `from` to `phase` and returns now.
  static Clock::time_point add(double& phase, Clock::time_point from) {
    const Clock::time_point now = Clock::now();
    phase += std::chrono::duration<double>(now - from).count();
    return now;
  }
  nlohmann::ordered_json to_json(double step_time_s) const {
    const double known = forward_s + backward_s + pipeline_wait_s + gradients_s + optimizer_s;
    // Keyed as the simulator names its predicted phases, so loom validate can pair them.
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
};

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

// ---------------------------------------------------------------------------------------------
// Evaluation

struct Evaluation {
  double accuracy = 0.0;
  double loss = 0.0;
};

// Many ranks agree on a stop signal during an evaluation every this many rounds of batches.
constexpr std::int64_t kStopCheckRounds = 16;

// A stop vote over the world, summed by an all-reduce: slot s - 1 counts the ranks that received
// signal s (1..kStopSignalSlots). Every rank then reads the same signal from the sum: the
// lowest-numbered one that any rank received (0: none), and so exits with the same code. The
// cost model charges the step's all-reduce of the loss and this vote (kStepStatsBytes).
constexpr std::int64_t kStopSignalSlots = costmodel::kStepStopSignalSlots;

void add_stop_vote(torch::Tensor slots, const std::atomic<int>* stop_signal) {
  const int signal = stop_signal != nullptr ? stop_signal->load() : 0;
  if (signal >= 1 && signal <= kStopSignalSlots) slots[signal - 1] += 1.0;
}

int agreed_stop_signal(const torch::Tensor& summed_slots) {
  const torch::Tensor host = summed_slots.to(torch::kCPU).contiguous();
  const auto votes = host.accessor<double, 1>();
  for (std::int64_t i = 0; i < kStopSignalSlots; ++i) {
    if (votes[i] != 0.0) return static_cast<int>(i + 1);
  }
  return 0;
}

// Scores `data` in batches of `batch_size`, summing on the device and reading once. nullopt when
// `stop_signal` (checked before every batch) became non-zero first.
std::optional<Evaluation> evaluate(EncoderClassifier& model,
                                   const std::vector<EncodedExample>& data, std::int64_t batch_size,
                                   const torch::Device& device, const MixedPrecision& mp,
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
                      const nlohmann::ordered_json& state, bool kill_midway) {
  fs::create_directories(dir);
  const std::string name = step_folder(step);
  const std::string pid = std::to_string(static_cast<long long>(getpid()));
  const fs::path tmp = dir / (".tmp-" + name + "-" + pid);
  fs::remove_all(tmp);
  fs::create_directory(tmp);
  // Everything goes to the temporary folder first; a failure (disk full) removes it, so the
  // checkpoints under their final names stay whole.
  auto failed = [&](const std::string& what) {
    std::error_code ignored;
    fs::remove_all(tmp, ignored);
    throw std::runtime_error("cannot write checkpoint " + (dir / name).string() + ": " + what);
  };
  try {
    model.save_safetensors((tmp / "model.safetensors").string());
    if (kill_midway) ::raise(SIGKILL);  // fault injection (TrainOptions::fault_kill_in_checkpoint)
    torch::save(optimizer, (tmp / "optimizer.pt").string());
    torch::save(rng, (tmp / "rng.pt").string());
    profiles::write_file_atomically((tmp / kStateFile).string(), state.dump(2) + "\n");
  } catch (const c10::Error& e) {
    failed(e.what_without_backtrace());
  } catch (const std::exception& e) {
    failed(e.what());
  }
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

// metrics.jsonl, one line per write. A line that cannot be written whole (disk full, file-size
// limit) is cut back off the file and reported, so the file never ends in half a line.
class MetricsWriter {
 public:
  MetricsWriter(const std::string& path, bool append, const char* what = "metrics")
      : path_(path), what_(what) {
    if (path.empty()) return;
    fd_ =
        ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | (append ? O_APPEND : O_TRUNC), 0644);
    if (fd_ < 0) {
      throw InputError(path, "",
                       std::string("a writable ") + what + " file (" + std::strerror(errno) + ")");
    }
  }
  ~MetricsWriter() {
    if (fd_ >= 0) ::close(fd_);
  }
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  void write(const nlohmann::ordered_json& line) {
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
        throw std::runtime_error("cannot write " + what_ + " " + path_ + ": " +
                                 std::strerror(error));
      }
      done += static_cast<std::size_t>(n);
    }
  }

 private:
  std::string path_;
  std::string what_;
  int fd_ = -1;
};

// A checkpoint's trainer_state.json against this run: the same format, model, seed, global
// batch, training examples and (many ranks) parallel layout, or an InputError naming the field.
void check_checkpoint_state(const nlohmann::json& state, const std::string& source,
                            const ModelSpec& spec, std::uint64_t seed, std::int64_t global_batch,
                            std::int64_t train_count, const nlohmann::json* layout) {
  auto expect = [&](const char* key, const nlohmann::json& value, const std::string& what) {
    if (!state.contains(key) || state[key] != value) {
      throw InputError(source, std::string("$.") + key,
                       what + " of this run (" + value.dump() + ")");
    }
  };
  expect("format", kCheckpointFormat, "the format");
  expect("model", profiles::model_to_json(spec), "the model");
  expect("seed", seed, "the seed");
  expect("global_batch", global_batch, "the global batch");
  expect("train_examples", train_count, "the number of training examples");
  if (layout != nullptr) expect("layout", *layout, "the parallel layout");
}

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
  check_data(rows, r.source, r.model, seq_len);
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
  compat::CpuMemoryScope memory;  // counts this thread's CPU tensors from here on
  if (o.dp * o.tp * o.pp != 1) {
    throw InputError("plan", "$.strategy",
                     "dp = tp = pp = 1 for single-rank training (many ranks need process groups), "
                     "got dp=" +
                         std::to_string(o.dp) + " tp=" + std::to_string(o.tp) +
                         " pp=" + std::to_string(o.pp));
  }
  const ModelSpec& spec = o.model;
  parameter_table(spec);  // refuses non-encoder specs with an InputError
  std::size_t seq_len = 0;
  check_data(train_data, "training data", spec, seq_len);
  check_data(validation_data, "validation data", spec, seq_len);

  const RunShape run = run_shape(o, train_data.size());
  const auto train_count = static_cast<std::int64_t>(train_data.size());
  const std::int64_t global_batch = run.global_batch;
  const std::int64_t steps_per_epoch = run.steps_per_epoch;
  const std::int64_t total_steps = run.total_steps;
  const int device_index = o.device_index;
  const torch::Device device = run.device;
  const MixedPrecision mp = mixed_precision(o.device, o.precision);

  torch::manual_seed(o.seed);  // dropout draws from LibTorch's default generators
  EncoderOptions model_options;
  model_options.dropout = o.dropout;
  model_options.seed = o.seed;
  model_options.device = device;
  model_options.recompute = o.recompute;
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
    check_checkpoint_state(state, source, spec, o.seed, global_batch, train_count, nullptr);
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
  MetricsWriter batches(o.batches_path, checkpoint.has_value(), "batches");
  ProgressBar progress(o.progress, total_steps);
  // Peak bytes of this rank's tensors (what the cost model predicts: parameters, gradients,
  // optimizer states, activations and buffers; not the process's code and libraries), the
  // training steps' alone: the model is built, sharded and loaded before this point (a
  // tensor-parallel rank's full-size initial weights are a transient of construction).
  compat::DeviceMemory device_memory(o.device == Device::kCuda, device_index, memory.counter(),
                                     o.ranks_in_process > 1);
  device_memory.reset_peak();
  const std::int64_t eval_batch = o.eval_batch > 0 ? o.eval_batch : o.micro_batch;
  std::vector<double> step_times_s;
  std::int64_t cached_epoch = -1;
  std::vector<std::int64_t> order;
  std::int64_t last_eval_step = -1;

  // False, with nothing written, when a stop signal abandoned it.
  auto run_evaluation = [&](std::int64_t step) -> bool {
    if (validation_data.empty()) return true;
    const std::optional<Evaluation> result =
        evaluate(model, validation_data, eval_batch, device, mp, o.stop_signal);
    if (!result) return false;
    summary.validation_accuracy = result->accuracy;
    summary.validation_loss = result->loss;
    last_eval_step = step;
    nlohmann::ordered_json line;
    line["eval"] = true;
    line["step"] = step;
    line["accuracy"] = result->accuracy;
    line["loss"] = result->loss;
    metrics.write(line);
    return true;
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

    // As torch's zero_grad differs by version (1.13 zeroes in place, 2.x sets to none): in place
    // on the CPU, where a fresh gradient's first-touched pages cost more than zeroing; set to none
    // on CUDA, where the caching allocator hands the memory back at once (what the cost model
    // charges: zeroed_gradient_parameters).
    for (torch::Tensor& p : parameters) {
      torch::Tensor& grad = p.mutable_grad();
      if (!grad.defined()) continue;
      if (device.is_cpu()) {
        grad.zero_();
      } else {
        grad = torch::Tensor();
      }
    }
    // The step's loss, summed on the device: read once the step's work is queued.
    torch::Tensor loss_sum = torch::zeros({}, torch::TensorOptions().device(device));
    StepPhases phases;
    for (std::int64_t m = 0; m < o.num_micro_batches; ++m) {
      const std::int64_t begin = offset + m * o.micro_batch;
      const Batch batch = make_batch(train_data, order, begin, o.micro_batch, device);
      if (!o.batches_path.empty()) {
        batches.write(batch_json(step + 1, m, train_data, order, begin, o.micro_batch));
      }
      torch::Tensor logits;
      auto at = StepPhases::Clock::now();
      {
        compat::AutocastGuard autocast(device.type(), mp.dtype, mp.autocast);
        logits = model.forward(batch.inputs);
      }
      const torch::Tensor loss =
          torch::nn::functional::cross_entropy(logits.to(torch::kFloat), batch.labels) /
          static_cast<double>(o.num_micro_batches);
      at = StepPhases::add(phases.forward_s, at);
      if (mp.loss_scaling) {
        (loss * scaler.scale).backward();
      } else {
        loss.backward();
      }
      StepPhases::add(phases.backward_s, at);
      loss_sum += loss.detach();
      if (o.fault_kill_in_step == step + 1) ::raise(SIGKILL);  // fault injection
    }

    auto at = StepPhases::Clock::now();
    bool apply = true;
    if (mp.loss_scaling) {
      for (const torch::Tensor& p : parameters) {
        if (p.grad().defined()) p.grad().detach().mul_(1.0 / scaler.scale);
      }
    }
    const torch::Tensor grad_norm = clip_gradients(parameters, o.max_grad_norm);
    // fp16's dynamic loss scaling decides on the host whether the step applies (a read of the
    // norm); bf16 and fp32 steps never wait for the device before their end.
    if (mp.loss_scaling) apply = scaler.update(std::isfinite(grad_norm.item<double>()));
    at = StepPhases::add(phases.gradients_s, at);
    const double lr = learning_rate(o, step, total_steps);
    set_learning_rate(*optimizer, lr);
    if (apply) adamw_step(*optimizer);
    const double step_loss = loss_sum.item<double>();
    if (o.device == Device::kCuda) compat::cuda_synchronize(device_index);
    StepPhases::add(phases.optimizer_s, at);
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
      line["peak_memory_bytes"] = device_memory.peak_bytes();
      line["rank"] = o.rank;
      line["time"] = utc_now_iso8601();
      line["peak_rss_bytes"] = peak_rss_bytes();       // an extension: code and libraries included
      line["phases_s"] = phases.to_json(step_time_s);  // an extension
      metrics.write(line);
    }
    progress.update(step + 1, step_loss);

    if (o.eval_every > 0 && (step + 1) % o.eval_every == 0) run_evaluation(step + 1);

    const bool stopping = o.stop_signal != nullptr && o.stop_signal->load() != 0;
    const bool last = step + 1 == end_step || stopping;
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
                       capture_rng(o.device, device_index), state,
                       o.fault_kill_in_checkpoint == step + 1);
    }
    if (stopping) {
      summary.stopped_by_signal = o.stop_signal->load();
      break;
    }
  }
  progress.finish();

  const bool finished = summary.steps == total_steps && summary.stopped_by_signal == 0;
  // A stop signal during the final evaluation abandons it: the run reports the signal.
  if (finished && last_eval_step != summary.steps && !run_evaluation(summary.steps)) {
    summary.stopped_by_signal = o.stop_signal->load();
  }

  summary.final_loss = summary.losses.empty() ? 0.0 : summary.losses.back();
  summary.median_step_time_s = median(step_times_s);
  summary.samples_per_s = summary.median_step_time_s > 0.0
                              ? static_cast<double>(global_batch) / summary.median_step_time_s
                              : 0.0;
  summary.peak_memory_bytes = device_memory.peak_bytes();
  return summary;
}

// ---------------------------------------------------------------------------------------------
// The optimizer arithmetic shared with the profiler (flat_adamw.hpp): the one-rank loop's
// clipping and AdamW, then the multi-rank loop's flat-buffer norm and AdamW

torch::Tensor clip_gradients(const std::vector<torch::Tensor>& parameters, double max_norm) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads;
  for (const torch::Tensor& p : parameters) {
    if (p.grad().defined()) grads.push_back(p.grad().detach());
  }
  if (grads.empty()) return torch::zeros({}, torch::kFloat);
  const std::vector<torch::Tensor> norms = at::_foreach_norm(grads, 2);
  const torch::Tensor total = torch::stack(norms).norm(2).to(torch::kFloat);
  if (max_norm > 0.0) {
    compat::foreach_mul_(grads, (max_norm / (total + 1e-6)).clamp_max(1.0));
  }
  return total;
}

void adamw_step(torch::optim::AdamW& optimizer) {
  torch::NoGradGuard no_grad;
  struct Lists {
    std::vector<torch::Tensor> parameters, grads, exp_avgs, exp_avg_sqs;
    std::int64_t numel = 0;
  };
  std::int64_t largest = 1;
  for (const auto& group : optimizer.param_groups()) {
    for (const torch::Tensor& p : group.params()) largest = std::max(largest, p.numel());
  }
  for (auto& group : optimizer.param_groups()) {
    const auto& options = static_cast<const torch::optim::AdamWOptions&>(group.options());
    TORCH_CHECK(!options.amsgrad(), "adamw_step: amsgrad is not supported");
    // Chunks of parameters at the same step count (all of them, unless some missed a step).
    std::vector<std::pair<std::int64_t, Lists>> chunks;
    for (const torch::Tensor& p : group.params()) {
      if (!p.grad().defined()) continue;
      auto& slot = optimizer.state()[compat::optimizer_state_key(optimizer, p)];
      if (!slot) {
        auto state = std::make_unique<torch::optim::AdamWParamState>();
        state->step(0);
        state->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        state->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        slot = std::move(state);
      }
      auto& state = static_cast<torch::optim::AdamWParamState&>(*slot);
      state.step(state.step() + 1);
      auto chunk = std::find_if(chunks.begin(), chunks.end(), [&](const auto& c) {
        return c.first == state.step() && c.second.numel + p.numel() <= 2 * largest;
      });
      if (chunk == chunks.end()) chunk = chunks.insert(chunks.end(), {state.step(), Lists{}});
      Lists& l = chunk->second;
      l.parameters.push_back(p);
      l.grads.push_back(p.grad());
      l.exp_avgs.push_back(state.exp_avg());
      l.exp_avg_sqs.push_back(state.exp_avg_sq());
      l.numel += p.numel();
    }
    const double lr = options.lr();
    const auto [beta1, beta2] = options.betas();
    for (auto& [step, l] : chunks) {
      if (options.weight_decay() != 0) {
        at::_foreach_mul_(l.parameters, 1 - lr * options.weight_decay());
      }
      const double bias_correction1 = 1 - std::pow(beta1, static_cast<double>(step));
      const double bias_correction2 = 1 - std::pow(beta2, static_cast<double>(step));
      at::_foreach_mul_(l.exp_avgs, beta1);
      at::_foreach_add_(l.exp_avgs, l.grads, 1 - beta1);
      at::_foreach_mul_(l.exp_avg_sqs, beta2);
      at::_foreach_addcmul_(l.exp_avg_sqs, l.grads, l.grads, 1 - beta2);
      std::vector<torch::Tensor> denom = at::_foreach_sqrt(l.exp_avg_sqs);
      at::_foreach_div_(denom, std::sqrt(bias_correction2));
      at::_foreach_add_(denom, options.eps());
      at::_foreach_addcdiv_(l.parameters, l.exp_avgs, denom, -lr / bias_correction1);
    }
  }
}

torch::Tensor squared_norm(const torch::Tensor& flat, const FlatRanges& ranges) {
  torch::Tensor sum = torch::zeros({1}, flat.options());
  for (const auto& [start, length] : ranges) {
    const torch::Tensor norm = flat.narrow(0, start, length).norm();
    sum += norm * norm;
  }
  return sum;
}

void flat_adamw_update(torch::Tensor& parameters, const torch::Tensor& grad, torch::Tensor& exp_avg,
                       torch::Tensor& exp_avg_sq, std::int64_t step, double lr, double weight_decay,
                       const FlatRanges& decay_ranges) {
  torch::NoGradGuard no_grad;
  constexpr double kBeta1 = 0.9;
  constexpr double kBeta2 = 0.999;
  constexpr double kEps = 1e-8;
  const auto factor = static_cast<float>(1.0 - lr * weight_decay);
  for (const auto& [start, length] : decay_ranges) {
    parameters.narrow(0, start, length).mul_(factor);
  }
  exp_avg.mul_(kBeta1).add_(grad, 1.0 - kBeta1);
  exp_avg_sq.mul_(kBeta2).addcmul_(grad, grad, 1.0 - kBeta2);
  const double bias_correction1 = 1.0 - std::pow(kBeta1, static_cast<double>(step));
  const double bias_correction2 = 1.0 - std::pow(kBeta2, static_cast<double>(step));
  torch::Tensor denom = exp_avg_sq.sqrt();
  denom.div_(std::sqrt(bias_correction2)).add_(kEps);
  parameters.addcdiv_(exp_avg, denom, -lr / bias_correction1);
}

// ---------------------------------------------------------------------------------------------
// Many ranks

namespace {

// The maximal runs of true elements of a 1-D bool tensor, as (start, length).
FlatRanges true_ranges(const torch::Tensor& mask) {
  const torch::Tensor cpu = mask.to(torch::kCPU).contiguous();
  const bool* data = cpu.data_ptr<bool>();
  FlatRanges out;
  const std::int64_t n = cpu.numel();
  for (std::int64_t i = 0; i < n;) {
    if (!data[i]) {
      ++i;
      continue;
    }
    std::int64_t j = i;
    while (j < n && data[j]) ++j;
    out.emplace_back(i, j - i);
    i = j;
  }
  return out;
}

// One rank's parameters and gradients in flat fp32 buffers, their dp shards, and AdamW on the
// shard this rank updates (the whole buffer without ZeRO).
//
// Gradients: ZeRO 0/1 accumulate every micro-batch into one flat buffer of the rank's parameters
// and reduce it once per step (in buckets from the last backward pass's hooks when overlapping).
// ZeRO 2/3 with dp > 1 keep no full gradient buffer: after every backward pass of a chunk, its
// gradients are reduced bucket by bucket as the hooks report them ready, this rank's part is
// added to its gradient shard and the parameters' gradients are freed (as DeepSpeed's ZeRO-2).
class FlatParameters {
 public:
  // Over the parameters of this rank's model chunks, in order. Hooks gradients for overlapped
  // bucket all-reduces when `overlap` (the caller arms them before the last backward pass).
  FlatParameters(const std::vector<EncoderClassifier*>& chunks, const TrainOptions& o,
                 ParallelGroups& groups, const torch::Device& device, bool overlap)
      : zero_(o.zero), weight_decay_(o.weight_decay), groups_(groups) {
    const int dp = groups.dp_size();
    std::vector<std::string> names;
    std::vector<ParameterInfo> infos;
    for (EncoderClassifier* chunk : chunks) {
      for (const auto& entry : chunk->local_parameters()) names.push_back(entry.first);
      for (const ParameterInfo& info : chunk->parameter_infos()) infos.push_back(info);
    }
    sharded_gradients_ = zero_ >= 2 && dp > 1;
    std::vector<std::size_t> chunk_ends;
    for (EncoderClassifier* chunk : chunks) {
      for (const auto& entry : chunk->local_parameters()) {
        const torch::Tensor& parameter = entry.second;
        parameters_.push_back(parameter);
        offsets_.push_back(numel_);
        numels_.push_back(parameter.numel());
        shapes_.push_back(parameter.sizes().vec());
        numel_ += parameter.numel();
      }
      chunk_ends.push_back(parameters_.size());
    }
    padded_ = (numel_ + dp - 1) / dp * dp;
    shard_numel_ = padded_ / dp;
    shard_offset_ = zero_ > 0 ? groups.coordinates().dp * shard_numel_ : 0;
    const std::int64_t updated = zero_ > 0 ? shard_numel_ : padded_;
    const auto options = torch::TensorOptions().dtype(torch::kFloat).device(device);
    torch::Tensor decay = torch::zeros({padded_}, options.dtype(torch::kBool));
    torch::Tensor counted = torch::zeros({padded_}, options.dtype(torch::kBool));
    flat_ = torch::zeros({padded_}, options);
    const bool first_tp = groups.coordinates().tp == 0;
    {
      torch::NoGradGuard no_grad;
      for (std::size_t i = 0; i < parameters_.size(); ++i) {
        const std::string& name = names[i];
        const ParameterInfo& info = infos[i];
        const std::int64_t n = parameters_[i].numel();
        flat_.narrow(0, offsets_[i], n).copy_(parameters_[i].reshape({n}));
        const bool exempt = (name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0) ||
                            name.find("LayerNorm.") != std::string::npos;
        if (!exempt) decay.narrow(0, offsets_[i], n).fill_(true);
        if (first_tp || info.split != TensorParallelSplit::kReplicated) {
          counted.narrow(0, offsets_[i], n).fill_(true);
        }
      }
    }
    // Ranges of the updated part (not per-element masks, which would cost another copy of it).
    decay_ranges_ = true_ranges(decay.narrow(0, shard_offset_, updated));
    counted_ranges_ = true_ranges(counted.narrow(0, shard_offset_, updated));
    decay = torch::Tensor();
    counted = torch::Tensor();
    const std::int64_t bucket_numel = std::max<std::int64_t>(o.bucket_bytes / 4, 1);
    if (sharded_gradients_) {
      // Before ZeRO-3's release: a hooked gradient accumulator keeps the parameter's shape.
      shard_grad_ = torch::zeros({shard_numel_}, options);
      make_shard_buckets(chunk_ends, bucket_numel);
      std::int64_t largest = 1;
      for (const ShardBucket& b : shard_buckets_) {
        largest = std::max(largest, offsets_[b.last - 1] + numels_[b.last - 1] - offsets_[b.first]);
      }
      staging_ = torch::empty({std::min(largest, bucket_numel)}, options);
    }
    if (zero_ == 3) {
      shard_ = flat_.narrow(0, shard_offset_, shard_numel_).clone();
      release();
    } else {
      bind();
      if (overlap && dp > 1 && zero_ <= 1) make_buckets(bucket_numel);
    }
    // After the parameters moved into the flat buffer (their first copies are freed by then).
    exp_avg_ = torch::zeros({updated}, options);
    exp_avg_sq_ = torch::zeros({updated}, options);
  }

  // The next backward pass is the step's last: its gradient hooks start the bucket all-reduces.
  void arm() {
    if (buckets_.empty()) return;
    armed_ = true;
    for (Bucket& b : buckets_) b.remaining = b.parameters;
    next_bucket_ = 0;
    pending_.clear();
  }

  // ZeRO-3: gathers the full parameters of this stage from the dp shards (a no-op otherwise).
  void materialize() {
    if (zero_ != 3 || flat_.defined()) return;
    flat_ = torch::empty({padded_}, shard_.options());
    groups_.dp().allgather(flat_, shard_);
    bind();
  }

  // ZeRO-3: frees the full parameters and gradients, keeping the shard (a no-op otherwise).
  void release() {
    if (zero_ != 3) return;
    torch::NoGradGuard no_grad;
    for (torch::Tensor& p : parameters_) {
      p.set_data(torch::empty({0}, shard_.options()));
      p.mutable_grad() = torch::Tensor();
    }
    flat_ = torch::Tensor();
    grad_ = torch::Tensor();
  }

  void zero_grad() {
    if (grad_.defined()) grad_.zero_();
    if (shard_grad_.defined()) shard_grad_.zero_();
  }

  // After every backward pass of chunk k (ZeRO 2/3 with dp > 1; a no-op otherwise): reduces the
  // chunk's buckets that its hooks have not reduced yet (parameters without a gradient count as
  // zeros) and readies them for the next pass.
  void finish_backward(int k) {
    if (!sharded_gradients_) return;
    ShardChunk& chunk = shard_chunks_[static_cast<std::size_t>(k)];
    while (chunk.next < chunk.end) reduce_shard_bucket(chunk.next++);
    for (std::size_t b = chunk.begin; b < chunk.end; ++b) {
      shard_buckets_[b].remaining = shard_buckets_[b].last - shard_buckets_[b].first;
    }
    chunk.next = chunk.begin;
  }

  // What a checkpoint keeps of this rank (between steps): the parameters it holds (the flat
  // buffer, or its shard with ZeRO-3), both AdamW moments and the step count.
  std::vector<torch::Tensor> state() const {
    return {(zero_ == 3 ? shard_ : flat_).to(torch::kCPU), exp_avg_.to(torch::kCPU),
            exp_avg_sq_.to(torch::kCPU), torch::tensor({step_}, torch::kLong)};
  }
  void load_state(const std::vector<torch::Tensor>& state, const std::string& source) {
    torch::Tensor& held = zero_ == 3 ? shard_ : flat_;
    if (state.size() != 4 || state[0].sizes() != held.sizes() ||
        state[1].sizes() != exp_avg_.sizes() || state[2].sizes() != exp_avg_sq_.sizes()) {
      throw InputError(source, "", "the parameters and AdamW state of this rank of this plan");
    }
    torch::NoGradGuard no_grad;
    held.copy_(state[0]);
    exp_avg_.copy_(state[1]);
    exp_avg_sq_.copy_(state[2]);
    step_ = state[3].item<std::int64_t>();
  }

  // Sums the gradients over the dp group and divides by dp (into the shard with ZeRO-2/3).
  // Returns the gradient this rank updates with.
  torch::Tensor reduce_gradients() {
    const int dp = groups_.dp_size();
    if (sharded_gradients_) {  // reduced by finish_backward
      shard_grad_.div_(dp);
      return shard_grad_;
    }
    if (zero_ >= 2) {
      torch::Tensor shard = torch::empty({shard_numel_}, grad_.options());
      groups_.dp().reduce_scatter_sum(shard, grad_);
      if (dp > 1) shard.div_(dp);
      return shard;
    }
    if (armed_) {  // buckets started during the backward pass: start the rest, wait for all
      armed_ = false;
      while (next_bucket_ < buckets_.size()) launch(next_bucket_++);
      for (PendingOperation& p : pending_) p.wait();
      pending_.clear();
    } else {
      groups_.dp().allreduce_sum(grad_);
    }
    if (dp > 1) grad_.div_(dp);
    return zero_ == 1 ? grad_.narrow(0, shard_offset_, shard_numel_) : grad_;
  }

  // The L2 norm of the whole model's gradient (every stage, tp shard and dp shard once), as a
  // one-element tensor on the gradient's device.
  torch::Tensor global_norm(const torch::Tensor& grad) {
    torch::Tensor sum = squared_norm(grad, counted_ranges_);
    if (zero_ > 0) groups_.dp().allreduce_sum(sum);
    groups_.tp().allreduce_sum(sum);
    groups_.pp().allreduce_sum(sum);
    return sum.sqrt();
  }

  // torch::optim::AdamW's arithmetic (betas 0.9 / 0.999, eps 1e-8) on this rank's part, then
  // the updated shards all-gathered (ZeRO-1/2; ZeRO-3 keeps the shard).
  void step(const torch::Tensor& grad, double lr) {
    torch::Tensor p = zero_ == 3  ? shard_
                      : zero_ > 0 ? flat_.narrow(0, shard_offset_, shard_numel_)
                                  : flat_;
    // One temporary of the updated part's size (the cost model's optimizer working set).
    flat_adamw_update(p, grad, exp_avg_, exp_avg_sq_, ++step_, lr, weight_decay_, decay_ranges_);
    // In place: this rank's updated part is its chunk of the gathered buffer.
    if (zero_ == 1 || zero_ == 2) groups_.dp().allgather(flat_, p);
  }

 private:
  // Points every parameter (and its gradient, unless gradients are sharded) at its slice of the
  // flat buffers.
  void bind() {
    torch::NoGradGuard no_grad;
    if (!sharded_gradients_) grad_ = torch::zeros({padded_}, flat_.options());
    for (std::size_t i = 0; i < parameters_.size(); ++i) {
      const std::int64_t n = numels_[i];
      parameters_[i].set_data(flat_.narrow(0, offsets_[i], n).view(shapes_[i]));
      if (!sharded_gradients_) {
        parameters_[i].mutable_grad() = grad_.narrow(0, offsets_[i], n).view(shapes_[i]);
      }
    }
  }

  // Sharded gradients: buckets of consecutive parameters of one chunk (from its last, the order
  // in which its backward pass finishes them), reduced in index order within the chunk so that
  // every dp rank issues the same all-reduces in the same order.
  struct ShardBucket {
    std::size_t first = 0;  // parameters [first, last)
    std::size_t last = 0;
    std::size_t remaining = 0;
  };
  struct ShardChunk {
    std::size_t begin = 0;  // buckets [begin, end)
    std::size_t end = 0;
    std::size_t next = 0;
  };

  void make_shard_buckets(const std::vector<std::size_t>& chunk_ends, std::int64_t bucket_numel) {
    std::vector<std::size_t> bucket_of(parameters_.size());
    std::size_t chunk_begin = 0;
    for (std::size_t chunk_end : chunk_ends) {
      ShardChunk chunk;
      chunk.begin = shard_buckets_.size();
      std::int64_t filled = bucket_numel;
      for (std::size_t k = chunk_end; k-- > chunk_begin;) {
        if (filled >= bucket_numel) {
          shard_buckets_.push_back({k, k + 1, 0});
          filled = 0;
        }
        shard_buckets_.back().first = k;
        filled += numels_[k];
        bucket_of[k] = shard_buckets_.size() - 1;
      }
      chunk.end = shard_buckets_.size();
      chunk.next = chunk.begin;
      shard_chunks_.push_back(chunk);
      chunk_begin = chunk_end;
    }
    for (ShardBucket& b : shard_buckets_) b.remaining = b.last - b.first;
    for (std::size_t k = 0; k < parameters_.size(); ++k) {
      const std::size_t index = bucket_of[k];
      std::size_t chunk_index = 0;
      while (shard_chunks_[chunk_index].end <= index) ++chunk_index;
      accumulators_.push_back(
          compat::add_gradient_ready_hook(parameters_[k], [this, index, chunk_index]() {
            --shard_buckets_[index].remaining;
            ShardChunk& chunk = shard_chunks_[chunk_index];
            while (chunk.next < chunk.end && shard_buckets_[chunk.next].remaining == 0) {
              reduce_shard_bucket(chunk.next++);
            }
          }));
    }
  }

  // Sums one bucket's gradients over dp, adds this rank's part to its gradient shard and frees
  // the parameters' gradients. Every reduction goes through the one persistent staging buffer,
  // in pieces of its size, so the transient memory is at most one bucket.
  void reduce_shard_bucket(std::size_t index) {
    const ShardBucket& b = shard_buckets_[index];
    const std::int64_t begin = offsets_[b.first];
    const std::int64_t end = offsets_[b.last - 1] + numels_[b.last - 1];
    torch::NoGradGuard no_grad;
    const std::int64_t piece = staging_.numel();
    for (std::int64_t at = begin; at < end; at += piece) {
      const std::int64_t length = std::min(piece, end - at);
      torch::Tensor buffer = staging_.narrow(0, 0, length);
      for (std::size_t i = b.first; i < b.last; ++i) {
        const std::int64_t from = std::max(at, offsets_[i]);
        const std::int64_t to = std::min(at + length, offsets_[i] + numels_[i]);
        if (from >= to) continue;
        torch::Tensor slice = buffer.narrow(0, from - at, to - from);
        const torch::Tensor& g = parameters_[i].grad();
        if (g.defined()) {
          slice.copy_(g.reshape({numels_[i]}).narrow(0, from - offsets_[i], to - from));
        } else {
          slice.zero_();
        }
      }
      groups_.dp().allreduce_sum(buffer);
      const std::int64_t from = std::max(at, shard_offset_);
      const std::int64_t to = std::min(at + length, shard_offset_ + shard_numel_);
      if (from < to) {
        shard_grad_.narrow(0, from - shard_offset_, to - from)
            .add_(buffer.narrow(0, from - at, to - from));
      }
    }
    for (std::size_t i = b.first; i < b.last; ++i) parameters_[i].mutable_grad() = torch::Tensor();
  }

  // Buckets: consecutive parameters from the last backwards (the order in which the backward
  // pass finishes them), each a contiguous range of the gradient buffer. They are started in
  // index order only, so every dp rank issues the same all-reduces in the same order.
  struct Bucket {
    std::int64_t begin = 0;
    std::int64_t end = 0;
    int parameters = 0;
    int remaining = 0;
  };

  void make_buckets(std::int64_t bucket_numel) {
    std::vector<int> bucket_of(parameters_.size());
    for (std::size_t k = parameters_.size(); k-- > 0;) {
      if (buckets_.empty() || buckets_.back().end - buckets_.back().begin >= bucket_numel) {
        buckets_.push_back({offsets_[k], offsets_[k] + numels_[k], 0, 0});
      }
      Bucket& b = buckets_.back();
      b.begin = offsets_[k];
      ++b.parameters;
      bucket_of[k] = static_cast<int>(buckets_.size()) - 1;
    }
    for (std::size_t k = 0; k < parameters_.size(); ++k) {
      const int index = bucket_of[k];
      accumulators_.push_back(compat::add_gradient_ready_hook(parameters_[k], [this, index]() {
        if (!armed_) return;
        --buckets_[static_cast<std::size_t>(index)].remaining;
        while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].remaining == 0) {
          launch(next_bucket_++);
        }
      }));
    }
  }

  void launch(std::size_t index) {
    const Bucket& b = buckets_[index];
    torch::Tensor range = grad_.narrow(0, b.begin, b.end - b.begin);
    pending_.push_back(groups_.dp().allreduce_sum_async(range));
  }

  int zero_;
  double weight_decay_;
  ParallelGroups& groups_;
  std::vector<torch::Tensor> parameters_;
  std::vector<std::int64_t> offsets_;
  std::vector<std::int64_t> numels_;
  std::vector<std::vector<std::int64_t>> shapes_;
  std::int64_t numel_ = 0;
  std::int64_t padded_ = 0;
  std::int64_t shard_numel_ = 0;
  std::int64_t shard_offset_ = 0;
  torch::Tensor flat_;   // all parameters (undefined between ZeRO-3 steps)
  torch::Tensor grad_;   // all gradients (undefined between ZeRO-3 steps)
  torch::Tensor shard_;  // ZeRO-3: this rank's parameters
  bool sharded_gradients_ = false;
  torch::Tensor shard_grad_;  // sharded gradients: this rank's summed gradient shard
  torch::Tensor staging_;     // sharded gradients: the reduction buffer (at most a bucket)
  std::vector<ShardBucket> shard_buckets_;
  std::vector<ShardChunk> shard_chunks_;
  // (start, length) ranges of the updated part where weight decay applies, and where the global
  // norm counts the elements (tp-replicated parameters count on tp rank 0 only).
  FlatRanges decay_ranges_;
  FlatRanges counted_ranges_;
  torch::Tensor exp_avg_;
  torch::Tensor exp_avg_sq_;
  std::int64_t step_ = 0;
  std::vector<Bucket> buckets_;
  std::vector<compat::NodePointer> accumulators_;
  std::vector<PendingOperation> pending_;
  std::size_t next_bucket_ = 0;
  bool armed_ = false;
};

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
  const bool interleaved = o.schedule == costmodel::Schedule::kInterleaved;
  if (interleaved != (o.virtual_stages > 1) || o.virtual_stages < 1 ||
      (interleaved && (o.pp < 2 || o.num_micro_batches % o.pp != 0))) {
    throw InputError("plan", "$.strategy",
                     "virtual_stages 1 with gpipe or 1f1b, or virtual_stages >= 2 with the "
                     "interleaved schedule, pp >= 2 and num_micro_batches a multiple of pp");
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

}  // namespace

TrainSummary train_classifier(const TrainOptions& o, const std::vector<EncodedExample>& train_data,
                              const std::vector<EncodedExample>& validation_data,
                              ParallelGroups& groups) {
  check_options(o);
  compat::CpuMemoryScope memory;  // counts this thread's CPU tensors from here on
  check_parallel_options(o, groups);
  const ModelSpec& spec = o.model;
  parameter_table(spec);
  std::size_t seq_len = 0;
  check_data(train_data, "training data", spec, seq_len);
  check_data(validation_data, "validation data", spec, seq_len);

  const RankCoordinates c = groups.coordinates();
  const int dp = o.dp;
  const int pp = o.pp;
  const std::int64_t mb = o.micro_batch;
  const std::int64_t micro_batches = o.num_micro_batches;
  const RunShape run = run_shape(o, train_data.size());
  const auto train_count = static_cast<std::int64_t>(train_data.size());
  const std::int64_t global_batch = run.global_batch;
  const std::int64_t steps_per_epoch = run.steps_per_epoch;
  const std::int64_t total_steps = run.total_steps;
  const int device_index = o.device_index;
  const torch::Device device = run.device;
  const MixedPrecision mp = mixed_precision(o.device, o.precision);

  // Model chunks: global chunk g = v * pp ranges of the layer sequence; chunk g runs on pipeline
  // rank g % pp, so this rank holds g = k * pp + c.pp for k = 0 .. v - 1.
  const int v = o.virtual_stages;
  const int chunk_count = pp * v;
  const std::vector<costmodel::StageRange> stages =
      o.stages.empty() ? costmodel::even_partition(spec, chunk_count) : o.stages;
  torch::manual_seed(o.seed);
  ParallelContext context;
  context.tp = std::make_shared<GroupTensorParallelComm>(groups.tp_group());
  std::vector<std::unique_ptr<EncoderClassifier>> chunks;
  std::vector<EncoderClassifier*> chunk_pointers;
  for (int k = 0; k < v; ++k) {
    EncoderOptions model_options;
    model_options.dropout = o.dropout;
    model_options.seed = o.seed;
    model_options.device = device;
    model_options.recompute = o.recompute;
    const auto& range = stages[static_cast<std::size_t>(k * pp + c.pp)];
    model_options.first_layer = range.first_layer;
    model_options.last_layer = range.last_layer;
    chunks.push_back(std::make_unique<EncoderClassifier>(spec, model_options, context));
    chunks.back()->train();
    if (!o.init_weights.empty()) chunks.back()->load_safetensors(o.init_weights);
    chunk_pointers.push_back(chunks.back().get());
  }
  FlatParameters flat(chunk_pointers, o, groups, device, /*overlap=*/v == 1);
  auto global_chunk = [&](int k) { return k * pp + c.pp; };

  // Checkpoints of many ranks: DIR/step-N/ holds trainer_state.json (the layout and the data
  // position) and rank-R.pt per rank (its parameters or shard, AdamW moments and step, RNG
  // state); they resume with the same plan. All ranks write into one temporary folder, then rank
  // 0 renames it (a run killed mid-write leaves the previous checkpoint whole).
  const int world_rank = groups.world_rank();
  const int world_size = o.dp * o.tp * o.pp;
  nlohmann::json layout = {{"dp", o.dp},          {"tp", o.tp},
                           {"pp", o.pp},          {"zero", o.zero},
                           {"virtual_stages", v}, {"stages", nlohmann::json::array()}};
  for (const costmodel::StageRange& r : stages) {
    layout["stages"].push_back({r.first_layer, r.last_layer});
  }
  std::int64_t start_step = 0;
  std::int64_t summary_resumed_from = 0;
  std::optional<std::string> checkpoint =
      o.resume ? latest_checkpoint(o.checkpoint_dir) : std::nullopt;
  if (checkpoint) {
    const fs::path dir(*checkpoint);
    const std::string source = (dir / kStateFile).string();
    const nlohmann::json state = read_json_file(dir / kStateFile);
    check_checkpoint_state(state, source, spec, o.seed, global_batch, train_count, &layout);
    start_step = state.value("step", std::int64_t{0});
    const fs::path mine = dir / ("rank-" + std::to_string(world_rank) + ".pt");
    std::vector<torch::Tensor> saved;
    try {
      torch::load(saved, mine.string());
    } catch (const c10::Error& e) {
      throw InputError(
          mine.string(), "",
          std::string("a rank state written by loom train (") + e.what_without_backtrace() + ")");
    }
    if (saved.size() < 5) throw InputError(mine.string(), "", "parameters, moments, step, RNG");
    flat.load_state({saved.begin(), saved.begin() + 4}, mine.string());
    restore_rng({saved.begin() + 4, saved.end()}, o.device, device_index, mine.string());
    summary_resumed_from = start_step;
  }
  auto write_checkpoint_of_ranks = [&](std::int64_t step_done, std::int64_t epoch) {
    const fs::path dir(o.checkpoint_dir);
    const std::string name = step_folder(step_done);
    const fs::path tmp = dir / (".tmp-" + name);
    if (world_rank == 0) {
      fs::create_directories(dir);
      fs::remove_all(tmp);
      fs::create_directory(tmp);
    }
    groups.world().barrier();
    std::string error;
    try {
      std::vector<torch::Tensor> saved = flat.state();
      for (torch::Tensor& t : capture_rng(o.device, device_index)) saved.push_back(t);
      torch::save(saved, (tmp / ("rank-" + std::to_string(world_rank) + ".pt")).string());
      if (o.fault_kill_in_checkpoint == step_done) ::raise(SIGKILL);  // fault injection
      if (world_rank == 0) {
        nlohmann::ordered_json state;
        state["format"] = kCheckpointFormat;
        state["step"] = step_done;
        state["epoch"] = epoch;
        state["seed"] = o.seed;
        state["global_batch"] = global_batch;
        state["total_steps"] = total_steps;
        state["train_examples"] = train_count;
        state["world_size"] = world_size;
        state["layout"] = layout;
        state["model"] = profiles::model_to_json(spec);
        profiles::write_file_atomically((tmp / kStateFile).string(), state.dump(2) + "\n");
      }
    } catch (const c10::Error& e) {
      error = e.what_without_backtrace();
    } catch (const std::exception& e) {
      error = e.what();
    }
    // Every rank learns whether every write succeeded before rank 0 renames.
    torch::Tensor failed = torch::tensor({error.empty() ? 0.0 : 1.0}, torch::kDouble);
    groups.world().allreduce_sum(failed);
    if (failed.item<double>() != 0) {
      if (world_rank == 0) {
        std::error_code ignored;
        fs::remove_all(tmp, ignored);
      }
      throw std::runtime_error("cannot write checkpoint " + (dir / name).string() + ": " +
                               (error.empty() ? "another rank failed to write its part" : error));
    }
    if (world_rank == 0) {
      const fs::path target = dir / name;
      fs::remove_all(target);
      fs::rename(tmp, target);
      for (const auto& entry : fs::directory_iterator(dir)) {
        const std::int64_t other = folder_step(entry.path().filename().string());
        if (other >= 0 && other < step_done) fs::remove_all(entry.path());
      }
    }
    groups.world().barrier();
  };
  const int previous_rank = (c.pp + pp - 1) % pp;
  const int next_rank = (c.pp + 1) % pp;
  const auto activation_options = torch::TensorOptions().dtype(torch::kFloat).device(device);
  const auto hidden_shape = [&](std::int64_t rows) {
    return std::vector<std::int64_t>{rows, static_cast<std::int64_t>(seq_len), spec.hidden};
  };

  TrainSummary summary;
  summary.total_steps = total_steps;
  summary.precision = mp.name;
  if (checkpoint) summary.resumed_from_step = summary_resumed_from;
  summary.steps = start_step;
  MetricsWriter metrics(
      groups.world_rank() == 0 || o.metrics_every_rank ? o.metrics_path : std::string(),
      checkpoint.has_value());
  ProgressBar progress(o.progress && groups.world_rank() == 0, total_steps);
  // Peak bytes of this rank's tensors (what the cost model predicts: parameters, gradients,
  // optimizer states, activations and buffers; not the process's code and libraries), the
  // training steps' alone: the model is built, sharded and loaded before this point (a
  // tensor-parallel rank's full-size initial weights are a transient of construction).
  compat::DeviceMemory device_memory(o.device == Device::kCuda, device_index, memory.counter(),
                                     o.ranks_in_process > 1);
  device_memory.reset_peak();
  const std::int64_t eval_batch = o.eval_batch > 0 ? o.eval_batch : o.micro_batch;
  std::vector<double> step_times_s;
  std::int64_t cached_epoch = -1;
  std::vector<std::int64_t> order;
  std::int64_t last_eval_step = -1;
  int agreed_signal = 0;  // the stop signal every rank agreed on (0: none)

  // Forward through the pipeline without gradients. The dp replicas share the batches (replica d
  // takes batches d, d + dp, ...), the last stage scores on the device, and one all-reduce gives
  // every rank the result. Returns false, with nothing written, when a stop signal (agreed by
  // every rank every kStopCheckRounds rounds) abandoned it.
  auto run_evaluation = [&](std::int64_t step) -> bool {
    if (validation_data.empty()) return true;
    flat.materialize();
    torch::NoGradGuard no_grad;
    for (auto& chunk : chunks) chunk->eval();
    std::vector<std::int64_t> all(validation_data.size());
    std::iota(all.begin(), all.end(), 0);
    const auto count = static_cast<std::int64_t>(validation_data.size());
    // [loss sum, correct] on the device; on the last stage only, else zero.
    torch::Tensor sums =
        torch::zeros({2}, torch::TensorOptions().dtype(torch::kDouble).device(device));
    const std::int64_t batches = (count + eval_batch - 1) / eval_batch;
    const std::int64_t rounds = (batches + dp - 1) / dp;
    bool stopped = false;
    for (std::int64_t r = 0; r < rounds && !stopped; ++r) {
      const std::int64_t b = r * dp + c.dp;
      if (b < batches) {
        const std::int64_t begin = b * eval_batch;
        const std::int64_t n = std::min(eval_batch, count - begin);
        const Batch batch = make_batch(validation_data, all, begin, n, device);
        torch::Tensor out;
        std::vector<PendingOperation> sends;
        for (int k = 0; k < v; ++k) {
          const int g = global_chunk(k);
          torch::Tensor hidden;
          if (g > 0) {  // the tag names the boundary g - 1 -> g and the batch
            hidden = torch::empty(hidden_shape(n), activation_options);
            groups.pp_from(previous_rank)
                .recv(hidden, previous_rank, static_cast<int>((g - 1) * batches + b));
          }
          {
            compat::AutocastGuard autocast(device.type(), mp.dtype, mp.autocast);
            out = chunks[static_cast<std::size_t>(k)]
                      ->forward(batch.inputs, hidden)
                      .to(torch::kFloat);
          }
          if (g < chunk_count - 1) {
            sends.push_back(
                groups.pp_to(next_rank).send(out, next_rank, static_cast<int>(g * batches + b)));
          }
        }
        if (global_chunk(v - 1) == chunk_count - 1) {
          sums[0] += torch::nn::functional::cross_entropy(
              out, batch.labels,
              torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
          sums[1] += out.argmax(1).eq(batch.labels).sum();
        }
        // The next stage receives this round's sends within the round: waiting here bounds
        // what is held to one batch's activations and cannot wait on a cycle.
        for (PendingOperation& send : sends) send.wait();
      }
      if (o.stop_signal != nullptr && (r + 1) % kStopCheckRounds == 0 && r + 1 < rounds) {
        torch::Tensor votes =
            torch::zeros({kStopSignalSlots}, torch::TensorOptions().dtype(torch::kDouble));
        add_stop_vote(votes, o.stop_signal);
        groups.world().allreduce_sum(votes);
        agreed_signal = agreed_stop_signal(votes);
        stopped = agreed_signal != 0;
      }
    }
    for (auto& chunk : chunks) chunk->train();
    if (stopped) return false;
    // Every tp rank of the last stage holds the same sums: the world's total counts each tp times.
    groups.world().allreduce_sum(sums);
    const torch::Tensor host = sums.to(torch::kCPU) / static_cast<double>(groups.tp_size());
    summary.validation_loss = host[0].item<double>() / static_cast<double>(count);
    summary.validation_accuracy = host[1].item<double>() / static_cast<double>(count);
    last_eval_step = step;
    nlohmann::ordered_json line;
    line["eval"] = true;
    line["step"] = step;
    line["accuracy"] = *summary.validation_accuracy;
    line["loss"] = *summary.validation_loss;
    metrics.write(line);
    return true;
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
    flat.materialize();
    flat.zero_grad();

    // One micro-batch of one chunk in flight: its chunk input (a leaf that collects the gradient
    // to send back) and its output (the loss on the last chunk). Tags name the boundary between
    // global chunks b and b + 1, the micro-batch and the direction.
    struct InFlight {
      torch::Tensor input;
      torch::Tensor output;
    };
    std::vector<InFlight> in_flight(static_cast<std::size_t>(v * micro_batches));
    std::vector<PendingOperation> sends;
    // Before each send: the sends already received are waited for (at once) and dropped, so a
    // stage holds the buffers of the few still in flight, not every micro-batch's until the end.
    auto send = [&](ProcessGroup& group, const torch::Tensor& tensor, int peer, int tag) {
      sends.erase(std::remove_if(sends.begin(), sends.end(),
                                 [](PendingOperation& s) {
                                   if (!s.completed()) return false;
                                   s.wait();
                                   return true;
                                 }),
                  sends.end());
      sends.push_back(group.send(tensor, peer, tag));
    };
    // The last chunk's losses, summed on the device: read once the step's work is queued.
    torch::Tensor local_loss = torch::zeros({}, torch::TensorOptions().device(device));
    StepPhases phases;
    auto tag = [&](int boundary, std::int64_t m, int direction) {
      return static_cast<int>(2 * (boundary * micro_batches + m) + direction);
    };
    auto forward = [&](int k, std::int64_t m) {
      const int g = global_chunk(k);
      const Batch batch =
          make_batch(train_data, order, offset + (c.dp * micro_batches + m) * mb, mb, device);
      InFlight& f = in_flight[static_cast<std::size_t>(k * micro_batches + m)];
      auto at = StepPhases::Clock::now();
      if (g > 0) {
        f.input = torch::empty(hidden_shape(mb), activation_options);
        groups.pp_from(previous_rank).recv(f.input, previous_rank, tag(g - 1, m, 0));
        f.input.requires_grad_(true);
        at = StepPhases::add(phases.pipeline_wait_s, at);
      }
      torch::Tensor out;
      {
        compat::AutocastGuard autocast(device.type(), mp.dtype, mp.autocast);
        out = chunks[static_cast<std::size_t>(k)]->forward(batch.inputs, f.input);
      }
      if (g == chunk_count - 1) {
        f.output = torch::nn::functional::cross_entropy(out.to(torch::kFloat), batch.labels) /
                   static_cast<double>(micro_batches);
        local_loss += f.output.detach();
        StepPhases::add(phases.forward_s, at);
      } else {
        f.output = out.to(torch::kFloat);
        StepPhases::add(phases.forward_s, at);
        send(groups.pp_to(next_rank), f.output.detach(), next_rank, tag(g, m, 0));
      }
    };
    auto backward = [&](int k, std::int64_t m) {
      const int g = global_chunk(k);
      InFlight& f = in_flight[static_cast<std::size_t>(k * micro_batches + m)];
      // The step's last backward pass (chunk 0, last micro-batch in every schedule) starts the
      // bucketed gradient all-reduces from its hooks (v = 1 only).
      if (k == 0 && m == micro_batches - 1) flat.arm();
      auto at = StepPhases::Clock::now();
      if (g == chunk_count - 1) {
        f.output.backward();
      } else {
        torch::Tensor grad = torch::empty(hidden_shape(mb), activation_options);
        groups.pp_from(next_rank).recv(grad, next_rank, tag(g, m, 1));
        at = StepPhases::add(phases.pipeline_wait_s, at);
        torch::autograd::backward({f.output}, {grad});
      }
      if (g > 0) {
        send(groups.pp_to(previous_rank), f.input.grad(), previous_rank, tag(g - 1, m, 1));
      }
      flat.finish_backward(k);
      StepPhases::add(phases.backward_s, at);
      f = InFlight{};
      if (o.fault_kill_in_step == step + 1) ::raise(SIGKILL);  // fault injection
    };
    if (o.schedule == costmodel::Schedule::kGpipe) {
      for (std::int64_t m = 0; m < micro_batches; ++m) forward(0, m);
      for (std::int64_t m = 0; m < micro_batches; ++m) backward(0, m);
    } else if (o.schedule == costmodel::Schedule::k1F1B) {
      const std::int64_t warmup = std::min<std::int64_t>(pp - c.pp - 1, micro_batches);
      for (std::int64_t m = 0; m < warmup; ++m) forward(0, m);
      for (std::int64_t m = warmup; m < micro_batches; ++m) {
        forward(0, m);
        backward(0, m - warmup);
      }
      for (std::int64_t m = micro_batches - warmup; m < micro_batches; ++m) backward(0, m);
    } else {
      // Megatron-LM's interleaved 1F1B: virtual micro-step i runs micro-batch
      // (i / (pp v)) pp + i % pp on chunk (i % (pp v)) / pp (backward: v - 1 - that).
      const std::int64_t total = micro_batches * v;
      auto chunk_of = [&](std::int64_t i, bool forward_pass) {
        const auto k = static_cast<int>((i % (pp * v)) / pp);
        return forward_pass ? k : v - 1 - k;
      };
      auto micro_batch_of = [&](std::int64_t i) { return (i / (pp * v)) * pp + i % pp; };
      const std::int64_t warmup =
          micro_batches == pp ? total
                              : std::min<std::int64_t>((pp - c.pp - 1) * 2 + (v - 1) * pp, total);
      for (std::int64_t i = 0; i < warmup; ++i) forward(chunk_of(i, true), micro_batch_of(i));
      for (std::int64_t i = 0; i < total - warmup; ++i) {
        forward(chunk_of(i + warmup, true), micro_batch_of(i + warmup));
        backward(chunk_of(i, false), micro_batch_of(i));
      }
      for (std::int64_t i = total - warmup; i < total; ++i) {
        backward(chunk_of(i, false), micro_batch_of(i));
      }
    }
    auto at = StepPhases::Clock::now();
    for (PendingOperation& s : sends) s.wait();
    at = StepPhases::add(phases.pipeline_wait_s, at);

    const torch::Tensor grad = flat.reduce_gradients();
    // Clipped as torch.nn.utils.clip_grad_norm_, on the device (no host synchronisation).
    const torch::Tensor grad_norm = flat.global_norm(grad);
    if (o.max_grad_norm > 0.0) grad.mul_((o.max_grad_norm / (grad_norm + 1e-6)).clamp_max(1.0));
    at = StepPhases::add(phases.gradients_s, at);
    const double lr = learning_rate(o, step, total_steps);
    flat.step(grad, lr);
    flat.release();
    StepPhases::add(phases.optimizer_s, at);

    // One all-reduce over the world per step: the step's loss (the last stage's, held once by each
    // of its tp ranks; averaged over dp) and the stop flag (a stop signal on any rank stops every
    // rank after this step).
    torch::Tensor stats = torch::zeros({1 + kStopSignalSlots},
                                       torch::TensorOptions().dtype(torch::kDouble).device(device));
    stats[0] += local_loss;
    add_stop_vote(stats.narrow(0, 1, kStopSignalSlots), o.stop_signal);
    groups.world().allreduce_sum(stats);
    const torch::Tensor host_stats = stats.to(torch::kCPU);
    const double step_loss =
        host_stats[0].item<double>() / static_cast<double>(dp * groups.tp_size());
    agreed_signal = agreed_stop_signal(host_stats.narrow(0, 1, kStopSignalSlots));
    bool stopping = agreed_signal != 0;
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
      line["peak_memory_bytes"] = device_memory.peak_bytes();
      line["rank"] = groups.world_rank();
      line["time"] = utc_now_iso8601();
      line["peak_rss_bytes"] = peak_rss_bytes();       // an extension: code and libraries included
      line["phases_s"] = phases.to_json(step_time_s);  // an extension
      metrics.write(line);
    }
    progress.update(step + 1, step_loss);
    // Not started once every rank agreed to stop (a signal reached one of them).
    if (!stopping && o.eval_every > 0 && (step + 1) % o.eval_every == 0) {
      // Abandoned on a stop signal that every rank agreed on: stop after this step.
      if (!run_evaluation(step + 1)) stopping = true;
      flat.release();
    }
    const bool last = step + 1 == end_step || stopping;
    if (!o.checkpoint_dir.empty() &&
        ((o.checkpoint_every > 0 && (step + 1) % o.checkpoint_every == 0) || last)) {
      write_checkpoint_of_ranks(step + 1, (step + 1) / steps_per_epoch);
    }
    if (stopping) {
      summary.stopped_by_signal = agreed_signal;
      break;
    }
  }
  progress.finish();
  const bool finished = summary.steps == total_steps && summary.stopped_by_signal == 0;
  if (finished && last_eval_step != summary.steps) {
    // Abandoned on an agreed stop signal: the run reports the signal.
    if (!run_evaluation(summary.steps)) summary.stopped_by_signal = agreed_signal;
    flat.release();
  }
  groups.world().barrier();

  summary.final_loss = summary.losses.empty() ? 0.0 : summary.losses.back();
  summary.median_step_time_s = median(step_times_s);
  summary.samples_per_s = summary.median_step_time_s > 0.0
                              ? static_cast<double>(global_batch) / summary.median_step_time_s
                              : 0.0;
  summary.peak_memory_bytes = device_memory.peak_bytes();
  return summary;
}

}  // namespace loom::executor
