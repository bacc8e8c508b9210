// loom profile: measures the model's layers on this device, or with --links the collectives
// between the ranks of a launched group, or with --for exactly the points a plan's prediction
// uses (planner/coverage.hpp), and writes loom-profile/1 (docs/README.md, formats.md).
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "executor/distributed.hpp"
#include "executor/profiler.hpp"
#include "planner/coverage.hpp"
#include "planner/plan.hpp"
#include "profiles/errors.hpp"
#include "profiles/json_reader.hpp"
#include "profiles/loader.hpp"
#include "profiles/profile.hpp"
#include "tools/commands.hpp"
#include "tools/ports.hpp"

namespace loom::tools {

namespace {

constexpr double kMaxLinkBytes = 17179869184.0;  // 16 GiB: --link-bytes' largest message

struct ProfileArgs {
  std::string model;
  std::string for_plan;  // --for PLAN.json
  std::string device;    // "" = cpu, or with --for the plan's device kind
  std::string precision;
  std::int64_t seq_len = 128;
  std::vector<std::int64_t> micro_batches = {1, 2, 4, 8};
  std::vector<int> tp = {1};
  std::vector<std::string> recompute = {"none"};
  std::string attention;  // "" = what loom train runs on the device (flash on cuda)
  std::vector<int> threads;
  int repeats = 10;
  bool links = false;
  std::vector<double> link_bytes;
  double comm_timeout_s = 300;
  std::string output;
  bool json = false;
};

// The attention core to measure: `text`, or without one what a plan for this device runs
// (flash on CUDA where this build has it, else math). One this build cannot run is refused.
costmodel::Attention profiled_attention(const std::string& text, executor::Device device) {
  if (text.empty()) {
    return device == executor::Device::kCuda &&
                   executor::runs_attention(costmodel::Attention::kFlash)
               ? costmodel::Attention::kFlash
               : costmodel::Attention::kMath;
  }
  const std::optional<costmodel::Attention> a = costmodel::parse_attention(text);
  if (!a) throw InputError("--attention", "", "flash or math, found " + text);
  if (!executor::runs_attention(*a)) {
    throw InputError(
        "--attention", "",
        "an attention core this build runs (flash needs LibTorch 2 or later), found " + text);
  }
  return *a;
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
}

// Writes the profile to -o and prints it (--json) or a summary line.
int write_profile(const ProfileArgs& a, const profiles::Profile& profile,
                  std::chrono::steady_clock::time_point start) {
  const nlohmann::json doc = profiles::profile_to_json(profile);
  profiles::write_file_atomically(a.output, doc.dump(2) + "\n");
  const double elapsed_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (a.json) {
    std::cout << doc.dump(2) << "\n";
    return 0;
  }
  char line[256];
  std::snprintf(line, sizeof line, "%zu layer and %zu link measurements of %s in %.1f s -> %s\n",
                profile.layers.size(), profile.links.size(), profile.device.c_str(), elapsed_s,
                a.output.c_str());
  std::cout << line;
  return 0;
}

int run_profile_for(const ProfileArgs& a);

int run_profile(const ProfileArgs& a) {
  if (!a.for_plan.empty()) return run_profile_for(a);
  const std::string device_text = a.device.empty() ? "cpu" : a.device;
  const auto device = executor::parse_device(device_text);
  if (!device) throw InputError("--device", "", "cpu or cuda, found \"" + device_text + "\"");
  const std::string precision_text =
      a.precision.empty() ? (*device == executor::Device::kCpu ? "fp32" : "bf16") : a.precision;
  const auto precision = profiles::parse_precision(precision_text);
  if (!precision || *precision == profiles::Precision::kFp8) {
    throw InputError("--precision", "", "bf16, fp16 or fp32, found \"" + precision_text + "\"");
  }
  if (a.output.empty()) throw InputError("-o", "", "the PROFILE.json to write");
  const auto start = std::chrono::steady_clock::now();

  profiles::Profile profile;
  profile.device = executor::device_description(*device, 0);
  profile.device_kind =
      *device == executor::Device::kCpu ? profiles::DeviceKind::kCpu : profiles::DeviceKind::kGpu;
  profile.torch_version = executor::torch_version();
  profile.created = utc_now();
  profile.precision = *precision;
  const bool progress = !a.json;
  if (a.links) {
    executor::LinkProfileOptions lo;
    for (const double bytes : a.link_bytes) {
      if (bytes > kMaxLinkBytes) {
        char found[32];
        std::snprintf(found, sizeof found, "%g", bytes);
        throw InputError(
            "--link-bytes", "",
            std::string("message sizes of at most 16 GiB (17179869184 bytes), found ") + found);
      }
    }
    if (!a.link_bytes.empty()) lo.message_bytes = a.link_bytes;
    lo.repeats = a.repeats;
    const executor::JobLinks measured = executor::profile_job_links(*device, lo, a.comm_timeout_s);
    if (measured.rank != 0) return 0;  // rank 0 writes
    profile.links = measured.links;
  } else {
    if (a.model.empty()) throw InputError("--model", "", "the model to profile");
    executor::ProfileOptions o;
    o.model = profiles::load_model(a.model);
    o.device = *device;
    o.precision = *precision;
    o.seq_len = a.seq_len;
    o.micro_batches = a.micro_batches;
    o.tp = a.tp;
    o.recompute.clear();
    for (const std::string& r : a.recompute) {
      const auto parsed = costmodel::parse_recompute(r);
      if (!parsed) throw InputError("--recompute", "", "none, selective or full, found " + r);
      o.recompute.push_back(*parsed);
    }
    o.attention = profiled_attention(a.attention, *device);
    o.threads = a.threads;
    if (o.threads.empty() && *device == executor::Device::kCpu) o.threads = {local_cpu_threads()};
    o.repeats = a.repeats;
    if (progress) o.progress = [](const std::string& line) { std::cerr << line << "\n"; };
    // Inside a launched group every rank measures at once (so each sees its neighbours' load on
    // the shared cores and memory, as the ranks of a plan will; tp = the group's size runs with
    // its all-reduces) and rank 0 writes.
    const executor::JobGroup job = executor::join_job(*device, a.comm_timeout_s, "profile");
    const int rank = job.rank;
    o.group = job.group;
    o.device_index = job.local_rank;  // one GPU per rank (NCCL), as profile_links and loom train
    if (rank != 0) o.progress = nullptr;
    profile.layers = executor::profile_layers(o);
    profile.optimizer = executor::profile_optimizer(o);
    if (rank != 0) return 0;
  }
  return write_profile(a, profile, start);
}

// Replaces this process with `loom launch --nproc ranks -- loom profile --for ...` (the same
// arguments), so that the plan's ranks measure side by side. Returns only on failure.
void relaunch(const ProfileArgs& a, int ranks) {
  namespace fs = std::filesystem;
  std::error_code error;
  const fs::path self = fs::read_symlink("/proc/self/exe", error);
  const std::string loom = error ? "loom" : (self.parent_path() / "loom").string();
  std::vector<std::string> argv_text = {loom,
                                        "launch",
                                        "--nproc",
                                        std::to_string(ranks),
                                        "--master-port",
                                        std::to_string(free_port()),
                                        "--",
                                        "loom",
                                        "profile",
                                        "--for",
                                        a.for_plan,
                                        "-o",
                                        a.output,
                                        "--repeats",
                                        std::to_string(a.repeats),
                                        "--comm-timeout",
                                        std::to_string(a.comm_timeout_s)};
  if (!a.device.empty()) argv_text.insert(argv_text.end(), {"--device", a.device});
  if (a.json) argv_text.emplace_back("--json");
  std::vector<char*> argv;
  for (std::string& text : argv_text) argv.push_back(text.data());
  argv.push_back(nullptr);
  std::cout.flush();
  ::execv(argv[0], argv.data());
  throw std::runtime_error("cannot run " + loom + ": " + std::strerror(errno));
}

// The LibTorch threads loom train gives each rank of `plan` on this machine (train_command.cpp):
// a CPU cluster's share of a node's cores, else this machine's cores shared by the local ranks;
// at most this machine's cores.
int plan_cpu_threads(const planner::Plan& plan) {
  const int cores = static_cast<int>(std::max(1U, std::thread::hardware_concurrency()));
  const int threads = plan.cluster.device.kind == profiles::DeviceKind::kCpu
                          ? costmodel::threads_per_rank(plan.cluster, plan.strategy.world_size())
                          : local_cpu_threads();
  return std::clamp(threads, 1, cores);
}

// loom profile --for PLAN.json: the plan's layer shapes at its threads per rank, its optimizer
// loop, and (several ranks) its groups' collectives at their message sizes, measured by the
// plan's ranks side by side (launched here when not inside a launched group).
int run_profile_for(const ProfileArgs& a) {
  const planner::Plan plan = planner::plan_from_json(
      profiles::parse_json_text(profiles::read_text_file(a.for_plan), a.for_plan), a.for_plan);
  if (a.output.empty()) throw InputError("-o", "", "the PROFILE.json to write");
  if (plan.job.precision == profiles::Precision::kFp8) {
    throw InputError(a.for_plan, "$.job.precision",
                     "a precision the executor runs (bf16, fp16, tf32 or fp32): it has no fp8 "
                     "products to measure");
  }
  const costmodel::Strategy& s = plan.strategy;
  const int world = s.world_size();
  const bool gpu_plan = plan.cluster.device.kind == profiles::DeviceKind::kGpu;
  const std::string device_text = a.device.empty() ? (gpu_plan ? "cuda" : "cpu") : a.device;
  const auto device = executor::parse_device(device_text);
  if (!device) throw InputError("--device", "", "cpu or cuda, found \"" + device_text + "\"");
  const executor::RankEnvironment env = executor::process_rank_environment();
  if (world > 1 && env.world_size == 1) {
    if (plan.cluster.nodes > 1) {
      throw InputError("--for", "",
                       "a launched group of the plan's " + std::to_string(world) +
                           " ranks for a plan over several nodes (loom launch or srun on every "
                           "node), found one process");
    }
    relaunch(a, world);
  }
  if (env.world_size != world) {
    throw InputError("--for", "",
                     "a group of the plan's " + std::to_string(world) + " ranks, found " +
                         std::to_string(env.world_size) + " (" + env.source + ")");
  }
  const auto start = std::chrono::steady_clock::now();
  const planner::PlanPoints points = planner::plan_points(plan);

  profiles::Profile profile;
  profile.device = executor::device_description(*device, 0);
  profile.device_kind =
      *device == executor::Device::kCpu ? profiles::DeviceKind::kCpu : profiles::DeviceKind::kGpu;
  profile.torch_version = executor::torch_version();
  profile.created = utc_now();
  profile.precision = plan.job.precision;

  executor::ProfileOptions o;
  o.model = plan.model;
  o.device = *device;
  o.precision = plan.job.precision;
  o.seq_len = plan.job.seq_len;
  o.micro_batches = {s.micro_batch};
  o.tp = {s.tp};
  o.recompute = {s.recompute};
  // A chunk that recomputes only its first layers also runs plain ones.
  if (costmodel::recomputes_part(s, plan.model.layers)) {
    o.recompute.push_back(costmodel::Recompute::kNone);
  }
  o.attention = profiled_attention(costmodel::to_string(s.attention), *device);
  o.threads = {plan_cpu_threads(plan)};
  o.optimizer_loops = {points.flat};
  o.repeats = a.repeats;
  const executor::JobGroup job = executor::join_job(*device, a.comm_timeout_s, "profile");
  o.group = job.group;
  o.device_index = job.local_rank;
  if (!a.json && job.rank == 0) {
    o.progress = [](const std::string& line) { std::cerr << line << "\n"; };
  }
  profile.layers = executor::profile_layers(o);
  profile.optimizer = executor::profile_optimizer(o);
  if (job.group != nullptr && !points.links.empty()) {
    executor::LinkProfileOptions lo;
    lo.message_bytes.clear();
    lo.loaded_message_bytes.clear();
    lo.collectives.clear();
    for (const costmodel::LinkQuery& q : points.links) {
      if (std::find(lo.message_bytes.begin(), lo.message_bytes.end(), q.bytes) ==
          lo.message_bytes.end()) {
        lo.message_bytes.push_back(q.bytes);
      }
      const std::string name = costmodel::profile_name(q.collective);
      if (std::find(lo.collectives.begin(), lo.collectives.end(), name) == lo.collectives.end()) {
        lo.collectives.push_back(name);
      }
      // A pipeline's messages between computing ranks (CPU): what sets p2p's factor there.
      if (q.collective == costmodel::Collective::kP2p && *device == executor::Device::kCpu) {
        lo.loaded_message_bytes.push_back(q.bytes);
      }
    }
    std::sort(lo.message_bytes.begin(), lo.message_bytes.end());
    lo.repeats = a.repeats;
    lo.scope = job.one_node ? "intra_node" : "inter_node";
    profile.links = executor::profile_links(*job.group, *device, job.local_rank, lo);
  }
  if (job.rank != 0) return 0;
  return write_profile(a, profile, start);
}

}  // namespace

Runner add_profile_command(CLI::App& app) {
  auto args = std::make_shared<ProfileArgs>();
  CLI::App* cmd = add_subcommand(app, "profile");
  CLI::Option* model =
      cmd->add_option("--model", args->model, "built-in name, loom-model JSON or HF config.json");
  CLI::Option* for_plan = cmd->add_option(
      "--for", args->for_plan,
      "PLAN.json (loom plan -o): measure exactly the points this plan's prediction uses");
  cmd->add_option("--device", args->device,
                  "cpu | cuda (default cpu; with --for the plan's: cuda for a GPU cluster)");
  CLI::Option* precision = cmd->add_option("--precision", args->precision,
                                           "fp32 on cpu; bf16 (default) | fp16 | fp32 on cuda");
  CLI::Option* seq_len =
      cmd->add_option("--seq-len", args->seq_len, "tokens per sample (default 128)")
          ->check(kPositiveNumber);
  CLI::Option* micro_batch =
      cmd->add_option("--micro-batch", args->micro_batches, "micro-batch sizes (default 1 2 4 8)")
          ->check(kPositiveNumber);
  CLI::Option* tp =
      cmd->add_option("--tp", args->tp, "tensor-parallel degrees to measure a shard of (default 1)")
          ->check(kPositiveNumber);
  CLI::Option* recompute =
      cmd->add_option("--recompute", args->recompute,
                      "recomputation variants of the transformer layer (default none)")
          ->check(CLI::IsMember({"none", "selective", "full"}));
  CLI::Option* attention = cmd->add_option(
      "--attention", args->attention,
      "attention core of the transformer layers: flash | math (default: flash on cuda, math on "
      "cpu, as loom train runs them)");
  CLI::Option* threads =
      cmd->add_option(
             "--threads", args->threads,
             "CPU thread counts to measure with (default: this machine's cores shared by the "
             "launched ranks on it, as loom train runs them)")
          ->check(kPositiveNumber);
  cmd->add_option("--repeats", args->repeats,
                  "timed runs per point, after 2 warm-up runs (default 10)")
      ->check(kPositiveNumber);
  CLI::Option* links =
      cmd->add_flag("--links", args->links,
                    "measure collectives between the ranks of a launched group instead of layers");
  CLI::Option* link_bytes =
      cmd->add_option("--link-bytes", args->link_bytes, "message sizes for --links")
          ->check(kPositiveNumber);
  cmd->add_option("--comm-timeout", args->comm_timeout_s,
                  "seconds a collective may wait for a peer (default 300)")
      ->check(kPositiveNumber);
  cmd->add_option("-o", args->output, "PROFILE.json to write")->required();
  cmd->add_flag("--json", args->json, "print the profile instead of a summary");
  // The plan says what to measure.
  for (CLI::Option* what : {model, precision, seq_len, micro_batch, tp, recompute, attention,
                            threads, links, link_bytes}) {
    for_plan->excludes(what);
  }
  return [args]() { return run_profile(*args); };
}

}  // namespace loom::tools
