// loom launch: the N local ranks of one command on this node (docs/README.md), and loom slurm: an
// sbatch script that runs a plan with srun.
//
// launch takes torchrun's flags: --nproc ranks on each of --nnodes nodes, this one being
// --node-rank, all meeting at --master-addr:--master-port (node 0 hosts the rendezvous). It forks
// the node's ranks with RANK = node_rank * nproc + local rank, WORLD_SIZE = nnodes * nproc,
// LOCAL_RANK, LOCAL_WORLD_SIZE = nproc, MASTER_ADDR and MASTER_PORT set, prefixes every line they
// print with "[rank RANK] " (stdout to stdout, stderr to stderr), and as soon as one exits
// unsuccessfully stops the others (SIGTERM, SIGKILL after 5 s) and fails naming that rank. A
// command starting with `loom` runs this very binary. Run it once on every node.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "executor/cuda_build.hpp"
#include "planner/plan.hpp"
#include "profiles/errors.hpp"
#include "profiles/json_reader.hpp"
#include "profiles/loader.hpp"
#include "tools/commands.hpp"

namespace loom::tools {

namespace {

constexpr int kMaxLocalRanks = 1024;

// Whether this build's loom-torch trains on cuda (a CUDA LibTorch): tools/CMakeLists.txt defines
// LOOM_BUILD_CUDA from the condition that defines executor's LOOM_TORCH_CUDA, since this binary
// never links LibTorch to ask it.
#if defined(LOOM_BUILD_CUDA) && LOOM_BUILD_CUDA
constexpr bool kBuiltWithCuda = true;
#else
constexpr bool kBuiltWithCuda = false;
#endif

namespace fs = std::filesystem;

struct LaunchArgs {
  int nproc = 1;  // ranks on this node
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::vector<std::string> command;
};

struct Child {
  pid_t pid = -1;
  int out = -1;  // read ends of the child's stdout and stderr
  int err = -1;
  std::string out_partial;
  std::string err_partial;
  bool exited = false;
  int status = 0;
};

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "was killed by signal " + std::to_string(WTERMSIG(status));
  return "stopped";
}

void write_all(int fd, const std::string& text) {
  const char* data = text.data();
  std::size_t left = text.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, data, left);
    if (n <= 0) return;
    data += n;
    left -= static_cast<std::size_t>(n);
  }
}

// Writes the complete lines of `partial` to `fd` with the rank prefix, keeping the rest.
void flush_lines(std::string& partial, int rank, int fd, bool all) {
  std::size_t start = 0;
  for (std::size_t nl = partial.find('\n'); nl != std::string::npos;
       nl = partial.find('\n', start)) {
    write_all(fd, "[rank " + std::to_string(rank) + "] " + partial.substr(start, nl - start + 1));
    start = nl + 1;
  }
  partial.erase(0, start);
  if (all && !partial.empty()) {
    write_all(fd, "[rank " + std::to_string(rank) + "] " + partial + "\n");
    partial.clear();
  }
}

// Starts local rank `local_rank` of this node.
Child spawn(const std::vector<std::string>& command, int local_rank, const LaunchArgs& a) {
  int out[2];
  int err[2];
  if (pipe(out) != 0 || pipe(err) != 0) throw std::runtime_error("pipe failed");
  std::vector<std::string> argv_text = command;
  if (argv_text[0] == "loom") argv_text[0] = self_executable();
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error(std::string("fork failed: ") + std::strerror(errno));
  if (pid == 0) {
    dup2(out[1], STDOUT_FILENO);
    dup2(err[1], STDERR_FILENO);
    close(out[0]);
    close(out[1]);
    close(err[0]);
    close(err[1]);
    setenv("RANK", std::to_string(a.node_rank * a.nproc + local_rank).c_str(), 1);
    setenv("WORLD_SIZE", std::to_string(a.nnodes * a.nproc).c_str(), 1);
    setenv("LOCAL_RANK", std::to_string(local_rank).c_str(), 1);
    setenv("LOCAL_WORLD_SIZE", std::to_string(a.nproc).c_str(), 1);
    setenv("MASTER_ADDR", a.master_addr.c_str(), 1);
    setenv("MASTER_PORT", std::to_string(a.master_port).c_str(), 1);
    std::vector<char*> argv;
    argv.reserve(argv_text.size() + 1);
    for (std::string& s : argv_text) argv.push_back(s.data());
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    const std::string message =
        "loom launch: error: cannot run " + argv_text[0] + ": " + std::strerror(errno) + "\n";
    write_all(STDERR_FILENO, message);
    _exit(127);
  }
  close(out[1]);
  close(err[1]);
  Child child;
  child.pid = pid;
  child.out = out[0];
  child.err = err[0];
  return child;
}

// The signal loom launch received (SIGINT/SIGTERM), for the loop to forward to every rank. A
// signal handler can reach nothing but a global.
std::atomic<int> launch_signal{0};  // NOLINT(cppcoreguidelines-avoid-non-const-global-variables)
void on_launch_signal(int signal_number) { launch_signal.store(signal_number); }

int run_launch(const LaunchArgs& a) {
  if (a.command.empty()) {
    throw InputError("loom launch", "", "a command after --, e.g. -- loom train PLAN.json ...");
  }
  if (a.nproc < 1) throw InputError("--nproc", "", "a positive number of ranks");
  if (a.nnodes < 1) throw InputError("--nnodes", "", "a positive number of nodes");
  if (static_cast<std::int64_t>(a.nnodes) * a.nproc > std::numeric_limits<int>::max()) {
    throw InputError("--nnodes", "", "nnodes * nproc ranks that a rank number can count");
  }
  if (a.node_rank < 0 || a.node_rank >= a.nnodes) {
    throw InputError("--node-rank", "",
                     "a node rank from 0 to --nnodes - 1 = " + std::to_string(a.nnodes - 1) +
                         ", found " + std::to_string(a.node_rank));
  }
  if (a.master_addr.empty()) throw InputError("--master-addr", "", "a host name or address");
  // Local ranks share this machine: more than a thousand is a typo, not a job.
  if (a.nproc > kMaxLocalRanks) {
    throw InputError("--nproc", "",
                     "at most " + std::to_string(kMaxLocalRanks) + " local ranks, found " +
                         std::to_string(a.nproc));
  }
  // SIGINT/SIGTERM go to every rank, which stop at a step boundary (loom train); launch waits
  // for them and exits with 128 + the signal.
  struct sigaction action {};
  action.sa_handler = on_launch_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  int forwarded = 0;
  std::vector<Child> children;
  children.reserve(static_cast<std::size_t>(a.nproc));
  for (int r = 0; r < a.nproc; ++r) children.push_back(spawn(a.command, r, a));
  const int first_rank = a.node_rank * a.nproc;  // the global rank of local rank 0

  int first_failed = -1;
  std::string first_status;
  std::chrono::steady_clock::time_point stop_sent{};
  bool killed = false;
  auto stop_others = [&]() {
    for (Child& c : children) {
      if (!c.exited) kill(c.pid, SIGTERM);
    }
    stop_sent = std::chrono::steady_clock::now();
  };

  while (true) {
    std::vector<pollfd> fds;
    std::vector<std::pair<int, bool>> owners;  // (rank, is stderr)
    for (std::size_t r = 0; r < children.size(); ++r) {
      if (children[r].out >= 0) {
        fds.push_back({children[r].out, POLLIN, 0});
        owners.emplace_back(static_cast<int>(r), false);
      }
      if (children[r].err >= 0) {
        fds.push_back({children[r].err, POLLIN, 0});
        owners.emplace_back(static_cast<int>(r), true);
      }
    }
    if (const int sig = launch_signal.load(); sig != 0 && forwarded == 0) {
      forwarded = sig;
      for (Child& c : children) {
        if (!c.exited) kill(c.pid, sig);
      }
    }
    bool all_exited = true;
    for (const Child& c : children) all_exited = all_exited && c.exited;
    if (fds.empty() && all_exited) break;
    if (!fds.empty()) poll(fds.data(), fds.size(), 100);
    for (std::size_t i = 0; i < fds.size(); ++i) {
      if ((fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      Child& c = children[static_cast<std::size_t>(owners[i].first)];
      const bool is_err = owners[i].second;
      char buffer[4096];
      const ssize_t n = read(fds[i].fd, buffer, sizeof buffer);
      std::string& partial = is_err ? c.err_partial : c.out_partial;
      const int target = is_err ? STDERR_FILENO : STDOUT_FILENO;
      if (n > 0) {
        partial.append(buffer, static_cast<std::size_t>(n));
        flush_lines(partial, first_rank + owners[i].first, target, false);
      } else {
        flush_lines(partial, first_rank + owners[i].first, target, true);
        close(fds[i].fd);
        (is_err ? c.err : c.out) = -1;
      }
    }
    for (std::size_t r = 0; r < children.size(); ++r) {
      Child& c = children[r];
      if (c.exited) continue;
      int status = 0;
      if (waitpid(c.pid, &status, WNOHANG) == c.pid) {
        c.exited = true;
        c.status = status;
        // A rank that stopped on the forwarded signal (exit 128 + signal) did what was asked.
        const bool ok =
            WIFEXITED(status) && (WEXITSTATUS(status) == 0 ||
                                  (forwarded != 0 && WEXITSTATUS(status) == 128 + forwarded));
        if (!ok && first_failed < 0) {
          first_failed = first_rank + static_cast<int>(r);
          first_status = describe_status(status);
          stop_others();
        }
      }
    }
    if (first_failed >= 0 && !killed &&
        std::chrono::steady_clock::now() - stop_sent > std::chrono::seconds(5)) {
      for (Child& c : children) {
        if (!c.exited) kill(c.pid, SIGKILL);
      }
      killed = true;
    }
  }
  if (first_failed >= 0) {
    throw std::runtime_error("rank " + std::to_string(first_failed) + " " + first_status +
                             " (the first to fail); stopped the other ranks");
  }
  if (forwarded != 0) {
    std::cerr << "loom launch: stopped by signal " << forwarded
              << ": every rank stopped at a step boundary\n";
    return 128 + forwarded;
  }
  return 0;
}

// ---------------------------------------------------------------------------------------------
// loom slurm

struct SlurmArgs {
  std::string plan;
  std::string partition;
  std::string time;
  int cpus_per_task = 0;  // 0: Slurm's default
  std::string output;
  std::vector<std::string> train_args;
};

std::string shell_quote(const std::string& text) {
  std::string out = "'";
  for (char c : text) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

int run_slurm(const SlurmArgs& a) {
  const planner::Plan plan = planner::plan_from_json(
      profiles::parse_json_text(profiles::read_text_file(a.plan), a.plan), a.plan);
  if (!a.time.empty()) {
    const bool shaped = a.time.size() >= 8 && a.time[a.time.size() - 3] == ':' &&
                        a.time[a.time.size() - 6] == ':' &&
                        a.time.find_first_not_of("0123456789:-") == std::string::npos;
    // Minutes and seconds below 60 (the hours are free, as Slurm's HH:MM:SS).
    auto below_60 = [&](std::size_t at) {
      const char tens = a.time[at];
      return tens >= '0' && tens <= '5' && a.time[at + 1] >= '0' && a.time[at + 1] <= '9';
    };
    const bool in_range = shaped && below_60(a.time.size() - 5) && below_60(a.time.size() - 2);
    if (!in_range) {
      throw InputError(
          "--time", "",
          "HH:MM:SS (or D-HH:MM:SS) with minutes and seconds below 60, found " + a.time);
    }
  }
  // Nodes and tasks per node from the ranks' devices ("node3/gpu1").
  std::map<std::string, int> per_node;
  for (const planner::RankPlacement& r : plan.ranks) {
    const std::size_t slash = r.device.find('/');
    ++per_node[slash == std::string::npos ? r.device : r.device.substr(0, slash)];
  }
  int tasks_per_node = 0;
  for (const auto& [node, count] : per_node) tasks_per_node = std::max(tasks_per_node, count);
  const bool gpu = plan.cluster.device.kind == profiles::DeviceKind::kGpu;
  const std::string plan_path = fs::absolute(a.plan).string();

  std::string s;
  s += "#!/bin/bash\n";
  s += "# Written by loom slurm for " + plan_path + "\n";
  s += "# dp=" + std::to_string(plan.strategy.dp) + " tp=" + std::to_string(plan.strategy.tp) +
       " pp=" + std::to_string(plan.strategy.pp) + " zero=" + std::to_string(plan.strategy.zero) +
       ": " + std::to_string(plan.ranks.size()) + " ranks.\n";
  s += "#SBATCH --job-name=loom-" + plan.model.name + "\n";
  s += "#SBATCH --nodes=" + std::to_string(per_node.size()) + "\n";
  s += "#SBATCH --ntasks=" + std::to_string(plan.ranks.size()) + "\n";
  s += "#SBATCH --ntasks-per-node=" + std::to_string(tasks_per_node) + "\n";
  if (gpu) s += "#SBATCH --gpus-per-node=" + std::to_string(tasks_per_node) + "\n";
  if (!a.partition.empty()) s += "#SBATCH --partition=" + a.partition + "\n";
  if (!a.time.empty()) s += "#SBATCH --time=" + a.time + "\n";
  if (a.cpus_per_task > 0) s += "#SBATCH --cpus-per-task=" + std::to_string(a.cpus_per_task) + "\n";
  s += "set -euo pipefail\n";
  s += "# loom train takes rank and world from SLURM_PROCID / SLURM_NTASKS and the master from\n";
  s += "# the first host of SLURM_JOB_NODELIST.\n";
  s += "export MASTER_PORT=${MASTER_PORT:-29500}\n";
  s += "LOOM=${LOOM:-" + shell_quote(self_executable()) + "}\n";
  s += "srun \"$LOOM\" train " + shell_quote(plan_path);
  for (const std::string& arg : a.train_args) s += " " + shell_quote(arg);
  // The device loom train will use: --device among the arguments, else the plan's.
  std::string device = gpu ? "cuda" : "cpu";
  for (std::size_t i = 0; i + 1 < a.train_args.size(); ++i) {
    if (a.train_args[i] == "--device") device = a.train_args[i + 1];
  }
  for (const std::string& arg : a.train_args) {
    if (arg.rfind("--device=", 0) == 0) device = arg.substr(9);
  }
  if (gpu && device == "cuda" &&
      std::none_of(a.train_args.begin(), a.train_args.end(),
                   [](const std::string& arg) { return arg.rfind("--device", 0) == 0; })) {
    s += " --device cuda";
  }
  s += " \"$@\"\n";
  profiles::write_file_atomically(a.output, s);
  fs::permissions(a.output, fs::perms::owner_exec | fs::perms::group_exec | fs::perms::others_exec,
                  fs::perm_options::add);
  if (device == "cuda" && !kBuiltWithCuda) {
    std::cerr << "loom slurm: warning: the plan trains on cuda, but the loom this script runs ("
              << self_executable() << ") is a CPU build: build Loom for GPUs with "
              << executor::kCudaBuildHint
              << " and set LOOM to it when you submit, or add --device cpu after -- to train on "
                 "CPUs\n";
  }
  std::cout << "wrote " << a.output << ": " << per_node.size() << " node(s) x " << tasks_per_node
            << " task(s); submit with sbatch " << a.output << "\n";
  return 0;
}

}  // namespace

Runner add_launch_command(CLI::App& app) {
  auto args = std::make_shared<LaunchArgs>();
  CLI::App* cmd = add_subcommand(app, "launch");
  cmd->add_option("--nproc", args->nproc, "number of ranks on this node")
      ->required()
      ->check(kPositiveNumber);
  cmd->add_option("--nnodes", args->nnodes, "number of nodes, each running loom launch (default 1)")
      ->check(kPositiveNumber);
  cmd->add_option("--node-rank", args->node_rank, "this node's rank, 0 to nnodes - 1 (default 0)")
      ->check(kNonNegativeNumber);
  cmd->add_option("--master-addr", args->master_addr,
                  "node 0's address, where the ranks meet (default 127.0.0.1)");
  cmd->add_option("--master-port", args->master_port, "rendezvous port (default 29500)")
      ->check(CLI::Range(1, 65535));
  cmd->add_option("command", args->command, "the command after --")->required();
  return [args]() { return run_launch(*args); };
}

Runner add_slurm_command(CLI::App& app) {
  auto args = std::make_shared<SlurmArgs>();
  CLI::App* cmd = add_subcommand(app, "slurm");
  cmd->add_option("plan", args->plan, "PLAN.json (loom-plan/1)")->required();
  cmd->add_option("--partition", args->partition, "Slurm partition");
  cmd->add_option("--time", args->time, "time limit HH:MM:SS");
  cmd->add_option("--cpus-per-task", args->cpus_per_task,
                  "CPU cores per rank (#SBATCH --cpus-per-task; default: Slurm's)")
      ->check(kPositiveNumber);
  cmd->add_option("-o,--output", args->output, "JOB.sh to write")->required();
  cmd->add_option("train_args", args->train_args,
                  "arguments for loom train after --, e.g. -- --data synthetic --steps 100");
  return [args]() { return run_slurm(*args); };
}

}  // namespace loom::tools
