// Shared by the command-line tests: a temporary folder per test and a way to run the `loom`
// binary in it with stdout and stderr captured apart.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "tools/ports.hpp"

namespace loom::test {

struct CliResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// A rendezvous port for a test's ranks, as a decimal string (tools/ports.hpp).
inline std::string free_port() { return std::to_string(loom::tools::free_port()); }

inline std::string read_all(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// `s` as one single-quoted shell word.
inline std::string shell_quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

inline std::size_t line_count(const std::string& text) {
  std::size_t n = 0;
  for (char c : text) n += c == '\n' ? 1 : 0;
  return n;
}

// A temporary folder for one test (removed at the end) with a work/ folder commands run in.
class CliSandbox {
 public:
  explicit CliSandbox(const std::string& name) {
    static int counter = 0;
    dir_ = std::filesystem::temp_directory_path() /
           ("loom-" + name + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_ / "work");
  }
  ~CliSandbox() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  CliSandbox(const CliSandbox&) = delete;
  CliSandbox& operator=(const CliSandbox&) = delete;

  std::filesystem::path work() const { return dir_ / "work"; }

  // Runs `loom ARGS` (ARGS as shell words) in work() with `env` (shell assignments) in front.
  CliResult loom(const std::string& args, const std::string& env = "") const {
    const std::filesystem::path out = dir_ / "stdout.txt";
    const std::filesystem::path err = dir_ / "stderr.txt";
    const std::string command = "cd " + shell_quoted(work().string()) + " && " + env + " " +
                                shell_quoted(LOOM_BINARY) + " " + args + " </dev/null >" +
                                shell_quoted(out.string()) + " 2>" + shell_quoted(err.string());
    const int status = std::system(command.c_str());
    CliResult r;
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = read_all(out);
    r.err = read_all(err);
    return r;
  }

  // As loom(), with loom's stderr written into a pipe (which cat copies into CliResult::err):
  // what a user piping the output sees.
  CliResult loom_piped(const std::string& args, const std::string& env = "") const {
    const std::filesystem::path out = dir_ / "stdout.txt";
    const std::filesystem::path err = dir_ / "stderr.txt";
    const std::filesystem::path code = dir_ / "code.txt";
    const std::string command =
        "cd " + shell_quoted(work().string()) + " && ( " + env + " " + shell_quoted(LOOM_BINARY) +
        " " + args + " </dev/null 2>&1 >" + shell_quoted(out.string()) + "; echo $? >" +
        shell_quoted(code.string()) + " ) | cat >" + shell_quoted(err.string());
    CliResult r;
    if (std::system(command.c_str()) != 0) return r;
    r.exit_code = std::stoi(read_all(code));
    r.out = read_all(out);
    r.err = read_all(err);
    return r;
  }

  // Writes `text` to `name` under work(), creating its folder.
  void write(const std::string& name, const std::string& text) const {
    std::filesystem::create_directories((work() / name).parent_path());
    std::ofstream(work() / name, std::ios::binary) << text;
  }
  std::string read(const std::string& name) const { return read_all(work() / name); }

 private:
  std::filesystem::path dir_;
};

}  // namespace loom::test
