#include "tools/cli.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <set>
#include <string>
#include <thread>

#include "profiles/errors.hpp"

namespace loom::tools {

namespace fs = std::filesystem;

namespace {

// Replaces this process with `sibling` (next to this binary) run with the same argv; returns only
// when that failed, with the error to print.
std::string exec_sibling(const std::string& sibling, char** argv) {
  std::error_code error;
  const fs::path self = fs::read_symlink("/proc/self/exe", error);
  const fs::path path = error ? fs::path(sibling) : self.parent_path() / sibling;
  ::execv(path.c_str(), argv);
  return "cannot run " + path.string() + ": " + std::strerror(errno) + " (loom " + argv[1] +
         " is built into " + sibling + ", which must be in the same folder as " +
         (error ? std::string("loom") : self.filename().string()) + ")";
}

}  // namespace

bool prefer_passive_openmp_waits(int argc, char** argv) {
  if (argc < 2) return false;
  const std::string sub = argv[1];
  if (sub != "train" && sub != "profile") return false;
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr) {
    return false;
  }
  const char* threads = std::getenv("OMP_NUM_THREADS");
  if (threads != nullptr && std::string(threads) == "1") return false;
  ::setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
  return true;
}

int run_command_line(int argc, char** argv, const std::map<std::string, CommandAdder>& here,
                     const std::string& sibling) {
  std::string sub = argc > 1 ? argv[1] : "";
  const bool known = std::any_of(kCommands.begin(), kCommands.end(),
                                 [&](const CommandInfo& c) { return sub == c.name; });
  if (known && here.count(sub) == 0) {
    prefer_passive_openmp_waits(argc, argv);  // for the binary that computes, before it loads
    const std::string error = exec_sibling(sibling, argv);  // returns only when it failed
    std::cerr << "loom " << sub << ": error: " << one_line(error) << "\n";
    return 1;
  }
  CLI::App app{"loom: plans, simulates and runs parallel training of transformer models", "loom"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "loom 0.1.0");
  std::map<std::string, Runner> runners;
  for (const CommandInfo& c : kCommands) {
    const auto adder = here.find(c.name);
    if (adder != here.end()) {
      runners[c.name] = adder->second(app);
    } else {
      add_subcommand(app, c.name);  // listed by --help; run by the sibling binary
    }
  }
  if (!known) sub = "";
  auto prefix = [&]() { return sub.empty() ? std::string("loom") : "loom " + sub; };
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << (sub.empty() ? app.help() : app.get_subcommand(sub)->help());
    return 0;
  } catch (const CLI::CallForVersion&) {
    std::cout << "loom 0.1.0\n";
    return 0;
  } catch (const CLI::ParseError& e) {
    if (sub.empty() && argc > 1 && argv[1][0] != '-') {
      // CLI11 says only "A subcommand is required": name the word it did not know.
      std::set<std::string> names;
      for (const CommandInfo& c : kCommands) names.insert(c.name);
      std::string list;
      for (const std::string& name : names) list += (list.empty() ? "" : ", ") + name;
      std::cerr << "loom: error: \"" << argv[1] << "\" is not a subcommand: expected one of "
                << list << " (see loom --help)\n";
      return 2;
    }
    std::cerr << prefix() << ": error: " << one_line(e.what()) << " (see " << prefix()
              << " --help)\n";
    return 2;
  }
  for (CLI::App* s : app.get_subcommands()) sub = s->get_name();
  try {
    return runners.at(sub)();
  } catch (const loom::InputError& e) {
    std::cerr << prefix() << ": error: " << one_line(e.what()) << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << prefix() << ": error: " << one_line(e.what()) << "\n";
    return 1;
  }
}

std::string self_executable() {
  std::error_code error;
  const fs::path self = fs::read_symlink("/proc/self/exe", error);
  return error ? std::string("loom") : self.string();
}

int local_cpu_threads() {
  const int cores = static_cast<int>(std::max(1U, std::thread::hardware_concurrency()));
  const char* local = std::getenv("LOCAL_WORLD_SIZE");
  const int local_ranks = std::max(1, local != nullptr ? std::atoi(local) : 1);
  return std::max(1, cores / local_ranks);
}

}  // namespace loom::tools
