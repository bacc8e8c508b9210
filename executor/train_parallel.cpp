// The many-rank engine of the training loop (train_loop.hpp): this rank's pipeline chunks of a
// dp x tp x pp plan, the pipeline schedule's forward and backward passes with their activation
// sends and receives, and the dp reduction and optimizer step of FlatParameters.
#include <algorithm>
#include <csignal>
#include <exception>
#include <filesystem>
#include <memory>
#include <numeric>

#include "costmodel/estimate.hpp"
#include "costmodel/schedule.hpp"
#include "executor/checkpoint.hpp"
#include "executor/device.hpp"
#include "executor/device_batch.hpp"
#include "executor/distributed.hpp"
#include "executor/flat_adamw.hpp"
#include "executor/flat_parameters.hpp"
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

// World rank 0 checks what it will write at the end (labels, tokenizer files, --output); every
// rank learns the verdict, so a refusal ends every rank now instead of leaving the others
// waiting in the first step's collectives.
HfFolder checked_hf_folder(const TrainOptions& o, ParallelGroups& groups) {
  HfFolder folder;
  std::exception_ptr refused;
  try {
    folder = hf_folder_of(o, groups.world_rank() == 0);
  } catch (const InputError&) {
    refused = std::current_exception();
  }
  torch::Tensor votes = torch::tensor({refused ? 1.0 : 0.0}, torch::kDouble);
  groups.world().allreduce_sum(votes);
  if (refused) std::rethrow_exception(refused);
  if (votes.item<double>() != 0) {
    throw InputError("--output", "", "labels, tokenizer files and a folder rank 0 can write");
  }
  return folder;
}

// One micro-batch of one chunk in flight: its chunk input (a leaf that collects the gradient to
// send back) and its output (the loss on the last chunk).
struct InFlight {
  torch::Tensor input;
  torch::Tensor output;
};

// What one step's forward and backward passes share.
struct StepState {
  std::int64_t step = 0;
  const std::vector<std::int64_t>* order = nullptr;
  std::int64_t offset = 0;
  StepPhases* phases = nullptr;
  std::vector<InFlight> in_flight;
  std::vector<PendingOperation> sends;
  torch::Tensor local_loss;  // the last chunk's losses, summed on the device
};

class ParallelRank final : public TrainRank {
 public:
  ParallelRank(const TrainOptions& o, const RunSize& size,
               const std::vector<EncodedExample>& train_data,
               const std::vector<EncodedExample>& validation_data, std::size_t seq_len,
               ParallelGroups& groups, CpuMemoryCounter& cpu_memory);

  std::optional<std::int64_t> resumed_from_step() const override { return resumed_from_; }
  const char* precision() const override { return mp_.name.c_str(); }
  int rank() const override { return groups_.world_rank(); }
  bool lead() const override { return groups_.world_rank() == 0; }
  void begin() override { device_memory_.reset_peak(); }
  double train_step(std::int64_t step, const std::vector<std::int64_t>& order, std::int64_t offset,
                    double lr, StepPhases& phases) override;
  int stop_signal() override { return agreed_signal_; }
  std::optional<Evaluation> evaluate() override;
  void save_checkpoint(std::int64_t step_done) override;
  void write_output(const std::string& dir) override {
    export_rank_model(dir, hf_, chunks_, stages_, *flat_, groups_);
  }
  std::int64_t peak_memory_bytes() const override { return device_memory_.peak_bytes(); }
  std::int64_t device_used_bytes() const override { return device_memory_.device_used_bytes(); }
  void finish() override { groups_.world().barrier(); }

 private:
  int global_chunk(int k) const { return k * o_.pp + c_.pp; }
  // What stages exchange: the hidden states, or under sequence parallelism this rank's shard.
  std::vector<std::int64_t> hidden_shape(std::int64_t rows) const {
    const auto seq = static_cast<std::int64_t>(seq_len_);
    return {rows, o_.sequence_parallel ? seq / o_.tp : seq, o_.model.hidden};
  }
  // Tags name the boundary between global chunks b and b + 1, the micro-batch and the direction.
  int tag(int boundary, std::int64_t m, int direction) const {
    return static_cast<int>(2 * (boundary * o_.num_micro_batches + m) + direction);
  }
  void resume(const std::string& checkpoint);
  void send(StepState& s, ProcessGroup& group, const torch::Tensor& tensor, int peer, int tag);
  void forward(StepState& s, int k, std::int64_t m);
  void backward(StepState& s, int k, std::int64_t m);
  double finish_step(StepState& s, double lr);
  std::optional<Evaluation> evaluate_pipeline();
  void evaluate_batch(const std::vector<std::int64_t>& all, std::int64_t b, std::int64_t batches,
                      torch::Tensor& sums);

  const TrainOptions& o_;
  RunSize size_;
  const std::vector<EncodedExample>& train_data_;
  const std::vector<EncodedExample>& validation_data_;
  std::size_t seq_len_;
  ParallelGroups& groups_;
  RankCoordinates c_;
  torch::Device device_;
  MixedPrecision mp_;
  int v_;            // model chunks on this rank
  int chunk_count_;  // pp * v_
  std::vector<costmodel::StageRange> stages_;
  std::vector<std::unique_ptr<EncoderClassifier>> chunks_;
  std::unique_ptr<FlatParameters> flat_;
  std::vector<costmodel::PipelineOp> tasks_;  // this rank's passes, costmodel::pipeline_order
  nlohmann::json layout_;
  std::optional<std::int64_t> resumed_from_;
  int previous_rank_;
  int next_rank_;
  torch::TensorOptions activation_options_;
  DeviceMemory device_memory_;
  int agreed_signal_ = 0;  // the stop signal every rank agreed on (0: none)
  HfFolder hf_;            // what step folders and the output folder say besides the weights
};

ParallelRank::ParallelRank(const TrainOptions& o, const RunSize& size,
                           const std::vector<EncodedExample>& train_data,
                           const std::vector<EncodedExample>& validation_data, std::size_t seq_len,
                           ParallelGroups& groups, CpuMemoryCounter& cpu_memory)
    : o_(o),
      size_(size),
      train_data_(train_data),
      validation_data_(validation_data),
      seq_len_(seq_len),
      groups_(groups),
      c_(groups.coordinates()),
      device_(prepare_device(o.device, o.device_index, o.precision)),
      mp_(mixed_precision(o.device, o.precision)),
      v_(o.virtual_stages),
      chunk_count_(o.pp * o.virtual_stages),
      previous_rank_((c_.pp + o.pp - 1) % o.pp),
      next_rank_((c_.pp + 1) % o.pp),
      activation_options_(torch::TensorOptions().dtype(torch::kFloat).device(device_)),
      device_memory_(o.device == Device::kCuda, o.device_index, cpu_memory,
                     o.ranks_in_process > 1) {
  hf_ = checked_hf_folder(o, groups);  // refuses bad labels, tokenizer files or --output now
  // Model chunks: global chunk g of pp * v ranges of the layer sequence runs on pipeline rank
  // g % pp, so this rank holds g = k * pp + c.pp for k = 0 .. v - 1.
  stages_ = o.stages.empty() ? costmodel::even_partition(o.model, chunk_count_) : o.stages;
  torch::manual_seed(o.seed);
  ParallelContext context;
  context.tp = std::make_shared<GroupTensorParallelComm>(groups.tp_group());
  for (int k = 0; k < v_; ++k) {
    EncoderOptions model_options;
    model_options.dropout = o.dropout;
    model_options.seed = o.seed;
    model_options.device = device_;
    model_options.recompute = o.recompute;
    model_options.recompute_layers = o.recompute_layers;
    model_options.sequence_parallel = o.sequence_parallel;
    model_options.attention = o.attention;
    const auto& range = stages_[static_cast<std::size_t>(global_chunk(k))];
    model_options.first_layer = range.first_layer;
    model_options.last_layer = range.last_layer;
    chunks_.push_back(std::make_unique<EncoderClassifier>(o.model, model_options, context));
    chunks_.back()->train();
    if (!o.init_weights.empty()) chunks_.back()->load_safetensors(o.init_weights);
  }
  FlatOptions flat_options;
  flat_options.zero = o.zero;
  flat_options.weight_decay = o.weight_decay;
  flat_options.bucket_bytes = o.bucket_bytes;
  flat_options.overlap = v_ == 1;
  flat_ = std::make_unique<FlatParameters>(flat_parameters_of(chunks_, c_.tp == 0), flat_options,
                                           groups, device_);
  // ZeRO-3: each chunk gathers its blocks around their forward and backward passes.
  for (int k = 0; k < v_; ++k) {
    chunks_[static_cast<std::size_t>(k)]->set_layer_hooks(flat_->layer_hooks(k));
  }
  tasks_ = costmodel::pipeline_order(o.schedule, o.pp, c_.pp, o.num_micro_batches, v_);
  // The checkpoints' layout (checkpoint.hpp): its stages are stages_ as computed above.
  layout_ = layout_json(o);
  if (o.resume) {
    if (const std::optional<std::string> checkpoint = latest_checkpoint(o.checkpoint_dir)) {
      resume(*checkpoint);
    }
  }
}

void ParallelRank::resume(const std::string& checkpoint) {
  const fs::path dir(checkpoint);
  const std::string source = (dir / kTrainerStateFile).string();
  const nlohmann::json state = read_trainer_state(dir);
  check_trainer_state(state, source, o_.model, o_.seed, size_.global_batch,
                      static_cast<std::int64_t>(train_data_.size()));
  const std::int64_t start_step = state.value("step", std::int64_t{0});
  if (needs_reshard(state, o_)) {  // another layout, or a one-rank checkpoint
    const TrainingState full = read_training_state(dir, state);
    load_training_state(full, chunks_, *flat_, o_.zero, groups_, source);
    restore_resharded_rng(full, o_.device, o_.device_index);
    resumed_from_ = start_step;
    return;
  }
  const int world_rank = groups_.world_rank();
  const std::vector<torch::Tensor> saved = read_rank_state(dir, world_rank, 5);
  const std::string mine = (dir / ("rank-" + std::to_string(world_rank) + ".pt")).string();
  flat_->load_state({saved.begin(), saved.begin() + 4}, mine);
  restore_rng({saved.begin() + 4, saved.end()}, o_.device, o_.device_index, mine);
  resumed_from_ = start_step;
}

void ParallelRank::save_checkpoint(std::int64_t step_done) {
  std::vector<torch::Tensor> saved = flat_->state();
  for (torch::Tensor& t : capture_rng(o_.device, o_.device_index)) saved.push_back(t);
  nlohmann::ordered_json state;
  state["format"] = kCheckpointFormat;
  state["step"] = step_done;
  state["epoch"] = step_done / size_.steps_per_epoch;
  state["seed"] = o_.seed;
  state["global_batch"] = size_.global_batch;
  state["total_steps"] = size_.total_steps;
  state["train_examples"] = static_cast<std::int64_t>(train_data_.size());
  state["world_size"] = o_.dp * o_.tp * o_.pp;
  state["layout"] = layout_;
  state["model"] = profiles::model_to_json(o_.model);
  StepFolderExtras extras;
  extras.write_files = [this](const fs::path& folder) { write_hf_files(folder, hf_); };
  extras.keep = o_.keep_checkpoints;
  write_rank_checkpoint(o_.checkpoint_dir, step_done, groups_.world(), saved, state, extras,
                        o_.fault_kill_in_checkpoint == step_done);
}

// Before each send: the sends already received are waited for (at once) and dropped, so a stage
// holds the buffers of the few still in flight, not every micro-batch's until the end.
void ParallelRank::send(StepState& s, ProcessGroup& group, const torch::Tensor& tensor, int peer,
                        int tag) {
  s.sends.erase(std::remove_if(s.sends.begin(), s.sends.end(),
                               [](PendingOperation& p) {
                                 if (!p.completed()) return false;
                                 p.wait();
                                 return true;
                               }),
                s.sends.end());
  s.sends.push_back(group.send(tensor, peer, tag));
}

void ParallelRank::forward(StepState& s, int k, std::int64_t m) {
  const int g = global_chunk(k);
  const std::int64_t mb = o_.micro_batch;
  const Batch batch = make_batch(train_data_, *s.order,
                                 s.offset + (c_.dp * o_.num_micro_batches + m) * mb, mb, device_);
  InFlight& f = s.in_flight[static_cast<std::size_t>(k * o_.num_micro_batches + m)];
  auto at = StepPhases::Clock::now();
  if (g > 0) {
    f.input = torch::empty(hidden_shape(mb), activation_options_);
    groups_.pp_from(previous_rank_).recv(f.input, previous_rank_, tag(g - 1, m, 0));
    f.input.requires_grad_(true);
    at = StepPhases::add(s.phases->pipeline_wait_s, at);
  }
  torch::Tensor out;
  {
    compat::AutocastGuard autocast(device_.type(), mp_.dtype, mp_.autocast);
    out = chunks_[static_cast<std::size_t>(k)]->forward(batch.inputs, f.input);
  }
  if (g == chunk_count_ - 1) {
    f.output = torch::nn::functional::cross_entropy(out.to(torch::kFloat), batch.labels) /
               static_cast<double>(o_.num_micro_batches);
    s.local_loss += f.output.detach();
    StepPhases::add(s.phases->forward_s, at);
  } else {
    f.output = out.to(torch::kFloat);
    StepPhases::add(s.phases->forward_s, at);
    send(s, groups_.pp_to(next_rank_), f.output.detach(), next_rank_, tag(g, m, 0));
  }
}

void ParallelRank::backward(StepState& s, int k, std::int64_t m) {
  const int g = global_chunk(k);
  InFlight& f = s.in_flight[static_cast<std::size_t>(k * o_.num_micro_batches + m)];
  // The step's last backward pass (chunk 0, last micro-batch in every schedule) starts the
  // bucketed gradient all-reduces from its hooks (v = 1 only).
  if (k == 0 && m == o_.num_micro_batches - 1) flat_->arm();
  auto at = StepPhases::Clock::now();
  if (g == chunk_count_ - 1) {
    f.output.backward();
  } else {
    torch::Tensor grad = torch::empty(hidden_shape(o_.micro_batch), activation_options_);
    groups_.pp_from(next_rank_).recv(grad, next_rank_, tag(g, m, 1));
    at = StepPhases::add(s.phases->pipeline_wait_s, at);
    torch::autograd::backward({f.output}, {grad});
  }
  if (g > 0) {
    send(s, groups_.pp_to(previous_rank_), f.input.grad(), previous_rank_, tag(g - 1, m, 1));
  }
  flat_->finish_backward(k);
  StepPhases::add(s.phases->backward_s, at);
  f = InFlight{};
  if (o_.fault_kill_in_step == s.step + 1) ::raise(SIGKILL);  // fault injection
}

double ParallelRank::train_step(std::int64_t step, const std::vector<std::int64_t>& order,
                                std::int64_t offset, double lr, StepPhases& phases) {
  flat_->zero_grad();
  StepState s;
  s.step = step;
  s.order = &order;
  s.offset = offset;
  s.phases = &phases;
  s.in_flight.resize(static_cast<std::size_t>(v_ * o_.num_micro_batches));
  s.local_loss = torch::zeros({}, torch::TensorOptions().device(device_));
  for (const costmodel::PipelineOp& task : tasks_) {
    if (task.pass == costmodel::PassKind::kForward) {
      forward(s, task.chunk, task.micro_batch);
    } else {
      backward(s, task.chunk, task.micro_batch);
    }
  }
  return finish_step(s, lr);
}

// The step after its passes: the last sends, the dp reduction, clipping, AdamW, and one
// all-reduce over the world of the step's loss and the stop vote.
double ParallelRank::finish_step(StepState& s, double lr) {
  StepPhases& phases = *s.phases;
  auto at = StepPhases::Clock::now();
  for (PendingOperation& p : s.sends) p.wait();
  at = StepPhases::add(phases.pipeline_wait_s, at);

  const torch::Tensor grad = flat_->reduce_gradients();
  // Clipped as torch.nn.utils.clip_grad_norm_, on the device (no host synchronisation).
  const torch::Tensor grad_norm = flat_->global_norm(grad);
  if (o_.max_grad_norm > 0.0) grad.mul_((o_.max_grad_norm / (grad_norm + 1e-6)).clamp_max(1.0));
  at = StepPhases::add(phases.gradients_s, at);
  flat_->step(grad, lr);
  flat_->release();
  StepPhases::add(phases.optimizer_s, at);

  // The step's loss is the last stage's, held once by each of its tp ranks, averaged over dp; a
  // stop signal on any rank stops every rank after this step.
  torch::Tensor stats = torch::zeros({1 + kStopSignalSlots},
                                     torch::TensorOptions().dtype(torch::kDouble).device(device_));
  stats[0] += s.local_loss;
  add_stop_vote(stats.narrow(0, 1, kStopSignalSlots), o_.stop_signal);
  groups_.world().allreduce_sum(stats);
  const torch::Tensor host_stats = stats.to(torch::kCPU);
  const double step_loss =
      host_stats[0].item<double>() / static_cast<double>(o_.dp * groups_.tp_size());
  agreed_signal_ = agreed_stop_signal(host_stats.narrow(0, 1, kStopSignalSlots));
  if (o_.device == Device::kCuda) cuda_synchronize(o_.device_index);
  return step_loss;
}

std::optional<Evaluation> ParallelRank::evaluate() {
  std::optional<Evaluation> result = evaluate_pipeline();
  flat_->release();
  return result;
}

// Validation batch b of `batches` through this rank's chunks; the last stage adds [loss sum,
// correct] to `sums`. The tag names the boundary g - 1 -> g and the batch.
void ParallelRank::evaluate_batch(const std::vector<std::int64_t>& all, std::int64_t b,
                                  std::int64_t batches, torch::Tensor& sums) {
  const std::int64_t eval_batch = o_.eval_batch > 0 ? o_.eval_batch : o_.micro_batch;
  const auto count = static_cast<std::int64_t>(validation_data_.size());
  const std::int64_t begin = b * eval_batch;
  const std::int64_t n = std::min(eval_batch, count - begin);
  const Batch batch = make_batch(validation_data_, all, begin, n, device_);
  torch::Tensor out;
  std::vector<PendingOperation> sends;
  for (int k = 0; k < v_; ++k) {
    const int g = global_chunk(k);
    torch::Tensor hidden;
    if (g > 0) {
      hidden = torch::empty(hidden_shape(n), activation_options_);
      groups_.pp_from(previous_rank_)
          .recv(hidden, previous_rank_, static_cast<int>((g - 1) * batches + b));
    }
    {
      compat::AutocastGuard autocast(device_.type(), mp_.dtype, mp_.autocast);
      out = chunks_[static_cast<std::size_t>(k)]->forward(batch.inputs, hidden).to(torch::kFloat);
    }
    if (g < chunk_count_ - 1) {
      sends.push_back(
          groups_.pp_to(next_rank_).send(out, next_rank_, static_cast<int>(g * batches + b)));
    }
  }
  if (global_chunk(v_ - 1) == chunk_count_ - 1) {
    sums[0] += torch::nn::functional::cross_entropy(
        out, batch.labels, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
    sums[1] += out.argmax(1).eq(batch.labels).sum();
  }
  // The next stage receives this round's sends within the round: waiting here bounds what is
  // held to one batch's activations and cannot wait on a cycle.
  for (PendingOperation& s : sends) s.wait();
}

// Forward through the pipeline without gradients. The dp replicas share the batches (replica d
// takes batches d, d + dp, ...), the last stage scores on the device, and one all-reduce gives
// every rank the result. nullopt when a stop signal (agreed by every rank every
// kStopCheckRounds rounds) abandoned it.
std::optional<Evaluation> ParallelRank::evaluate_pipeline() {
  torch::NoGradGuard no_grad;
  for (auto& chunk : chunks_) chunk->eval();
  std::vector<std::int64_t> all(validation_data_.size());
  std::iota(all.begin(), all.end(), 0);
  const auto count = static_cast<std::int64_t>(validation_data_.size());
  const std::int64_t eval_batch = o_.eval_batch > 0 ? o_.eval_batch : o_.micro_batch;
  // [loss sum, correct] on the device; on the last stage only, else zero.
  torch::Tensor sums =
      torch::zeros({2}, torch::TensorOptions().dtype(torch::kDouble).device(device_));
  const std::int64_t batches = (count + eval_batch - 1) / eval_batch;
  const std::int64_t rounds = (batches + o_.dp - 1) / o_.dp;
  bool stopped = false;
  for (std::int64_t r = 0; r < rounds && !stopped; ++r) {
    const std::int64_t b = r * o_.dp + c_.dp;
    if (b < batches) {
      evaluate_batch(all, b, batches, sums);
    } else if (flat_->gathers_in_forward()) {
      // ZeRO-3's forward gathers are dp collectives: a replica without a batch this round runs
      // the last one again and drops its scores, so that every dp rank gathers alike.
      torch::Tensor dropped = torch::zeros_like(sums);
      evaluate_batch(all, batches - 1, batches, dropped);
    }
    if (o_.stop_signal != nullptr && (r + 1) % kStopCheckRounds == 0 && r + 1 < rounds) {
      torch::Tensor votes =
          torch::zeros({kStopSignalSlots}, torch::TensorOptions().dtype(torch::kDouble));
      add_stop_vote(votes, o_.stop_signal);
      groups_.world().allreduce_sum(votes);
      agreed_signal_ = agreed_stop_signal(votes);
      stopped = agreed_signal_ != 0;
    }
  }
  for (auto& chunk : chunks_) chunk->train();
  if (stopped) return std::nullopt;
  // Every tp rank of the last stage holds the same sums: the world's total counts each tp times.
  groups_.world().allreduce_sum(sums);
  const torch::Tensor host = sums.to(torch::kCPU) / static_cast<double>(groups_.tp_size());
  return Evaluation{host[1].item<double>() / static_cast<double>(count),
                    host[0].item<double>() / static_cast<double>(count)};
}

}  // namespace

std::unique_ptr<TrainRank> make_parallel_rank(const TrainOptions& options, const RunSize& size,
                                              const std::vector<EncodedExample>& train_data,
                                              const std::vector<EncodedExample>& validation_data,
                                              std::size_t seq_len, ParallelGroups& groups,
                                              CpuMemoryCounter& cpu_memory) {
  return std::make_unique<ParallelRank>(options, size, train_data, validation_data, seq_len, groups,
                                        cpu_memory);
}

}  // namespace loom::executor
