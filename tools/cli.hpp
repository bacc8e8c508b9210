// The process edge of the command line, shared by its two binaries.
//
// `loom` (tools/main.cpp) runs the commands that plan, simulate, report and start processes; it
// never links LibTorch, so it starts in milliseconds. `loom-torch` (tools/torch_main.cpp), built
// into the same folder, runs the commands that compute with LibTorch (train, profile, logits,
// demo). Both know every subcommand of tools/commands.hpp's kCommands: `loom --help` lists all of
// them, and a subcommand the running binary lacks is handed to the other one with execv, argv
// unchanged. The process keeps its id, standard streams, ignored signals and exit code, so a
// caller (a test, `loom launch`, a shell) cannot tell the two apart. When the other binary cannot
// be run the command fails with one line naming it (exit 1).
//
// run_command_line parses argv with CLI11 and turns every failure into the one line of
// docs/README.md: "loom SUB: error: WHAT", exit 2 for bad input (a parse error, loom::InputError)
// and 1 for any other exception.
#pragma once

#include <map>
#include <string>

#include "tools/commands.hpp"

namespace loom::tools {

// Adds one subcommand to `app` (the add_*_command functions of tools/commands.hpp).
using CommandAdder = Runner (*)(CLI::App& app);

// Runs the subcommand argv[1] as one of `here` (by name), or hands it to `sibling` (a file name
// next to this binary) when it is another of kCommands. Returns the exit code.
int run_command_line(int argc, char** argv, const std::map<std::string, CommandAdder>& here,
                     const std::string& sibling);

// LibTorch's CPU threads are OpenMP threads, which by default spin while they wait for each
// other. On a machine whose cores are shared (other processes, other ranks, a virtual machine's
// busy host) a spinning thread holds the core the thread it waits for needs, and steps get many
// times slower (measured: 0.59 s against 0.13 s per step of tiny-bert on 2 shared cores). For the
// commands that compute on the CPU (train, profile) this sets OMP_WAIT_POLICY=PASSIVE, unless the
// user chose a policy or a single thread. OpenMP reads the variable when it is loaded, before
// main(): it must be set before the binary that computes starts. Returns whether it set it.
bool prefer_passive_openmp_waits(int argc, char** argv);

}  // namespace loom::tools
