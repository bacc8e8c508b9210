// The rank environment of distributed.hpp ("Where this process is"): torchrun's and Slurm's
// variables, Slurm host lists and the groups' options for a job.
#include <cstdlib>
#include <string>
#include <vector>

#include "executor/distributed.hpp"
#include "profiles/errors.hpp"

namespace loom::executor {

namespace {

int parse_count(const std::string& name, const std::string& text) {
  std::size_t used = 0;
  long value = -1;
  try {
    value = std::stol(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (text.empty() || used != text.size() || value < 0 || value > 1'000'000) {
    throw InputError("environment variable " + name, "",
                     "a non-negative integer, found \"" + text + "\"");
  }
  return static_cast<int>(value);
}

}  // namespace

std::vector<std::string> expand_nodelist(const std::string& nodelist) {
  std::vector<std::string> hosts;
  const std::string source = "SLURM_JOB_NODELIST";
  std::size_t i = 0;
  while (i < nodelist.size()) {
    // One entry: prefix[ranges]suffix up to a comma outside brackets.
    std::size_t end = i;
    int depth = 0;
    while (end < nodelist.size() && (nodelist[end] != ',' || depth > 0)) {
      if (nodelist[end] == '[') ++depth;
      if (nodelist[end] == ']') --depth;
      if (depth < 0 || depth > 1) throw InputError(source, nodelist, "balanced [ ] brackets");
      ++end;
    }
    if (depth != 0) throw InputError(source, nodelist, "balanced [ ] brackets");
    const std::string entry = nodelist.substr(i, end - i);
    i = end + 1;
    if (entry.empty()) continue;
    const std::size_t open = entry.find('[');
    if (open == std::string::npos) {
      hosts.push_back(entry);
      continue;
    }
    const std::size_t close = entry.find(']', open);
    const std::string prefix = entry.substr(0, open);
    const std::string suffix = entry.substr(close + 1);
    std::stringstream ranges(entry.substr(open + 1, close - open - 1));
    for (std::string range; std::getline(ranges, range, ',');) {
      const std::size_t dash = range.find('-');
      const std::string first = range.substr(0, dash);
      const std::string last = dash == std::string::npos ? first : range.substr(dash + 1);
      const bool digits =
          !first.empty() && !last.empty() &&
          std::all_of(first.begin(), first.end(), [](char c) { return c >= '0' && c <= '9'; }) &&
          std::all_of(last.begin(), last.end(), [](char c) { return c >= '0' && c <= '9'; });
      if (!digits || std::stol(first) > std::stol(last)) {
        throw InputError(source, nodelist, "ranges like 01-04, found \"" + range + "\"");
      }
      for (long n = std::stol(first); n <= std::stol(last); ++n) {
        std::string number = std::to_string(n);
        if (number.size() < first.size()) number.insert(0, first.size() - number.size(), '0');
        hosts.push_back(prefix + number + suffix);
      }
    }
  }
  return hosts;
}

RankEnvironment rank_environment(const EnvLookup& lookup) {
  RankEnvironment env;
  auto count = [&](const std::string& name) -> std::optional<int> {
    const std::optional<std::string> value = lookup(name);
    if (!value) return std::nullopt;
    return parse_count(name, *value);
  };
  if (auto world = count("WORLD_SIZE")) {
    env.world_size = *world;
    env.rank = count("RANK").value_or(0);
    env.local_rank = count("LOCAL_RANK").value_or(env.rank);
    env.source = "RANK/WORLD_SIZE";
  } else if (auto tasks = count("SLURM_NTASKS")) {
    env.world_size = *tasks;
    env.rank = count("SLURM_PROCID").value_or(0);
    env.local_rank = count("SLURM_LOCALID").value_or(0);
    env.source = "SLURM_PROCID/SLURM_NTASKS";
    if (auto nodes = lookup("SLURM_JOB_NODELIST")) {
      const std::vector<std::string> hosts = expand_nodelist(*nodes);
      if (!hosts.empty()) env.master_addr = hosts.front();
    }
  }
  if (auto addr = lookup("MASTER_ADDR")) env.master_addr = *addr;
  if (auto port = count("MASTER_PORT")) {
    if (*port < 1 || *port > 65535) {
      throw InputError("environment variable MASTER_PORT", "", "a port in [1, 65535]");
    }
    env.master_port = *port;
  }
  if (auto ifname = lookup("GLOO_SOCKET_IFNAME")) env.gloo_interface = *ifname;
  if (env.world_size < 1 || env.rank >= env.world_size) {
    throw InputError(env.source, "",
                     "0 <= rank < world size, found rank " + std::to_string(env.rank) + " of " +
                         std::to_string(env.world_size));
  }
  return env;
}

RankEnvironment process_rank_environment() {
  return rank_environment([](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    return value != nullptr ? std::optional<std::string>(value) : std::nullopt;
  });
}

GroupOptions job_group_options(const RankEnvironment& environment, bool cuda,
                               std::chrono::milliseconds timeout, bool cuda_over_gloo) {
  GroupOptions options;
  options.timeout = timeout;
  options.interface = environment.gloo_interface;
  const bool local =
      environment.master_addr == "127.0.0.1" || environment.master_addr == "localhost";
  options.host = local ? "127.0.0.1" : "";
  if (cuda && cuda_over_gloo) {
    options.host_staging = true;
  } else if (cuda) {
    options.backend = CommBackend::kNccl;
    options.device_index = environment.local_rank;
  }
  return options;
}

}  // namespace loom::executor
