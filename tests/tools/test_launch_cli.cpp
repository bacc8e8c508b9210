// End-to-end: `loom launch` runs ranks of `loom train` as processes (Gloo over loopback, a
// TCPStore on rank 0), prefixes their output, stops everything when one fails; `loom slurm`
// writes an sbatch script.
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

namespace fs = std::filesystem;
using Catch::Contains;

namespace {

struct Result {
  int exit_code = -1;
  std::string out;
  std::string err;
};

std::string slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

class Folder {
 public:
  Folder() {
    static int counter = 0;
    dir_ = fs::temp_directory_path() /
           ("loom-test-launch-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  ~Folder() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  Folder(const Folder&) = delete;
  Folder& operator=(const Folder&) = delete;
  const fs::path& path() const { return dir_; }

  Result loom(const std::string& args) const {
    const std::string command = "cd '" + dir_.string() + "' && '" + LOOM_BINARY + "' " + args +
                                " </dev/null >stdout.txt 2>stderr.txt";
    const int status = std::system(command.c_str());
    Result r;
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = slurp(dir_ / "stdout.txt");
    r.err = slurp(dir_ / "stderr.txt");
    return r;
  }

 private:
  fs::path dir_;
};

// A port per test run so that parallel ctest runs do not collide.
std::string port(int offset) { return std::to_string(20000 + (::getpid() * 7 + offset) % 20000); }

const std::string kPlanDp2 =
    "plan --model tiny-bert --cluster local-cpu --global-batch 8 --seq-len 32 --dp 2 --tp 1 "
    "--pp 1 --zero 0 --micro-batch 2 --precision fp32 -o PLAN.json";

}  // namespace

TEST_CASE("loom launch runs a dp=2 plan as two processes", "[tools][launch]") {
  Folder f;
  REQUIRE(f.loom(kPlanDp2).exit_code == 0);
  const Result r = f.loom("launch --nproc 2 --master-port " + port(1) +
                          " -- loom train PLAN.json --data synthetic:80 --steps 3 --dropout 0 "
                          "--comm-timeout 60 --metrics 'm.{rank}.jsonl' --json");
  INFO("stdout: " << r.out);
  INFO("stderr: " << r.err);
  REQUIRE(r.exit_code == 0);
  // Rank 0 prints the summary, every line prefixed.
  REQUIRE(r.out.rfind("[rank 0] ", 0) == 0);
  std::string json;
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);) {
    CHECK(line.rfind("[rank 0] ", 0) == 0);
    json += line.substr(9) + "\n";
  }
  const nlohmann::json summary = nlohmann::json::parse(json);
  CHECK(summary.at("steps") == 3);
  CHECK(summary.at("losses").size() == 3);
  // Every rank's step lines say where the time went: the phases add up to the step, and the
  // gradient all-reduce is in the gradients' phase.
  for (const char* name : {"m.0.jsonl", "m.1.jsonl"}) {
    std::ifstream in(f.path() / name);
    int steps = 0;
    for (std::string line; std::getline(in, line);) {
      const nlohmann::json j = nlohmann::json::parse(line);
      if (!j.contains("step_time_s")) continue;
      ++steps;
      INFO(name << ": " << line);
      const nlohmann::json& phases = j.at("phases_s");
      double sum = 0;
      for (const auto& item : phases.items()) sum += item.value().get<double>();
      CHECK(sum == Approx(j.at("step_time_s").get<double>()).epsilon(1e-9));
      CHECK(phases.at("forward").get<double>() > 0);
      CHECK(phases.at("backward").get<double>() > 0);
      CHECK(phases.at("gradients").get<double>() > 0);
      CHECK(phases.at("pipeline_wait").get<double>() < 1e-3);  // pp = 1: nothing to receive
    }
    CHECK(steps == 3);
  }
}

TEST_CASE("loom launch stops every rank when one fails and names it", "[tools][launch]") {
  Folder f;
  REQUIRE(f.loom(kPlanDp2).exit_code == 0);
  // Three ranks for a plan of two: every rank refuses (exit 2); launch reports the first.
  const Result r = f.loom("launch --nproc 3 --master-port " + port(2) +
                          " -- loom train PLAN.json --data synthetic:80 --steps 1");
  INFO("stderr: " << r.err);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Contains("] loom train: error: "));
  CHECK_THAT(r.err, Contains("3 rank(s) of this job"));
  CHECK_THAT(r.err, Contains("loom launch: error: rank "));
  CHECK_THAT(r.err, Contains("exited with code 2 (the first to fail)"));
}

TEST_CASE("loom slurm writes an sbatch script for the plan's ranks", "[tools][slurm]") {
  Folder f;
  REQUIRE(f.loom(kPlanDp2).exit_code == 0);
  const Result r = f.loom(
      "slurm PLAN.json --partition cpu --time 01:00:00 -o JOB.sh -- --data synthetic --steps 5");
  INFO("stderr: " << r.err);
  REQUIRE(r.exit_code == 0);
  const std::string script = slurp(f.path() / "JOB.sh");
  CHECK_THAT(script, Contains("#SBATCH --nodes=1\n"));
  CHECK_THAT(script, Contains("#SBATCH --ntasks=2\n"));
  CHECK_THAT(script, Contains("#SBATCH --partition=cpu\n"));
  CHECK_THAT(script, Contains("#SBATCH --time=01:00:00\n"));
  CHECK_THAT(script, Contains("srun \"$LOOM\" train '"));
  CHECK_THAT(script, Contains("PLAN.json' '--data' 'synthetic' '--steps' '5'"));
  CHECK(f.loom("slurm PLAN.json --time 1h -o JOB.sh").exit_code == 2);
}
