// End-to-end: `loom launch` runs ranks of `loom train` as processes (Gloo over loopback, a
// TCPStore on rank 0), prefixes their output, stops everything when one fails, and runs as one
// node of several (torchrun's --nnodes, --node-rank, --master-addr); `loom slurm` writes an
// sbatch script and warns when this build cannot run the plan's device.
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tests/tools/cli_sandbox.hpp"

namespace fs = std::filesystem;
using Catch::Contains;
using Catch::StartsWith;
using loom::test::CliResult;
using loom::test::CliSandbox;

namespace {

const std::string kPlanDp2 =
    "plan --model tiny-bert --cluster local-cpu --global-batch 8 --seq-len 32 --dp 2 --tp 1 "
    "--pp 1 --zero 0 --micro-batch 2 --precision fp32 -o PLAN.json";

}  // namespace

TEST_CASE("free_port gives a port below the ephemeral range that a server can bind",
          "[tools][launch]") {
  int first = 32768;
  int last = 60999;
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> first >> last;
  REQUIRE(first > 11000);  // room below the range, as on every Linux default
  const int port = loom::tools::free_port();
  CHECK(port >= 10000);
  CHECK(port < first);
  // A listening socket, as rank 0's TCPStore opens one, binds it.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  address.sin_port = htons(static_cast<std::uint16_t>(port));
  const bool bound = ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0;
  const bool listening = bound && ::listen(fd, 1) == 0;
  // While it is held, later calls give other ports.
  for (int i = 0; i < 20; ++i) CHECK(loom::tools::free_port() != port);
  ::close(fd);
  CHECK(bound);
  CHECK(listening);
}

TEST_CASE("loom launch runs a dp=2 plan as two processes", "[tools][launch]") {
  const CliSandbox f("launch");
  REQUIRE(f.loom(kPlanDp2).exit_code == 0);
  const CliResult r = f.loom("launch --nproc 2 --master-port " + loom::test::free_port() +
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
    std::ifstream in(f.work() / name);
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
  const CliSandbox f("launch");
  REQUIRE(f.loom(kPlanDp2).exit_code == 0);
  // Three ranks for a plan of two: every rank refuses (exit 2); launch reports the first.
  const CliResult r = f.loom("launch --nproc 3 --master-port " + loom::test::free_port() +
                             " -- loom train PLAN.json --data synthetic:80 --steps 1");
  INFO("stderr: " << r.err);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Contains("] loom train: error: "));
  CHECK_THAT(r.err, Contains("3 rank(s) of this job"));
  CHECK_THAT(r.err, Contains("loom launch: error: rank "));
  CHECK_THAT(r.err, Contains("exited with code 2 (the first to fail)"));
}

TEST_CASE("loom slurm writes an sbatch script for the plan's ranks", "[tools][slurm]") {
  const CliSandbox f("launch");
  REQUIRE(f.loom(kPlanDp2).exit_code == 0);
  const CliResult r = f.loom(
      "slurm PLAN.json --partition cpu --time 01:00:00 -o JOB.sh -- --data synthetic --steps 5");
  INFO("stderr: " << r.err);
  REQUIRE(r.exit_code == 0);
  const std::string script = loom::test::read_all(f.work() / "JOB.sh");
  CHECK_THAT(script, Contains("#SBATCH --nodes=1\n"));
  CHECK_THAT(script, Contains("#SBATCH --ntasks=2\n"));
  CHECK_THAT(script, Contains("#SBATCH --partition=cpu\n"));
  CHECK_THAT(script, Contains("#SBATCH --time=01:00:00\n"));
  CHECK_THAT(script, Contains("srun \"$LOOM\" train '"));
  CHECK_THAT(script, Contains("PLAN.json' '--data' 'synthetic' '--steps' '5'"));
  CHECK(f.loom("slurm PLAN.json --time 1h -o JOB.sh").exit_code == 2);
}

TEST_CASE("loom launch --nnodes --node-rank --master-addr set torchrun's variables",
          "[tools][launch]") {
  const CliSandbox f("launch");
  // Node 1 of a 2 x 2 job: global ranks 2 and 3.
  const CliResult r = f.loom(
      "launch --nnodes 2 --node-rank 1 --nproc 2 --master-addr node0.example --master-port 1234 "
      "-- sh -c 'echo $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT'");
  INFO("stderr: " << r.err);
  REQUIRE(r.exit_code == 0);
  std::vector<std::string> lines;
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  std::sort(lines.begin(), lines.end());
  CHECK(lines == std::vector<std::string>{"[rank 2] 2 4 0 2 node0.example 1234",
                                          "[rank 3] 3 4 1 2 node0.example 1234"});
  // The defaults: one node, rank 0, the rendezvous on this machine.
  const CliResult one = f.loom("launch --nproc 1 -- sh -c 'echo $RANK $WORLD_SIZE $MASTER_ADDR'");
  CHECK(one.out == "[rank 0] 0 1 127.0.0.1\n");

  const CliResult bad = f.loom("launch --nnodes 2 --node-rank 2 --nproc 1 -- true");
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.err, Contains("loom launch: error: --node-rank") &&
                          Contains("0 to --nnodes - 1 = 1, found 2"));
}

TEST_CASE("two loom launch nodes train a plan as one launch of the same world does",
          "[tools][launch]") {
  const CliSandbox f("launch");
  REQUIRE(f.loom(kPlanDp2).exit_code == 0);
  const std::string train =
      " -- loom train PLAN.json --data synthetic:80 --steps 3 --dropout 0 --comm-timeout 60 "
      "--log-every 0 --json";
  const CliResult single =
      f.loom("launch --nproc 2 --master-port " + loom::test::free_port() + train);
  INFO("one launch: " << single.err);
  REQUIRE(single.exit_code == 0);

  // Nodes 0 and 1 of a 2 x 1 job on this machine, started side by side.
  std::string loom = "'";
  loom += LOOM_BINARY;
  loom += "'";
  const std::string nodes = "launch --nnodes 2 --nproc 1 --master-addr 127.0.0.1 --master-port " +
                            loom::test::free_port() + " --node-rank ";
  const std::string script = "cd '" + f.work().string() + "' && { " + loom + " " + nodes + "1" +
                             train + " >n1.out 2>n1.err & node1=$!; " + loom + " " + nodes + "0" +
                             train + " >n0.out 2>n0.err; code=$?; wait $node1 && exit $code; }";
  const int status = std::system(script.c_str());
  INFO("node 0: " << loom::test::read_all(f.work() / "n0.err"));
  INFO("node 1: " << loom::test::read_all(f.work() / "n1.err"));
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  // Rank 0 (node 0) prints the summary; rank 1 (node 1) nothing.
  CHECK(loom::test::read_all(f.work() / "n1.out").empty());
  auto losses = [](const std::string& out) {
    std::string json;
    std::istringstream lines(out);
    for (std::string line; std::getline(lines, line);) {
      REQUIRE(line.rfind("[rank 0] ", 0) == 0);
      json += line.substr(9) + "\n";
    }
    return nlohmann::json::parse(json).at("losses").get<std::vector<double>>();
  };
  const std::vector<double> expected = losses(single.out);
  REQUIRE(expected.size() == 3);
  CHECK(losses(loom::test::read_all(f.work() / "n0.out")) ==
        expected);  // the same ranks, the same sums
}

TEST_CASE("loom slurm --cpus-per-task, and a warning when this build cannot run the plan's cuda",
          "[tools][slurm]") {
  const CliSandbox f("launch");
  REQUIRE(f.loom(kPlanDp2).exit_code == 0);
  CliResult r = f.loom("slurm PLAN.json --cpus-per-task 8 -o JOB.sh -- --data synthetic --steps 5");
  REQUIRE(r.exit_code == 0);
  CHECK(r.err.empty());  // a CPU plan: any build runs it
  CHECK_THAT(loom::test::read_all(f.work() / "JOB.sh"), Contains("#SBATCH --cpus-per-task=8\n"));
  CHECK_FALSE(loom::test::read_all(f.work() / "JOB.sh").find("--device cuda") != std::string::npos);
  CHECK(f.loom("slurm PLAN.json --cpus-per-task 0 -o JOB.sh").exit_code == 2);

  REQUIRE(f.loom("plan --model tiny-bert --cluster dgx-a100-80g --global-batch 8 --seq-len 32 "
                 "--dp 1 --tp 1 --pp 1 --micro-batch 8 --precision fp32 -o GPU.json")
              .exit_code == 0);
  // Whether this build trains on cuda, as loom train (LibTorch's side) says it.
  const CliResult train = f.loom("train GPU.json --data synthetic:80 --steps 1");
  const bool cpu_build = train.err.find("this one is a CPU build") != std::string::npos;
  r = f.loom("slurm GPU.json -o GPU.sh -- --data synthetic --steps 5");
  INFO("stderr: " << r.err);
  REQUIRE(r.exit_code == 0);  // a warning, not an error
  CHECK_THAT(loom::test::read_all(f.work() / "GPU.sh"),
             Contains("'--steps' '5' --device cuda \"$@\"\n"));
  if (cpu_build) {
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    CHECK_THAT(r.err, StartsWith("loom slurm: warning: the plan trains on cuda, but the loom this "
                                 "script runs (") &&
                          Contains(") is a CPU build: build Loom for GPUs with cmake "
                                   "-DLOOM_CUDA=ON") &&
                          Contains("add --device cpu after --"));
  } else {
    CHECK(r.err.empty());
  }
  // Trained on CPUs by request: nothing to warn about.
  r = f.loom("slurm GPU.json -o GPU.sh -- --data synthetic --device cpu");
  REQUIRE(r.exit_code == 0);
  CHECK(r.err.empty());
  CHECK_THAT(loom::test::read_all(f.work() / "GPU.sh"), Contains("'--device' 'cpu' \"$@\"\n"));
}
