// What realises a plan in another training runtime (`loom plan --emit megatron|deepspeed|fsdp`):
// Megatron-LM's command line; a DeepSpeed JSON configuration with its launch line; a torchrun
// line with PyTorch FSDP's settings. The text is a shell script: comments (#) say what the
// runtime needs beyond it (the training script, the data, the variables to set on each node),
// commands launch it (torchrun: the same line on every node, meeting at a c10d rendezvous;
// DeepSpeed: once, from a hostfile). The emitters are one file each (emit_<engine>.cpp), and
// bench/emit_engines.sh checks their output with the engines' own code.
#pragma once

#include <string>

#include "costmodel/strategy.hpp"
#include "planner/plan.hpp"

namespace loom::planner {

// The configuration of `plan` for `runtime` (not kLoom: a plan is Loom's own input). InputError
// (naming "--emit") when the runtime cannot run the plan's strategy, with its reason.
std::string emit_plan(const Plan& plan, costmodel::Runtime runtime);

}  // namespace loom::planner
