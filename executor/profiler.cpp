#include "executor/profiler.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <thread>

#include "executor/device.hpp"
#include "executor/distributed.hpp"
#include "executor/flat_adamw.hpp"
#include "executor/model.hpp"
#include "executor/torch_compat.hpp"
#include "profiles/errors.hpp"

namespace loom::executor {

namespace {

using Clock = std::chrono::steady_clock;
using profiles::LayerKind;

// One rank's shard of a tp group whose collectives are skipped: the compute of tp rank 0.
class ShardOnlyComm final : public TensorParallelComm {
 public:
  explicit ShardOnlyComm(int size) : size_(size) {}
  int rank() const override { return 0; }
  int size() const override { return size_; }
  void allreduce_sum(torch::Tensor& /*tensor*/) override {}

 private:
  int size_;
};

// The thread counts to measure with: --threads on the CPU, else the threads `loom train` gives a
// CPU rank that runs alone on this machine (its cores; LibTorch's own default can be fewer, e.g.
// 1 on a 2-core VM); on a GPU, LibTorch's current setting (host threads only launch kernels).
std::vector<int> thread_counts_of(const ProfileOptions& o) {
  if (o.device == Device::kCuda) return {at::get_num_threads()};
  if (!o.threads.empty()) return o.threads;
  return {static_cast<int>(std::max(1U, std::thread::hardware_concurrency()))};
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

struct Sample {
  double forward_s = 0;
  double backward_s = 0;
  std::int64_t activation_bytes = 0;
  std::int64_t peak_temporary_bytes = 0;
};

// One layer shape's samples so far (runs of several rounds pooled).
struct Samples {
  profiles::LayerMeasurement m;  // shape, parameter and memory figures of the last round
  std::vector<double> forward_s;
  std::vector<double> backward_s;
};

// `repeats` timed runs of one shape after `warmup` untimed ones, added to `samples`.
void measure(const ProfileOptions& o, LayerKind kind, std::int64_t batch, int tp,
             costmodel::Recompute recompute, int threads, int repeats, Samples& samples) {
  const profiles::ModelSpec& spec = o.model;
  const torch::Device device = o.device == Device::kCuda
                                   ? torch::Device(torch::kCUDA, o.device_index)
                                   : torch::Device(torch::kCPU);
  auto sync = [&] {
    if (o.device == Device::kCuda) cuda_synchronize(o.device_index);
  };
  const int last = static_cast<int>(spec.layers) + 1;
  EncoderOptions eo;
  eo.dropout = o.dropout;
  eo.seed = 1;
  eo.device = device;
  eo.recompute = recompute;
  eo.attention = o.attention;
  eo.first_layer = kind == LayerKind::kEmbedding ? 0 : kind == LayerKind::kHead ? last : 1;
  // Ranks of a tp group that measure together start each pass at slightly different times, and
  // the first all-reduce makes the early rank wait: inside a step that skew comes once per pass,
  // so a lone layer would charge it to every layer. On a GPU a lone layer's pass is bound by what
  // every call costs the host (autograd's start, the synchronisation). In both cases the model's
  // transformer layers run as one chain and a layer is 1/n of it, as inside a step; otherwise a
  // CPU times one layer.
  const bool together = tp > 1 && o.group != nullptr && o.group->size() == tp;
  const int chain = (o.device == Device::kCuda || together) && kind == LayerKind::kEncoderLayer
                        ? static_cast<int>(spec.layers)
                        : 1;
  eo.last_layer = eo.first_layer + chain - 1;
  ParallelContext context;
  if (together) {
    context.tp = std::make_shared<GroupTensorParallelComm>(o.group);
  } else {
    context.tp = std::make_shared<ShardOnlyComm>(tp);
  }

  CpuMemoryScope cpu_memory;
  DeviceMemory memory(o.device == Device::kCuda, o.device_index, cpu_memory.counter(), false);
  EncoderClassifier stage(spec, eo, context);
  stage.train();
  std::int64_t parameter_bytes = 0;
  for (const auto& [name, p] : stage.local_parameters()) {
    parameter_bytes += p.numel() * static_cast<std::int64_t>(p.element_size());
  }
  parameter_bytes /= chain;

  const std::int64_t seq = o.seq_len;
  const auto ids_options = torch::TensorOptions().dtype(torch::kLong).device(device);
  EncoderInputs inputs;
  const std::int64_t pad = pad_token_id(spec.model_type);
  inputs.input_ids = torch::randint(pad + 1, spec.vocab, {batch, seq}, ids_options);
  inputs.attention_mask = torch::ones({batch, seq}, ids_options);
  const auto float_options = torch::TensorOptions().dtype(torch::kFloat).device(device);
  torch::Tensor hidden;
  if (kind != LayerKind::kEmbedding) {
    hidden = torch::randn({batch, seq, spec.hidden}, float_options).requires_grad_(true);
  }
  const torch::Tensor labels = torch::randint(0, classifier_labels(spec), {batch}, ids_options);
  const torch::Tensor upstream = torch::randn({batch, seq, spec.hidden}, float_options);
  const bool autocast = o.device == Device::kCuda && o.precision != profiles::Precision::kFp32 &&
                        o.precision != profiles::Precision::kTf32;
  const c10::ScalarType autocast_dtype =
      o.precision == profiles::Precision::kFp16 ? torch::kHalf : torch::kBFloat16;

  std::vector<double>& forward = samples.forward_s;
  std::vector<double>& backward = samples.backward_s;
  Sample last_sample;
  for (int i = 0; i < o.warmup + repeats; ++i) {
    sync();
    const std::int64_t before = memory.current_bytes();
    const auto t0 = Clock::now();
    torch::Tensor out;
    {
      compat::AutocastGuard guard(device.type(), autocast_dtype, autocast);
      out = stage.forward(inputs, hidden);
      if (kind == LayerKind::kHead) out = torch::cross_entropy_loss(out.to(torch::kFloat), labels);
    }
    sync();
    const auto t1 = Clock::now();
    const std::int64_t kept = memory.current_bytes() - before;
    memory.reset_peak();
    const std::int64_t base = memory.current_bytes();
    if (kind == LayerKind::kHead) {
      out.backward();
    } else {
      out.backward(upstream.to(out.scalar_type()));
    }
    sync();
    const auto t2 = Clock::now();
    const std::int64_t temporary = memory.peak_bytes() - base;
    out = torch::Tensor();
    if (hidden.defined()) hidden.mutable_grad() = torch::Tensor();
    if (i >= o.warmup) {
      forward.push_back(std::chrono::duration<double>(t1 - t0).count() / chain);
      backward.push_back(std::chrono::duration<double>(t2 - t1).count() / chain);
      last_sample.activation_bytes = kept / chain;
      last_sample.peak_temporary_bytes = temporary;
    }
  }

  profiles::LayerMeasurement& m = samples.m;
  m.kind = kind;
  m.hidden = spec.hidden;
  m.heads = spec.heads;
  m.ffn_hidden = spec.ffn_hidden;
  if (kind != LayerKind::kEncoderLayer) m.vocab = spec.vocab;
  m.seq_len = seq;
  m.micro_batch = batch;
  m.tp = tp;
  m.recompute = costmodel::to_string(recompute);
  if (kind == LayerKind::kEncoderLayer) m.attention = costmodel::to_string(o.attention);
  m.threads = threads;
  m.tp_communication = together;
  m.chained_layers = chain;
  // Clock resolution bounds tiny layers from below (the profile format needs times > 0).
  m.forward_s = std::max(median_of(forward), 1e-9);
  m.backward_s = std::max(median_of(backward), 1e-9);
  m.activation_bytes = std::max<std::int64_t>(0, last_sample.activation_bytes);
  m.parameter_bytes = parameter_bytes;
  m.peak_temporary_bytes = std::max<std::int64_t>(0, last_sample.peak_temporary_bytes);
}

}  // namespace

std::vector<double> slowest_rank(ProcessGroup& group, Device device, int device_index,
                                 const std::vector<double>& values) {
  const auto n = static_cast<std::int64_t>(values.size());
  if (group.size() == 1 || n == 0) return values;
  const auto options = torch::TensorOptions().dtype(torch::kDouble);
  torch::Tensor all = torch::zeros({group.size(), n}, options);
  all[group.rank()].copy_(torch::tensor(values, options));
  if (device == Device::kCuda) all = all.to(torch::Device(torch::kCUDA, device_index));
  group.allreduce_sum(all);
  const torch::Tensor largest = std::get<0>(all.max(0)).to(torch::kCPU).contiguous();
  return {largest.data_ptr<double>(), largest.data_ptr<double>() + n};
}

std::vector<profiles::LayerMeasurement> profile_layers(const ProfileOptions& o) {
  parameter_table(o.model);  // refuses non-encoders
  if (o.seq_len < 1 || o.seq_len > o.model.max_positions) {
    throw InputError("--seq-len", "",
                     "1 to the model's " + std::to_string(o.model.max_positions) +
                         " positions, found " + std::to_string(o.seq_len));
  }
  for (std::int64_t b : o.micro_batches) {
    if (b < 1) throw InputError("--micro-batch", "", "positive sizes");
  }
  for (int tp : o.tp) {
    if (tp < 1 || o.model.heads % tp != 0 || o.model.ffn_hidden % tp != 0) {
      throw InputError("--tp", "",
                       "a divisor of the model's " + std::to_string(o.model.heads) + " heads and " +
                           std::to_string(o.model.ffn_hidden) + " ffn features, found " +
                           std::to_string(tp));
    }
  }
  if (o.precision == profiles::Precision::kFp8) {
    throw InputError("--precision", "", "bf16, fp16 or fp32: the executor has no fp8 products");
  }
  if (o.device == Device::kCpu && o.precision != profiles::Precision::kFp32) {
    throw InputError("--precision", "",
                     "fp32 on the CPU (the executor trains in fp32 there), found " +
                         std::string(profiles::to_string(o.precision)));
  }
  if (o.device == Device::kCuda && !cuda_available()) {
    throw InputError("--device", "", "cpu: this build of Loom or this machine has no CUDA");
  }
  if (o.warmup < 0 || o.repeats < 1) throw InputError("--repeats", "", "at least 1");

  const int threads_before = at::get_num_threads();
  const std::vector<int> thread_counts = thread_counts_of(o);
  for (int t : thread_counts) {
    if (t < 1) throw InputError("--threads", "", "positive thread counts");
  }
  // The runs of every shape are spread over the whole profiling time, round by round (at most
  // kRounds rounds of about repeats / kRounds runs each), so that a slow spell of a shared or
  // virtual machine lands on every shape alike rather than on the shapes measured during it.
  struct Shape {
    int threads;
    int tp;
    std::int64_t batch;
    LayerKind kind;
    costmodel::Recompute recompute;
  };
  const LayerKind layer = LayerKind::kEncoderLayer;
  std::vector<Shape> shapes;
  for (int threads : thread_counts) {
    for (int tp : o.tp) {
      for (std::int64_t b : o.micro_batches) {
        for (LayerKind kind : {LayerKind::kEmbedding, layer, LayerKind::kHead}) {
          // Recomputation changes transformer layers only: embeddings and heads are measured
          // once, without it, whichever variants the layers are measured in.
          if (kind != layer) {
            shapes.push_back({threads, tp, b, kind, costmodel::Recompute::kNone});
            continue;
          }
          for (costmodel::Recompute r : o.recompute) shapes.push_back({threads, tp, b, kind, r});
        }
      }
    }
  }
  constexpr int kRounds = 5;
  const int rounds = std::min(kRounds, o.repeats);
  std::vector<Samples> samples(shapes.size());
  for (int round = 0; round < rounds; ++round) {
    const int repeats = o.repeats / rounds + (round < o.repeats % rounds ? 1 : 0);
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      const Shape& x = shapes[i];
      at::set_num_threads(x.threads);
      measure(o, x.kind, x.batch, x.tp, x.recompute, x.threads, repeats, samples[i]);
    }
  }
  std::vector<profiles::LayerMeasurement> out;
  for (const Samples& x : samples) out.push_back(x.m);
  if (o.group != nullptr) {
    std::vector<double> values;
    for (const profiles::LayerMeasurement& m : out) {
      values.push_back(m.forward_s);
      values.push_back(m.backward_s);
    }
    values = slowest_rank(*o.group, o.device, o.device_index, values);
    for (std::size_t k = 0; k < out.size(); ++k) {
      out[k].forward_s = values[2 * k];
      out[k].backward_s = values[2 * k + 1];
    }
  }
  for (const profiles::LayerMeasurement& m : out) {
    if (o.progress) {
      char line[200];
      std::snprintf(line, sizeof line,
                    "%-13s b=%-3lld tp=%d threads=%d recompute=%-9s forward %.3f ms, "
                    "backward %.3f ms, kept %.1f MiB",
                    profiles::to_string(m.kind), static_cast<long long>(m.micro_batch), m.tp,
                    m.threads, m.recompute.c_str(), m.forward_s * 1e3, m.backward_s * 1e3,
                    static_cast<double>(m.activation_bytes) / (1 << 20));
      o.progress(line);
    }
  }
  at::set_num_threads(threads_before);
  return out;
}

std::vector<profiles::OptimizerMeasurement> profile_optimizer(const ProfileOptions& o) {
  const torch::Device device = o.device == Device::kCuda
                                   ? torch::Device(torch::kCUDA, o.device_index)
                                   : torch::Device(torch::kCPU);
  EncoderOptions eo;
  eo.device = device;
  EncoderClassifier model(o.model, eo);
  std::vector<torch::Tensor> parameters;
  std::int64_t count = 0;
  for (const auto& [name, p] : model.local_parameters()) {
    p.mutable_grad() = torch::randn_like(p) * 1e-3;
    parameters.push_back(p);
    count += p.numel();
  }
  // Values do not change the time of these element-wise passes, so one set of buffers serves
  // every repeat.
  torch::optim::AdamW optimizer(parameters, torch::optim::AdamWOptions(1e-5).weight_decay(0.01));
  const auto options = torch::TensorOptions().dtype(torch::kFloat).device(device);
  torch::Tensor flat = torch::randn({count}, options);
  torch::Tensor flat_grad = torch::randn({count}, options) * 1e-3;
  torch::Tensor exp_avg = torch::zeros({count}, options);
  torch::Tensor exp_avg_sq = torch::zeros({count}, options);
  const FlatRanges whole = {{0, count}};
  std::int64_t flat_steps = 0;
  // What a step of loom train does after the backward passes: take the gradients' norm, clip
  // them, update with AdamW; one rank's loop per tensor, many ranks' over flat buffers. Zeroing
  // the gradients at the step's start is not timed here: the cost model charges it as a write at
  // the device's memory rate (costmodel::zeroed_gradient_parameters).
  auto sync = [&] {
    if (o.device == Device::kCuda) cuda_synchronize(o.device_index);
  };
  auto one_rank = [&]() -> double {
    sync();
    const auto t0 = Clock::now();
    clip_gradients(parameters, 1.0);
    adamw_step(optimizer);
    sync();
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  auto many_ranks = [&]() -> double {
    torch::NoGradGuard no_grad;
    sync();
    const auto t0 = Clock::now();
    // Clipped to norm 1 as loom train clips: the gradient stays at that norm over the repeats
    // (a factor below 1 every repeat would shrink it into subnormal floats, slow on CPUs).
    const double norm = std::sqrt(squared_norm(flat_grad, whole).item<double>());
    flat_grad.mul_(std::min(1.0, 1.0 / (norm + 1e-6)));
    flat_adamw_update(flat, flat_grad, exp_avg, exp_avg_sq, ++flat_steps, 1e-5, 0.01, whole);
    sync();
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  const int threads_before = at::get_num_threads();
  const std::vector<int> thread_counts = thread_counts_of(o);
  std::vector<profiles::OptimizerMeasurement> out;
  for (int threads : thread_counts) {
    at::set_num_threads(threads);
    for (const bool is_flat : o.optimizer_loops) {
      std::vector<double> times;
      for (int i = 0; i < o.warmup + o.repeats; ++i) {
        const double elapsed_s = is_flat ? many_ranks() : one_rank();
        if (i >= o.warmup) times.push_back(elapsed_s);
      }
      out.push_back({count, threads, std::max(median_of(times), 1e-9), is_flat});
    }
  }
  at::set_num_threads(threads_before);
  if (o.group != nullptr) {
    std::vector<double> values;
    for (const profiles::OptimizerMeasurement& m : out) values.push_back(m.time_s);
    values = slowest_rank(*o.group, o.device, o.device_index, values);
    for (std::size_t k = 0; k < out.size(); ++k) out[k].time_s = values[k];
  }
  if (o.progress) {
    for (const profiles::OptimizerMeasurement& m : out) {
      char line[160];
      std::snprintf(line, sizeof line, "optimizer     %lld parameters threads=%d %s: %.3f ms",
                    static_cast<long long>(m.parameters), m.threads,
                    m.flat ? "flat (many ranks)" : "per tensor (one rank)", m.time_s * 1e3);
      o.progress(line);
    }
  }
  return out;
}

namespace {

// Group ranks 0 and 1 in a pipeline's steady state on CPU cores: each computes (a matrix product
// of about a millisecond on one thread), sends its result to the other and receives the other's.
// Returns the median time a round adds to the same compute without messages (the larger of the
// two ranks' figures), measured over `repeats` rounds in each of 5 alternations of the two.
double loaded_p2p_s(ProcessGroup& group, double bytes, const LinkProfileOptions& o) {
  const int threads_before = at::get_num_threads();
  at::set_num_threads(1);
  const torch::Tensor a = torch::randn({192, 192});
  torch::Tensor c = torch::empty({192, 192});
  const int rank = group.rank();
  const int peer = 1 - rank;
  const auto count = std::max<std::int64_t>(1, static_cast<std::int64_t>(bytes) / 4);
  torch::Tensor outgoing = torch::ones({count});
  torch::Tensor incoming = torch::empty({count});
  auto round = [&](bool messages) {
    for (int k = 0; k < 4; ++k) at::mm_out(c, a, a);
    if (!messages || rank > 1) return;
    PendingOperation sent = group.send(outgoing, peer, 7);
    group.recv(incoming, peer, 7);
    sent.wait();
  };
  std::vector<double> with;
  std::vector<double> without;
  for (int alternation = 0; alternation < 5; ++alternation) {
    for (const bool messages : {true, false}) {
      group.barrier();
      std::vector<double>& times = messages ? with : without;
      for (int i = 0; i < o.warmup + o.repeats; ++i) {
        const auto t0 = Clock::now();
        round(messages);
        if (i >= o.warmup) {
          times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
        }
      }
    }
  }
  at::set_num_threads(threads_before);
  const double mine = std::max(median_of(with) - median_of(without), 1e-9);
  return slowest_rank(group, Device::kCpu, 0, {mine})[0];
}

}  // namespace

std::vector<profiles::LinkMeasurement> profile_links(ProcessGroup& group, Device device,
                                                     int device_index,
                                                     const LinkProfileOptions& o) {
  const int n = group.size();
  const torch::Device where = device == Device::kCuda ? torch::Device(torch::kCUDA, device_index)
                                                      : torch::Device(torch::kCPU);
  const auto options = torch::TensorOptions().dtype(torch::kFloat).device(where);
  auto sync = [&] {
    if (device == Device::kCuda) cuda_synchronize(device_index);
  };
  std::vector<profiles::LinkMeasurement> out;
  auto timed = [&](const std::string& collective, double bytes, const std::function<void()>& op) {
    std::vector<double> times;
    for (int i = 0; i < o.warmup + o.repeats; ++i) {
      group.barrier();
      sync();
      const auto t0 = Clock::now();
      op();
      sync();
      const double t = std::chrono::duration<double>(Clock::now() - t0).count();
      if (i >= o.warmup) times.push_back(t);
    }
    out.push_back({collective, collective == "p2p" ? 2 : n, bytes, std::max(median_of(times), 1e-9),
                   o.scope});
  };
  for (double bytes : o.message_bytes) {
    // Whole buffers a multiple of the group size, in floats.
    const std::int64_t per_rank =
        std::max<std::int64_t>(1, static_cast<std::int64_t>(bytes) / 4 / n);
    const std::int64_t count = per_rank * n;
    const double whole = static_cast<double>(count) * 4;
    torch::Tensor buffer = torch::ones({count}, options);
    torch::Tensor shard = torch::ones({per_rank}, options);
    auto wanted = [&](const char* name) {
      return std::find(o.collectives.begin(), o.collectives.end(), name) != o.collectives.end();
    };
    if (wanted("allreduce")) timed("allreduce", whole, [&] { group.allreduce_sum(buffer); });
    if (wanted("reduce_scatter")) {
      timed("reduce_scatter", whole, [&] { group.reduce_scatter_sum(shard, buffer); });
    }
    if (wanted("all_gather")) timed("all_gather", whole, [&] { group.allgather(buffer, shard); });
    if (n >= 2 && wanted("p2p")) {
      // Ping-pong between group ranks 0 and 1: half the round trip.
      torch::Tensor message = torch::ones({count}, options);
      std::vector<double> times;
      for (int i = 0; i < o.warmup + o.repeats; ++i) {
        group.barrier();
        sync();
        const auto t0 = Clock::now();
        if (group.rank() == 0) {
          group.send(message, 1, 0).wait();
          group.recv(message, 1, 1);
        } else if (group.rank() == 1) {
          group.recv(message, 0, 0);
          group.send(message, 0, 1).wait();
        }
        sync();
        const double t = std::chrono::duration<double>(Clock::now() - t0).count() / 2;
        if (i >= o.warmup) times.push_back(t);
      }
      out.push_back({"p2p", 2, whole, std::max(median_of(times), 1e-9), o.scope});
    }
  }
  if (device == Device::kCpu && n >= 2) {
    for (double bytes : o.loaded_message_bytes) {
      out.push_back({"p2p_loaded", 2, bytes, loaded_p2p_s(group, bytes, o), o.scope});
    }
  }
  group.barrier();
  return out;
}

JobGroup join_job(Device device, double timeout_s, const std::string& name) {
  const RankEnvironment env = process_rank_environment();
  JobGroup out;
  out.rank = env.rank;
  out.world_size = env.world_size;
  out.source = env.source;
  const char* local_world = std::getenv("LOCAL_WORLD_SIZE");
  out.one_node = local_world != nullptr && std::atoi(local_world) == env.world_size;
  out.local_rank = env.local_rank;
  if (env.world_size < 2) return out;
  const GroupOptions groups =
      job_group_options(env, device == Device::kCuda,
                        std::chrono::milliseconds(static_cast<std::int64_t>(timeout_s * 1000)));
  if (device == Device::kCuda) cuda_set_device(env.local_rank);
  const auto store = connect_store(env, groups.timeout);
  std::vector<int> members(static_cast<std::size_t>(env.world_size));
  for (int r = 0; r < env.world_size; ++r) members[static_cast<std::size_t>(r)] = r;
  out.group = std::make_shared<ProcessGroup>(store, name, members, env.rank, groups);
  return out;
}

JobLinks profile_job_links(Device device, LinkProfileOptions options, double timeout_s) {
  const JobGroup job = join_job(device, timeout_s, "links");
  if (job.group == nullptr) {
    throw InputError("--links", "",
                     "a launched group of at least 2 ranks (loom launch --nproc N -- loom profile "
                     "--links ...), found " +
                         job.source);
  }
  options.scope = job.one_node ? "intra_node" : "inter_node";
  JobLinks out;
  out.rank = job.rank;
  out.world_size = job.world_size;
  out.links = profile_links(*job.group, device, job.local_rank, options);
  return out;
}

std::string device_description(Device device, int device_index) {
  if (device == Device::kCuda) return cuda_device_name(device_index);
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) {
        std::string name = line.substr(colon + 1);
        name.erase(0, name.find_first_not_of(' '));
        return name + " (" + std::to_string(std::thread::hardware_concurrency()) + " threads)";
      }
    }
  }
  return "cpu";
}

}  // namespace loom::executor
