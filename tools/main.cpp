// loom: plan, simulate and run parallel training of transformer models. See docs/README.md.
//
// This binary runs the commands that need no LibTorch (plan, simulate, report, launch, slurm,
// validate, tune, calibrate) and hands the others to loom-torch, built next to it (tools/cli.hpp).
#include <csignal>
#include <map>
#include <string>

#include "tools/cli.hpp"
#include "tools/commands.hpp"

int main(int argc, char** argv) {
  // A write past a file-size limit (ulimit -f) fails with EFBIG and is reported like a full disk,
  // instead of killing the process. Ignored signals stay ignored across execv into loom-torch.
  std::signal(SIGXFSZ, SIG_IGN);
  // A rank whose peer died writes to a closed socket: that must be an error Gloo reports (and the
  // collective's failure names the lost rank), not a silent death by SIGPIPE.
  std::signal(SIGPIPE, SIG_IGN);
  using loom::tools::CommandAdder;
  const std::map<std::string, CommandAdder> commands = {
      {"plan", loom::tools::add_plan_command},
      {"simulate", loom::tools::add_simulate_command},
      {"report", loom::tools::add_report_command},
      {"launch", loom::tools::add_launch_command},
      {"slurm", loom::tools::add_slurm_command},
      {"validate", loom::tools::add_validate_command},
      {"calibrate", loom::tools::add_calibrate_command},
      {"tune", loom::tools::add_tune_command},
  };
  return loom::tools::run_command_line(argc, argv, commands, "loom-torch");
}
