#include "tools/cli.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

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

// Levenshtein distance between `a` and `b` (insertions, deletions, substitutions).
std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// The first long option of argv[2..] (up to a bare "--", after which come another command's
// arguments) that `cmd` does not know, as "unknown option --x; did you mean --y?" naming the
// nearest known one. Checked before parsing, so that a misspelt flag is named instead of the
// required flag it failed to set.
std::optional<std::string> unknown_option(const CLI::App& cmd, const CLI::App& top, int argc,
                                          char** argv) {
  std::vector<std::string> known;
  for (const CLI::App* app : {&cmd, &top}) {
    for (const CLI::Option* o : app->get_options()) {
      for (const std::string& name : o->get_lnames()) known.push_back("--" + name);
    }
  }
  for (int i = 2; i < argc; ++i) {
    const std::string token = argv[i];
    if (token == "--") break;
    if (token.size() < 3 || token.rfind("--", 0) != 0) continue;
    const std::string name = token.substr(0, token.find('='));
    if (std::find(known.begin(), known.end(), name) != known.end()) continue;
    std::string nearest;
    std::size_t best = std::string::npos;
    for (const std::string& k : known) {
      const std::size_t d = edit_distance(name, k);
      if (d < best) {
        best = d;
        nearest = k;
      }
    }
    std::string text = "unknown option " + name;
    // A suggestion only when it is close: at most a third of the name's letters differ.
    if (!nearest.empty() && best <= std::max<std::size_t>(2, (name.size() - 2) / 3)) {
      text += "; did you mean " + nearest + "?";
    }
    return text;
  }
  return std::nullopt;
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
  if (known) {
    if (auto unknown = unknown_option(*app.get_subcommand(sub), app, argc, argv)) {
      std::cerr << prefix() << ": error: " << *unknown << " (see " << prefix() << " --help)\n";
      return 2;
    }
  }
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
