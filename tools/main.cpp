// loom: plan, simulate and run parallel training of transformer models. See spec/cli.md.
#include <CLI/CLI.hpp>
#include <iostream>
#include <map>
#include <string>

#include "profiles/errors.hpp"
#include "tools/commands.hpp"

int main(int argc, char** argv) {
  CLI::App app{"loom: plans, simulates and runs parallel training of transformer models", "loom"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "loom 0.1.0");
  std::map<std::string, loom::tools::Runner> runners;
  runners["plan"] = loom::tools::add_plan_command(app);
  runners["demo"] = loom::tools::add_demo_command(app);
  runners["train"] = loom::tools::add_train_command(app);
  runners["simulate"] = loom::tools::add_simulate_command(app);
  runners["report"] = loom::tools::add_report_command(app);
  runners["launch"] = loom::tools::add_launch_command(app);
  runners["slurm"] = loom::tools::add_slurm_command(app);

  std::string sub = argc > 1 ? argv[1] : "";
  if (runners.count(sub) == 0) sub = "";
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
    std::cerr << prefix() << ": error: " << e.what() << " (see " << prefix() << " --help)\n";
    return 2;
  }
  for (CLI::App* s : app.get_subcommands()) sub = s->get_name();
  try {
    return runners.at(sub)();
  } catch (const loom::InputError& e) {
    std::cerr << prefix() << ": error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << prefix() << ": error: " << e.what() << "\n";
    return 1;
  }
}
