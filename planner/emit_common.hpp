// What the three emitters of `loom plan --emit` share (emit.hpp): the header comment, the
// node layout, the torchrun line, and each engine's text.
#pragma once

#include <cstdint>
#include <string>

#include "costmodel/strategy.hpp"
#include "planner/plan.hpp"

namespace loom::planner::emit_detail {

inline std::string num(std::int64_t v) { return std::to_string(v); }

// Whole nodes the plan's ranks fill (ranks fill nodes in order) and ranks per node.
std::int64_t nodes_of(const Plan& plan);
std::int64_t ranks_per_node(const Plan& plan);

// "# <engine> settings for Loom's plan: ..." and the batch, sequence and precision line.
std::string header(const Plan& plan, const char* engine);

// On several nodes, the comment naming what the user sets on each node for torchrun's
// rendezvous; empty on one node.
std::string torchrun_nodes_comment(const Plan& plan);

// "torchrun --nnodes N --nproc_per_node G", with a c10d rendezvous at $MASTER_ADDR:$MASTER_PORT
// on several nodes.
std::string torchrun(const Plan& plan);

// Transformer layers in stage range `r` (entries 1..L of the layer sequence).
std::int64_t layers_in(const costmodel::StageRange& r, std::int64_t layers);

std::string megatron(const Plan& plan);
std::string deepspeed(const Plan& plan);
std::string fsdp(const Plan& plan);

}  // namespace loom::planner::emit_detail
