// loom train: one rank of a plan (docs/README.md). Reads the plan, the data and the tokenizer,
// checks them against each other, and calls executor::train_classifier.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "executor/dataset.hpp"
#include "executor/device_batch.hpp"
#include "executor/distributed.hpp"
#include "executor/executor.hpp"
#include "executor/model.hpp"
#include "executor/reshard.hpp"
#include "executor/tokenizer.hpp"
#include "executor/tokenizer_files.hpp"
#include "executor/train.hpp"
#include "planner/plan.hpp"
#include "profiles/errors.hpp"
#include "profiles/json_reader.hpp"
#include "profiles/loader.hpp"
#include "tools/commands.hpp"

namespace loom::tools {

namespace {

namespace fs = std::filesystem;

struct TrainArgs {
  std::string plan;
  std::string data;
  std::string tokenizer;
  std::string init;
  std::string eval_data;
  std::optional<std::int64_t> steps, epochs;
  std::optional<double> lr;  // default: kFineTuningLr with --init, else kFromScratchLr
  std::optional<std::int64_t> warmup_steps;  // default: kWarmupShare of the run's steps
  std::int64_t eval_every = 0;
  std::uint64_t seed = 42;
  double validation_fraction = 0.1;
  double dropout = 0.1;
  std::string checkpoint;
  std::int64_t checkpoint_every = 0;
  std::int64_t keep_checkpoints = 0;
  std::string output;
  bool resume = false;
  std::string metrics;
  std::string dump_batches;
  std::string device;  // "" = the plan's: cuda for a GPU cluster, cpu for a CPU cluster
  std::optional<std::int64_t> log_every;  // default: about 20 log lines per run
  double comm_timeout_s = 300;
  std::string comm;  // "" = nccl on cuda, gloo on cpu
  bool json = false;
};

// The default peak learning rates: BERT's fine-tuning rate for a pre-trained --init checkpoint
// (Devlin et al. 2019 recommend 5e-5, 3e-5 or 2e-5), and a rate a randomly initialised encoder
// learns at (at 2e-5 the tiny synthetic-review model stays at chance for hundreds of steps).
constexpr double kFineTuningLr = 2e-5;
constexpr double kFromScratchLr = 1e-3;
// Warm-up over the first tenth of the steps unless --warmup-steps says otherwise, as Google's
// BERT fine-tuning scripts do (run_classifier.py, warmup_proportion 0.1). Without it, training
// from scratch at 1e-3 can settle at chance in its first steps.
constexpr double kWarmupShare = 0.1;

// A learning rate as people write one: 1e-3, 2e-5.
std::string rate_text(double lr) {
  char text[32];
  std::snprintf(text, sizeof text, "%.0e", lr);
  std::string out = text;
  for (const char* padded : {"e-0", "e+0"}) {
    if (const auto at = out.find(padded); at != std::string::npos) out.erase(at + 2, 1);
  }
  return out;
}

// The device of the run: --device, else the plan's (cuda for a GPU cluster, cpu for a CPU one).
// Refuses cuda where this build or machine cannot run it, an attention kernel this LibTorch lacks
// and a precision the device does not run. Every obstacle is named in one error, with every flag
// that removes them, so that a GPU plan reaches the CPU in one more run, not three.
executor::Device run_device(const TrainArgs& a, const planner::Plan& plan) {
  const bool gpu_plan = plan.cluster.device.kind == profiles::DeviceKind::kGpu;
  executor::Device device = gpu_plan ? executor::Device::kCuda : executor::Device::kCpu;
  if (!a.device.empty()) {
    const auto parsed = executor::parse_device(a.device);
    if (!parsed) throw InputError("--device", "", "cpu or cuda, found \"" + a.device + "\"");
    device = *parsed;
  }
  std::string source;               // the first obstacle's
  std::vector<std::string> why;     // each obstacle, with its own fix
  std::vector<std::string> replan;  // loom plan flags that remove the plan's obstacles
  bool to_cpu = false;              // whether --device cpu is part of the fix
  const std::string cpu_fix = a.device.empty() ? "add --device cpu" : "use --device cpu";
  if (device == executor::Device::kCuda) {
    const executor::CudaSupport cuda = executor::cuda_support();
    const std::string what = a.device.empty()
                                 ? "a plan for " + plan.cluster.name + "'s GPUs trains on cuda"
                                 : std::string("cuda");
    if (cuda == executor::CudaSupport::kNotBuilt) {
      why.push_back(what +
                    ", which needs a CUDA build of Loom, and this one is a CPU build (its "
                    "LibTorch has no CUDA): build for GPUs with " +
                    executor::kCudaBuildHint + ", or " + cpu_fix + " to train on the CPU");
    }
    if (cuda == executor::CudaSupport::kNoGpu) {
      why.push_back(what +
                    ", which needs a GPU, and LibTorch sees none on this machine (check "
                    "nvidia-smi and CUDA_VISIBLE_DEVICES): " +
                    cpu_fix + " to train on the CPU");
    }
    if (!why.empty()) {
      source = a.device.empty() ? a.plan : "--device";
      to_cpu = true;
    }
  }
  // The other checks for the device the run would then use.
  const executor::Device used = to_cpu ? executor::Device::kCpu : device;
  if (!executor::runs_attention(plan.strategy.attention)) {
    if (source.empty()) source = a.plan;
    why.push_back(std::string("$.strategy.attention: ") +
                  costmodel::to_string(plan.strategy.attention) +
                  " needs LibTorch 2 or later (scaled_dot_product_attention): re-plan with "
                  "--attention math");
    replan.emplace_back("--attention math");
  }
  const std::string precision =
      executor::precision_refusal(used, plan.job.precision, plan.strategy.tp);
  if (!precision.empty()) {
    if (source.empty()) source = a.plan;
    if (plan.job.precision == profiles::Precision::kFp8) {
      why.push_back("$.job.precision: " + precision + ": re-plan with --precision bf16");
      replan.emplace_back("--precision bf16");
    } else {
      why.push_back("$.job.precision: " + precision +
                    ": re-plan with --precision fp32, or for a CPU cluster (its plans train in "
                    "fp32)" +
                    (gpu_plan && !to_cpu ? ", or train it on cuda" : ""));
      replan.emplace_back("--precision fp32");
    }
  }
  if (why.empty()) return device;
  if (why.size() == 1) {
    // One obstacle: its own words; the plan's fields keep their JSON path.
    const std::string& only = why.front();
    const auto colon = only.find(": ");
    if (only.rfind("$.", 0) == 0) {
      throw InputError(source, only.substr(0, colon), only.substr(colon + 2));
    }
    throw InputError(source, "", only);
  }
  std::string text;
  for (const std::string& w : why) text += (text.empty() ? "" : "; and ") + w;
  std::string flags;
  for (const std::string& f : replan) flags += " " + f;
  text += ". To train it here, all at once: ";
  if (!flags.empty()) text += "re-plan with" + flags + (to_cpu ? ", and " : "");
  if (to_cpu) text += cpu_fix;
  throw InputError(source, "", text);
}

// The tokenizer: --tokenizer (vocab.txt, vocab.json + merges.txt, tokenizer.json or a folder),
// else the --init folder's tokenizer files, else with --resume the files the latest checkpoint
// holds (a checkpoint keeps the tokenizer it was trained with), else the synthetic data's own
// vocabulary.
std::unique_ptr<executor::Tokenizer> load_tokenizer(const TrainArgs& a) {
  if (!a.tokenizer.empty()) return executor::load_tokenizer(a.tokenizer);
  if (!a.init.empty() && executor::holds_tokenizer(a.init)) {
    return executor::load_tokenizer(a.init);
  }
  if (a.resume && !a.checkpoint.empty()) {
    const std::optional<std::string> latest = executor::latest_checkpoint(a.checkpoint);
    if (latest && executor::holds_tokenizer(*latest)) return executor::load_tokenizer(*latest);
  }
  if (a.data.rfind("synthetic", 0) == 0) {
    return std::make_unique<executor::WordPieceTokenizer>(executor::WordPieceTokenizer::from_tokens(
        executor::synthetic_vocabulary(), true, "the synthetic vocabulary"));
  }
  throw InputError("--tokenizer", "",
                   "a tokenizer for " + a.data +
                       ": vocab.txt, vocab.json + merges.txt, tokenizer.json or a folder holding "
                       "them (or --init with a checkpoint folder that holds them, or --resume "
                       "from a --checkpoint folder whose checkpoints hold them)");
}

// What a tokenizer was read from, for messages.
std::string tokenizer_source(const executor::Tokenizer& tokenizer) {
  return tokenizer.files().empty() ? "the synthetic vocabulary" : tokenizer.files().front();
}

// The tokenizer against the plan's model: ids the embedding has, and the padding id the model
// pads with (RoBERTa's positions count from it).
void check_tokenizer(const executor::Tokenizer& tokenizer, const planner::Plan& plan) {
  if (tokenizer.vocab_size() > plan.model.vocab) {
    throw InputError(tokenizer_source(tokenizer), "",
                     "at most the model's " + std::to_string(plan.model.vocab) + " token ids (" +
                         plan.model.name + " vocab), found " +
                         std::to_string(tokenizer.vocab_size()));
  }
  const std::int64_t model_pad = executor::pad_token_id(plan.model.model_type);
  // The synthetic vocabulary is Loom's own and pads with 0 for every model.
  if (!tokenizer.files().empty() && tokenizer.pad_id() != model_pad) {
    throw InputError(tokenizer_source(tokenizer), "",
                     "a tokenizer whose padding id is the model's (" +
                         std::string(profiles::to_string(plan.model.model_type)) + " pads with " +
                         std::to_string(model_pad) + "); this " + tokenizer.description() +
                         " pads with " + std::to_string(tokenizer.pad_id()) +
                         ": a tokenizer of another model?");
  }
}

// The plan's model against the init checkpoint's config.json: the same architecture, or a clear
// refusal (a plan made for another model).
void check_init_config(const planner::Plan& plan, const std::string& init) {
  const fs::path config = fs::path(init) / "config.json";
  if (!fs::exists(config)) return;
  const profiles::ModelSpec m = profiles::load_model(config.string());
  const profiles::ModelSpec& p = plan.model;
  auto same = [&](const char* field, std::int64_t a, std::int64_t b) {
    if (a != b) {
      throw InputError(config.string(), std::string("$.") + field,
                       "the plan's model (" + p.name + ": " + field + " " + std::to_string(b) +
                           "); this checkpoint has " + std::to_string(a) +
                           ": the plan was made for another model");
    }
  };
  same("num_hidden_layers", m.layers, p.layers);
  same("hidden_size", m.hidden, p.hidden);
  same("num_attention_heads", m.heads, p.heads);
  same("intermediate_size", m.ffn_hidden, p.ffn_hidden);
  same("vocab_size", m.vocab, p.vocab);
  same("max_position_embeddings", m.max_positions, p.max_positions);
  if (m.model_type != p.model_type) {
    throw InputError(config.string(), "$.model_type",
                     "the plan's model type (" + std::string(profiles::to_string(p.model_type)) +
                         "): the plan was made for another model");
  }
  if (m.activation != p.activation) {
    throw InputError(config.string(), "$.hidden_act",
                     "the plan's activation (" + std::string(profiles::to_string(p.activation)) +
                         "); this checkpoint's is " + profiles::to_string(m.activation) +
                         ": the plan was made for another model");
  }
}

// LibTorch threads of a CPU rank: what the cost model assumed for a CPU cluster's plan (the
// node's cores shared by its ranks), else this machine's cores shared by the local ranks; at most
// this machine's cores.
int cpu_threads(const planner::Plan& plan, int world_size) {
  const int cores = static_cast<int>(std::max(1U, std::thread::hardware_concurrency()));
  const int threads = plan.cluster.device.kind == profiles::DeviceKind::kCpu
                          ? costmodel::threads_per_rank(plan.cluster, world_size)
                          : local_cpu_threads();
  return std::clamp(threads, 1, cores);
}

std::vector<executor::EncodedExample> encode(const std::vector<executor::Review>& reviews,
                                             const executor::Tokenizer& tokenizer,
                                             std::int64_t seq_len) {
  std::vector<executor::EncodedExample> out;
  out.reserve(reviews.size());
  for (const executor::Review& r : reviews)
    out.push_back(tokenizer.encode(r.text, seq_len, r.label));
  return out;
}

// Reviews whose tokens the unknown-token check reads: the first batches of a run.
constexpr std::size_t kUnknownCheckReviews = 256;
// A share of unknown tokens above this means the vocabulary does not fit the text (a real
// vocabulary leaves well under 1 % of English reviews unknown).
constexpr double kUnknownWarnShare = 0.05;

// Warns (stderr) when the tokenizer turned more than kUnknownWarnShare of the first reviews' words
// into its unknown token: a vocabulary of another model or a wrongly converted file trains
// silently to chance otherwise.
void warn_unknown_tokens(const std::vector<executor::EncodedExample>& examples,
                         const executor::Tokenizer& tokenizer) {
  const std::int64_t unknown = tokenizer.unknown_id();
  if (unknown < 0) return;
  std::int64_t words = 0;
  std::int64_t unknown_words = 0;
  const std::size_t n = std::min(examples.size(), kUnknownCheckReviews);
  for (std::size_t i = 0; i < n; ++i) {
    const executor::EncodedExample& e = examples[i];
    std::int64_t real = 0;
    for (const std::int64_t m : e.attention_mask) real += m;
    // Between the start and the end token.
    for (std::int64_t t = 1; t + 1 < real; ++t) {
      ++words;
      unknown_words += e.input_ids[static_cast<std::size_t>(t)] == unknown ? 1 : 0;
    }
  }
  if (words == 0) return;
  const double share = static_cast<double>(unknown_words) / static_cast<double>(words);
  if (share <= kUnknownWarnShare) return;
  char percent[32];
  std::snprintf(percent, sizeof percent, "%.1f %%", 100 * share);
  std::cerr << "loom train: warning: " << percent << " of the tokens of the first " << n
            << " training reviews are the unknown token (id " << unknown << ") of "
            << tokenizer_source(tokenizer) << ": is it this model's vocabulary, converted right?\n";
}

// Where the SIGINT/SIGTERM handler leaves the signal number for the training loop (a signal
// handler can only reach a static).
// NOLINTNEXTLINE(cppcoreguidelines-avoid-non-const-global-variables)
std::atomic<int> stop_signal_received{0};

void on_stop_signal(int signal_number) { stop_signal_received.store(signal_number); }

// Stops at the next step boundary on SIGINT or SIGTERM instead of dying mid-step.
void install_stop_handlers() {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
}

// LOOM_FAULT=kill-in-step:N or kill-in-checkpoint:N, optionally @R for world rank R only (tests
// of the fault handling: executor::TrainOptions::fault_kill_in_step).
void read_fault_injection(executor::TrainOptions& o, int rank) {
  const char* fault = std::getenv("LOOM_FAULT");
  if (fault == nullptr || *fault == 0) return;
  std::string text = fault;
  const auto at = text.find('@');
  if (at != std::string::npos) {
    if (std::atoi(text.c_str() + at + 1) != rank) return;
    text = text.substr(0, at);
  }
  const auto colon = text.find(':');
  const std::string kind = text.substr(0, colon);
  const std::int64_t step =
      colon == std::string::npos ? 0 : std::strtoll(text.c_str() + colon + 1, nullptr, 10);
  if (step < 1 || (kind != "kill-in-step" && kind != "kill-in-checkpoint")) {
    throw InputError("LOOM_FAULT", "",
                     "kill-in-step:N or kill-in-checkpoint:N (N >= 1, optionally @RANK), found \"" +
                         std::string(fault) + "\"");
  }
  (kind == "kill-in-step" ? o.fault_kill_in_step : o.fault_kill_in_checkpoint) = step;
}

// Rank 0's account of the run: why it stopped early, then the summary as JSON or text, the
// evaluation named by its split and size.
void print_summary(const TrainArgs& a, const executor::TrainSummary& s, const std::string& split,
                   std::size_t eval_examples) {
  if (s.stopped_by_signal != 0) {
    std::cerr << "loom train: stopped by signal " << s.stopped_by_signal << " after step "
              << s.steps
              << (a.checkpoint.empty() ? std::string(" (no --checkpoint: nothing saved)")
                                       : " (checkpoint written to " + a.checkpoint + ")")
              << "\n";
  }
  if (a.json) {
    nlohmann::json j{{"steps", s.steps},
                     {"final_loss", s.final_loss},
                     {"median_step_time_s", s.median_step_time_s},
                     {"samples_per_s", s.samples_per_s},
                     {"peak_memory_bytes", s.peak_memory_bytes},
                     {"precision", s.precision},
                     {"losses", s.losses}};
    if (s.validation_accuracy) {
      j["validation_accuracy"] = *s.validation_accuracy;  // the keys keep their names
      j["eval_split"] = split;                            // whatever split was evaluated
    }
    if (s.validation_loss) j["validation_loss"] = *s.validation_loss;
    if (s.resumed_from_step) j["resumed_from_step"] = *s.resumed_from_step;
    std::cout << j.dump(2) << "\n";
    return;
  }
  char line[256];
  std::snprintf(line, sizeof line,
                "trained %lld steps: loss %.4f, %.1f samples/s, median step %.4f s, peak memory "
                "%.1f MiB\n",
                static_cast<long long>(s.steps), s.final_loss, s.samples_per_s,
                s.median_step_time_s, static_cast<double>(s.peak_memory_bytes) / (1 << 20));
  std::cout << line;
  if (s.resumed_from_step) {
    std::cout << "resumed from step " << *s.resumed_from_step << " (the latest checkpoint in "
              << a.checkpoint << ")\n";
  }
  if (s.validation_accuracy) {
    std::snprintf(line, sizeof line, "%s accuracy %.2f %% (%zu reviews), loss %.4f\n",
                  split.c_str(), 100 * *s.validation_accuracy, eval_examples,
                  s.validation_loss.value_or(0));
    std::cout << line;
  }
}

// The plan's model is one loom train trains: a BERT or RoBERTa encoder with a classification head
// of at least two labels; InputError in the plan's terms otherwise.
void check_trainable_model(const TrainArgs& a, const planner::Plan& plan) {
  try {
    executor::check_encoder(plan.model);  // loom train trains encoders: named in the plan's terms
  } catch (const InputError& e) {
    throw InputError(a.plan, e.path().empty() ? "$.model" : "$.model." + e.path(), e.expectation());
  }
  if (!plan.model.num_labels) {
    throw InputError(a.plan, "$.model.num_labels",
                     "a classification head (loom train fine-tunes sequence classifiers); this "
                     "plan has a language-model head: re-plan with --num-labels N");
  }
  if (plan.strategy.cp > 1) {
    throw InputError(a.plan, "$.strategy.cp",
                     "1: Loom's executor does not split sequences over ranks (context parallelism "
                     "runs in Megatron-Core, runtime megatron or nemo); re-plan with --cp 1 to "
                     "train it here, found cp " +
                         std::to_string(plan.strategy.cp));
  }
  if (*plan.model.num_labels < 2) {
    throw InputError(a.plan, "$.model.num_labels",
                     "at least 2 labels (the reviews are labelled 0 negative and 1 positive), "
                     "found " +
                         std::to_string(*plan.model.num_labels));
  }
}

// Many ranks: rendezvous on rank 0's TCPStore, then the plan's dp/tp/pp groups, NCCL on cuda
// unless --comm gloo (ranks may then share a GPU, round-robin).
executor::TrainSummary train_many_ranks(const TrainArgs& a, const planner::Plan& plan,
                                        const executor::RankEnvironment& env,
                                        executor::TrainOptions o,
                                        const std::vector<executor::EncodedExample>& train_data,
                                        const std::vector<executor::EncodedExample>& validation) {
  const bool cuda = o.device == executor::Device::kCuda;
  const bool over_gloo = cuda && a.comm == "gloo";
  const executor::GroupOptions groups_options = executor::job_group_options(
      env, cuda, std::chrono::milliseconds(static_cast<std::int64_t>(a.comm_timeout_s * 1000)),
      over_gloo);
  if (cuda) {
    const int gpus = std::max<int>(1, static_cast<int>(torch::cuda::device_count()));
    o.device_index = over_gloo ? env.local_rank % gpus : env.local_rank;
  }
  const auto store = executor::connect_store(env, groups_options.timeout);
  executor::ParallelGroups groups(store, env.rank, plan.strategy.dp, plan.strategy.tp,
                                  plan.strategy.pp, groups_options);
  return executor::train_classifier(o, train_data, validation, groups);
}

int run_train(const TrainArgs& a) {
  const std::string text = profiles::read_text_file(a.plan);
  const planner::Plan plan =
      planner::plan_from_json(profiles::parse_json_text(text, a.plan), a.plan);
  check_trainable_model(a, plan);
  const executor::Device device = run_device(a, plan);  // before anything else is read
  if (a.comm == "nccl" && device == executor::Device::kCpu) {
    throw InputError("--comm", "", "gloo for a run on cpu (NCCL runs on CUDA devices only)");
  }
  const executor::RankEnvironment env = executor::process_rank_environment();
  if (env.world_size != plan.strategy.world_size()) {
    const int ranks = plan.strategy.world_size();
    throw InputError(a.plan, "$.strategy",
                     "a plan for the " + std::to_string(env.world_size) + " rank(s) of this job (" +
                         env.source + "); it has dp*tp*pp = " + std::to_string(ranks) +
                         " ranks: run it with loom launch --nproc " + std::to_string(ranks) +
                         " or a launcher that starts " + std::to_string(ranks) + " ranks");
  }
  executor::TrainOptions o = executor::train_options_from_plan(plan);
  o.device = device;
  if (a.steps.has_value() && a.epochs.has_value()) {
    throw InputError("--steps", "", "one of --steps N and --epochs E, not both");
  }
  // Neither: one pass over the training reviews.
  o.steps = a.steps.value_or(0);
  o.epochs = a.steps.has_value() ? a.epochs.value_or(0) : a.epochs.value_or(1);
  o.lr = a.lr.value_or(a.init.empty() ? kFromScratchLr : kFineTuningLr);
  o.print_every = a.log_every.value_or(executor::TrainOptions::kAutoPrintEvery);
  if (!a.lr && !a.json) {  // the default rate, said with the log lines
    const std::string scratch = rate_text(kFromScratchLr);
    const std::string fine_tuning = rate_text(kFineTuningLr);
    o.first_log_line =
        a.init.empty()
            ? "lr " + scratch + " (training from scratch; --init fine-tunes at " + fine_tuning + ")"
            : "lr " + fine_tuning + " (fine-tuning --init; from scratch the default is " + scratch +
                  ")";
  }
  if (a.warmup_steps) {
    o.warmup_steps = *a.warmup_steps;
  } else {
    o.warmup_share = kWarmupShare;
  }
  o.eval_every = a.eval_every;
  o.seed = a.seed;
  o.dropout = a.dropout;
  o.checkpoint_dir = a.checkpoint;
  o.checkpoint_every = a.checkpoint_every;
  o.keep_checkpoints = a.keep_checkpoints;
  o.output_dir = a.output;
  o.resume = a.resume;
  read_fault_injection(o, env.rank);
  install_stop_handlers();
  o.stop_signal = &stop_signal_received;
  o.metrics_path = a.metrics;
  // "{rank}" in the path: every rank writes its own metrics file.
  if (const auto at = a.metrics.find("{rank}"); at != std::string::npos) {
    o.metrics_path = a.metrics.substr(0, at) + std::to_string(env.rank) + a.metrics.substr(at + 6);
    o.metrics_every_rank = true;
  }
  o.batches_path = a.dump_batches;
  o.rank = env.rank;
  o.progress = !a.json;
  if (!a.init.empty()) {
    check_init_config(plan, a.init);
    const fs::path weights = fs::path(a.init) / "model.safetensors";
    if (!fs::exists(weights)) {
      throw InputError(
          "--init", "",
          "a checkpoint folder holding model.safetensors: " + weights.string() + " does not exist");
    }
    o.init_weights = weights.string();
  }
  if (!a.checkpoint.empty()) {
    std::error_code error;
    const fs::path folder(a.checkpoint);
    if (fs::exists(folder, error) && !fs::is_directory(folder, error)) {
      throw InputError("--checkpoint", "",
                       "a folder, found a file that is not one: " + a.checkpoint);
    }
  }
  if (a.resume && a.checkpoint.empty()) {
    throw InputError("--resume", "", "--checkpoint DIR to resume from");
  }
  executor::check_resume_memory(o, plan, a.plan);  // a checkpoint resharded into this layout
  if (!(a.validation_fraction > 0 && a.validation_fraction < 1)) {
    throw InputError("--validation-fraction", "", "a fraction in (0, 1)");
  }

  // The data first, so that a wrong --data is reported as such (not as a missing tokenizer).
  std::vector<executor::Review> reviews = executor::load_reviews(a.data, "train");
  // An evaluation split (--eval-data, or aclImdb/test) evaluates while all of --data trains;
  // without one, --validation-fraction of --data is held out.
  std::optional<executor::EvaluationSplit> evaluation =
      executor::load_evaluation_split(a.data, a.eval_data);
  const std::unique_ptr<executor::Tokenizer> tokenizer = load_tokenizer(a);
  check_tokenizer(*tokenizer, plan);
  o.tokenizer_files = tokenizer->files();
  // Every data source Loom reads is binary sentiment: 0 negative, 1 positive.
  if (plan.model.num_labels.value_or(2) == 2) o.label_names = {"negative", "positive"};
  const std::size_t review_count = reviews.size();
  executor::TrainValidation split;
  std::string eval_split_name = "validation";
  if (evaluation) {
    split.train = std::move(reviews);
    split.validation = std::move(evaluation->reviews);
    eval_split_name = evaluation->name;
  } else {
    split = executor::split_train_validation(std::move(reviews), a.validation_fraction, a.seed);
  }
  o.eval_split_name = eval_split_name;
  if (static_cast<std::int64_t>(split.train.size()) < plan.job.global_batch) {
    char fraction[32];
    std::snprintf(fraction, sizeof fraction, "%g", a.validation_fraction);
    throw InputError(
        a.data, "",
        "at least one global batch of " + std::to_string(plan.job.global_batch) +
            " training reviews" +
            (evaluation ? std::string()
                        : " after holding out --validation-fraction " + std::string(fraction)) +
            ", found " + std::to_string(split.train.size()) + " of " +
            std::to_string(review_count));
  }
  if (o.device == executor::Device::kCpu && std::getenv("OMP_NUM_THREADS") == nullptr) {
    at::set_num_threads(cpu_threads(plan, env.world_size));
  }
  const std::int64_t seq_len = plan.job.seq_len;
  const auto train_data = encode(split.train, *tokenizer, seq_len);
  const auto validation_data = encode(split.validation, *tokenizer, seq_len);
  if (env.rank == 0) warn_unknown_tokens(train_data, *tokenizer);
  executor::TrainSummary s;
  if (env.world_size == 1) {
    s = executor::train_classifier(o, train_data, validation_data);
  } else {
    s = train_many_ranks(a, plan, env, o, train_data, validation_data);
    if (env.rank != 0) {  // rank 0 prints the summary
      return s.stopped_by_signal != 0 ? 128 + s.stopped_by_signal : 0;
    }
  }

  print_summary(a, s, o.eval_split_name, validation_data.size());
  if (!a.output.empty() && s.stopped_by_signal == 0 && s.steps == s.total_steps && !a.json) {
    std::cout << "model written to " << a.output << " (Hugging Face folder)\n";
  }
  return s.stopped_by_signal != 0 ? 128 + s.stopped_by_signal : 0;
}

}  // namespace

Runner add_train_command(CLI::App& app) {
  auto args = std::make_shared<TrainArgs>();
  CLI::App* cmd = add_subcommand(app, "train");
  cmd->add_option("plan", args->plan, "PLAN.json (loom-plan/1)")->required();
  cmd->add_option("--data", args->data,
                  "aclImdb/ folder, CSV (review,sentiment or text,label ...) or synthetic[:N]")
      ->required();
  cmd->add_option("--tokenizer", args->tokenizer,
                  "vocab.txt, vocab.json (merges.txt beside it), tokenizer.json, or a folder "
                  "holding them (default: the --init folder's)");
  cmd->add_option("--init", args->init,
                  "Hugging Face checkpoint folder (config.json, model.safetensors, tokenizer "
                  "files)");
  cmd->add_option("--eval-data", args->eval_data,
                  "CSV or folder to evaluate on (default: aclImdb/test when --data is an aclImdb "
                  "folder with test/, else --validation-fraction of --data)");
  cmd->add_option("--steps", args->steps, "optimizer steps")->check(kPositiveNumber);
  cmd->add_option("--epochs", args->epochs,
                  "passes over the training data (default 1 when --steps is not given)")
      ->check(kPositiveNumber);
  cmd->add_option("--lr", args->lr,
                  "peak learning rate (default 2e-5 with --init, 1e-3 from scratch)")
      ->check(kPositiveNumber);
  cmd->add_option("--warmup-steps", args->warmup_steps,
                  "linear warm-up steps (default: a tenth of the steps)")
      ->check(kNonNegativeNumber);
  cmd->add_option("--eval-every", args->eval_every, "steps between evaluations (0: at the end)")
      ->check(kNonNegativeNumber);
  cmd->add_option("--seed", args->seed, "seed of initialisation, data order and dropout")
      ->check(kSeed);
  cmd->add_option("--validation-fraction", args->validation_fraction,
                  "share of the training reviews held out for validation when there is no "
                  "evaluation split (default 0.1)");
  cmd->add_option("--dropout", args->dropout, "dropout probability (default 0.1)")
      ->check(kProbability);
  cmd->add_option("--checkpoint", args->checkpoint, "folder for checkpoints");
  cmd->add_option("--checkpoint-every", args->checkpoint_every,
                  "steps between checkpoints (0: at the end)")
      ->check(kNonNegativeNumber);
  cmd->add_option("--keep-checkpoints", args->keep_checkpoints,
                  "step folders kept in --checkpoint, the newest (default 0: all)")
      ->check(kNonNegativeNumber);
  cmd->add_flag("--resume", args->resume, "continue from the latest checkpoint");
  cmd->add_option("--output", args->output,
                  "write the trained model here at the end as a Hugging Face folder (config.json, "
                  "model.safetensors, tokenizer files)");
  cmd->add_option("--metrics", args->metrics,
                  "METRICS.jsonl to write (\"{rank}\" in the name: one file per rank)");
  cmd->add_option("--dump-batches", args->dump_batches,
                  "BATCHES.jsonl: every micro-batch's token ids and labels (one rank)");
  cmd->add_option("--device", args->device,
                  "cpu | cuda (default: the plan's: cuda for a GPU cluster, cpu for a CPU one)");
  cmd->add_option("--log-every", args->log_every,
                  "steps between log lines on stderr (default: about 20 per run; 0: none)")
      ->check(kNonNegativeNumber);
  cmd->add_option("--comm-timeout", args->comm_timeout_s,
                  "seconds any collective may wait for a peer before failing (default 300)")
      ->check(kPositiveNumber);
  cmd->add_option("--comm", args->comm,
                  "nccl | gloo: the collectives' backend (default nccl on cuda, gloo on cpu); gloo "
                  "on cuda stages each through host memory, so ranks may share a GPU")
      ->check(CLI::IsMember({"nccl", "gloo"}));
  cmd->add_flag("--json", args->json, "print a JSON summary instead of text");
  return [args]() { return run_train(*args); };
}

}  // namespace loom::tools
