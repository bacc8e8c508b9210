// One table of bad inputs to the `loom` binary (docs/README.md, docs/formats.md): model, cluster
// and plan JSON, Hugging Face config.json, safetensors, vocab.txt, CSV and aclImdb folders,
// environment variables and command-line flags. Every row must end with exit code 2, nothing on
// stdout, and exactly one line on stderr, `loom <subcommand>: error: ...`, that names the input
// (file or flag), the field and what was expected (docs/README.md allows hint lines after it; no
// row uses one). No stack traces, no aborts, and no file left behind: the sandbox holds the same
// files after the command as before (so neither an -o output nor a temporary file survives a
// refusal).
//
// Each row runs in a fresh temporary folder holding a valid tiny model (model.json), one- and
// two-device CPU clusters, plans for them made by `loom plan` (plan.json: one rank, plan2.json:
// two) and a vocabulary; the row adds or replaces files and runs one command. `loom train` rows
// fail before the first step. Each start of `loom` costs about half a second (LibTorch's static
// initialisation), so the rows run several at a time: the table takes about 15 s on two cores.
//
// Rows for the loom-profile format (`--profile`) live with `loom profile`'s tests.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tests/tools/bad_input_rows.hpp"
#include "tests/tools/cli_sandbox.hpp"

namespace fs = std::filesystem;
using Catch::Contains;
using Catch::StartsWith;
using nlohmann::json;
using namespace loom::test::bad_input;

namespace {

struct Outcome {
  int exit_code = -1;
  bool exited = false;
  std::string out;
  std::string err;
};

std::string contents(const fs::path& path) { return loom::test::read_all(path); }

std::string shell_word(const std::string& s) { return loom::test::shell_quoted(s); }

// A temporary folder; commands run in work() with no launcher variables of the calling
// environment.
class Sandbox {
 public:
  Sandbox() {
    static std::atomic<int> counter{0};
    dir_ = fs::temp_directory_path() /
           ("loom-test-bad-input-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "work");
  }
  ~Sandbox() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  Sandbox(const Sandbox&) = delete;
  Sandbox& operator=(const Sandbox&) = delete;

  fs::path work() const { return dir_ / "work"; }

  void write(const Files& files) const {
    for (const auto& [name, text] : files) {
      if (!name.empty() && name.back() == '/') {
        fs::create_directories(work() / name);
        continue;
      }
      fs::create_directories((work() / name).parent_path());
      std::ofstream(work() / name, std::ios::binary) << text;
    }
  }

  // Every path under work(), folders included, relative to it.
  std::set<std::string> listing() const {
    std::set<std::string> out;
    for (const auto& entry : fs::recursive_directory_iterator(work())) {
      out.insert(fs::relative(entry.path(), work()).string());
    }
    return out;
  }

  // `ENV loom ARGS`; `env` is a list of NAME=VALUE words (may be empty).
  Outcome loom(const std::string& args, const std::string& env = "") const {
    const fs::path out = dir_ / "stdout.txt";
    const fs::path err = dir_ / "stderr.txt";
    const std::string command =
        "cd " + shell_word(work().string()) +
        " && env -u RANK -u WORLD_SIZE -u LOCAL_RANK -u SLURM_PROCID -u SLURM_NTASKS "
        "-u SLURM_LOCALID -u MASTER_ADDR -u MASTER_PORT " +
        env + " " + shell_word(LOOM_BINARY) + " " + args + " </dev/null >" +
        shell_word(out.string()) + " 2>" + shell_word(err.string());
    const int status = std::system(command.c_str());
    Outcome r;
    r.exited = WIFEXITED(status);
    r.exit_code = r.exited ? WEXITSTATUS(status) : -1;
    r.out = contents(out);
    r.err = contents(err);
    return r;
  }

 private:
  fs::path dir_;
};

// The files every sandbox starts with.
Files base_files(const Plans& plans) {
  return {{"model.json", text(valid_model())},      {"cluster-1.json", text(cpu_cluster(1))},
          {"cluster-2.json", text(cpu_cluster(2))}, {"plan.json", text(plans.one)},
          {"plan2.json", text(plans.two)},          {"vocab.txt", kVocab}};
}

Plans make_plans() {
  Sandbox box;
  Plans plans;
  box.write({{"model.json", text(valid_model())},
             {"cluster-1.json", text(cpu_cluster(1))},
             {"cluster-2.json", text(cpu_cluster(2))}});
  const std::string common =
      "plan --model model.json --global-batch 8 --seq-len 32 --precision fp32 --micro-batch 4 ";
  const Outcome one = box.loom(common + "--cluster cluster-1.json -o plan.json");
  const Outcome two = box.loom(common + "--cluster cluster-2.json --dp 2 -o plan2.json");
  INFO("loom plan: " << one.err << two.err);
  REQUIRE(one.exit_code == 0);
  REQUIRE(two.exit_code == 0);
  plans.one = json::parse(contents(box.work() / "plan.json"));
  plans.two = json::parse(contents(box.work() / "plan2.json"));
  return plans;
}

// "loom <subcommand>: error: " for the subcommand the row runs; "loom: error: " for none.
std::string error_prefix(const std::string& args) {
  const std::string first = args.substr(0, args.find(' '));
  for (const char* sub : {"plan", "simulate", "report", "train", "launch", "slurm", "demo",
                          "profile", "validate", "logits", "export"}) {
    if (first == sub) return "loom " + first + ": error: ";
  }
  return "loom: error: ";
}

// What one row's command did, and the sandbox's files before and after it.
struct RowResult {
  Outcome outcome;
  std::set<std::string> before;
  std::set<std::string> after;
};

// Runs every row, each in its own sandbox, several at a time: the binary loads LibTorch, so each
// start costs about half a second of CPU. The workers touch only their own sandbox and slot; the
// assertions run afterwards on the test's thread.
std::vector<RowResult> run_rows(const std::vector<Row>& rows, const Plans& plans) {
  std::vector<RowResult> results(rows.size());
  std::atomic<std::size_t> next{0};
  auto work = [&]() {
    for (std::size_t i = next++; i < rows.size(); i = next++) {
      const Sandbox box;
      box.write(base_files(plans));
      box.write(rows[i].files);
      results[i].before = box.listing();
      results[i].outcome = box.loom(rows[i].args, rows[i].env);
      results[i].after = box.listing();
    }
  };
  const unsigned workers = std::clamp(std::thread::hardware_concurrency(), 2U, 8U);
  std::vector<std::thread> threads;
  for (unsigned w = 0; w < workers; ++w) threads.emplace_back(work);
  for (std::thread& t : threads) t.join();
  return results;
}

}  // namespace

TEST_CASE("every bad input gives exit 2 and one line naming the input, field and expectation",
          "[tools][cli][errors][bad-input-table]") {
  // Catch runs the test case once per section: the rows run on the first pass only.
  static const Plans plans = make_plans();
  static const std::vector<Row> rows = table(plans);
  static const std::vector<RowResult> results = run_rows(rows, plans);
  REQUIRE(rows.size() >= 40);
  std::set<std::string> names;
  for (const Row& row : rows) names.insert(row.name);
  REQUIRE(names.size() == rows.size());  // a failure names its row: one name per row
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Row& row = rows[i];
    DYNAMIC_SECTION(row.name) {
      const Outcome& r = results[i].outcome;
      INFO("loom " << row.args);
      INFO("stdout: " << r.out);
      INFO("stderr: " << r.err);
      CHECK(r.exited);  // not killed by a signal (abort, segfault)
      CHECK(r.exit_code == 2);
      CHECK(r.out.empty());
      // Exactly one line: no hints, no stack trace.
      CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
      CHECK_THAT(r.err, Catch::EndsWith("\n"));
      CHECK_THAT(r.err, StartsWith(error_prefix(row.args)));
      for (const std::string& part : row.expected) CHECK_THAT(r.err, Contains(part));
      CHECK(results[i].after == results[i].before);  // nothing written, nothing half-written
    }
  }
}
