// loom profile: measures the model's layers on this device, or with --links the collectives
// between the ranks of a launched group, and writes loom-profile/1 (spec/cli.md, formats.md).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "executor/profiler.hpp"
#include "profiles/errors.hpp"
#include "profiles/loader.hpp"
#include "profiles/profile.hpp"
#include "tools/commands.hpp"

namespace loom::tools {

namespace {

constexpr double kMaxLinkBytes = 17179869184.0;  // 16 GiB: --link-bytes' largest message

struct ProfileArgs {
  std::string model;
  std::string device = "cpu";
  std::string precision;
  std::int64_t seq_len = 128;
  std::vector<std::int64_t> micro_batches = {1, 2, 4, 8};
  std::vector<int> tp = {1};
  std::vector<std::string> recompute = {"none"};
  std::vector<int> threads;
  int repeats = 10;
  bool links = false;
  std::vector<double> link_bytes;
  double comm_timeout_s = 300;
  std::string output;
  bool json = false;
};

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
}

int run_profile(const ProfileArgs& a) {
  const auto device = executor::parse_device(a.device);
  if (!device) throw InputError("--device", "", "cpu or cuda, found \"" + a.device + "\"");
  const std::string precision_text =
      a.precision.empty() ? (*device == executor::Device::kCpu ? "fp32" : "bf16") : a.precision;
  const auto precision = profiles::parse_precision(precision_text);
  if (!precision) {
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

}  // namespace

Runner add_profile_command(CLI::App& app) {
  auto args = std::make_shared<ProfileArgs>();
  CLI::App* cmd = add_subcommand(app, "profile");
  cmd->add_option("--model", args->model, "built-in name, loom-model JSON or HF config.json");
  cmd->add_option("--device", args->device, "cpu | cuda (default cpu)");
  cmd->add_option("--precision", args->precision,
                  "fp32 on cpu; bf16 (default) | fp16 | fp32 on cuda");
  cmd->add_option("--seq-len", args->seq_len, "tokens per sample (default 128)")
      ->check(kPositiveNumber);
  cmd->add_option("--micro-batch", args->micro_batches, "micro-batch sizes (default 1 2 4 8)")
      ->check(kPositiveNumber);
  cmd->add_option("--tp", args->tp, "tensor-parallel degrees to measure a shard of (default 1)")
      ->check(kPositiveNumber);
  cmd->add_option("--recompute", args->recompute,
                  "recomputation variants of the transformer layer (default none)")
      ->check(CLI::IsMember({"none", "selective", "full"}));
  cmd->add_option("--threads", args->threads,
                  "CPU thread counts to measure with (default: this machine's cores shared by the "
                  "launched ranks on it, as loom train runs them)")
      ->check(kPositiveNumber);
  cmd->add_option("--repeats", args->repeats,
                  "timed runs per point, after 2 warm-up runs (default 10)")
      ->check(kPositiveNumber);
  cmd->add_flag("--links", args->links,
                "measure collectives between the ranks of a launched group instead of layers");
  cmd->add_option("--link-bytes", args->link_bytes, "message sizes for --links")
      ->check(kPositiveNumber);
  cmd->add_option("--comm-timeout", args->comm_timeout_s,
                  "seconds a collective may wait for a peer (default 300)")
      ->check(kPositiveNumber);
  cmd->add_option("-o", args->output, "PROFILE.json to write")->required();
  cmd->add_flag("--json", args->json, "print the profile instead of a summary");
  return [args]() { return run_profile(*args); };
}

}  // namespace loom::tools
