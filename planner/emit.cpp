#include "planner/emit.hpp"

#include <algorithm>
#include <string>

#include "costmodel/runtime.hpp"
#include "planner/emit_common.hpp"
#include "profiles/errors.hpp"

namespace loom::planner {
namespace emit_detail {

std::int64_t nodes_of(const Plan& plan) {
  const std::int64_t world = plan.strategy.world_size();
  const std::int64_t per_node = plan.cluster.devices_per_node;
  return (world + per_node - 1) / per_node;
}

std::int64_t ranks_per_node(const Plan& plan) {
  return std::min<std::int64_t>(plan.strategy.world_size(), plan.cluster.devices_per_node);
}

std::string header(const Plan& plan, const char* engine) {
  std::string out = std::string("# ") + engine + " settings for Loom's plan: " + plan.model.name +
                    " on " + num(plan.strategy.world_size()) + " " + plan.cluster.device.name +
                    ", " + costmodel::describe(plan.strategy) + "\n";
  out += "# global batch " + num(plan.job.global_batch) + ", seq " + num(plan.job.seq_len) +
         ", precision " + profiles::to_string(plan.job.precision) + "\n";
  return out;
}

std::string torchrun_nodes_comment(const Plan& plan) {
  if (nodes_of(plan) == 1) return "";
  return "# " + num(nodes_of(plan)) +
         " nodes: run the same line on every node with MASTER_ADDR (the address of one node "
         "that all reach), MASTER_PORT (a free port there) and JOB_ID (one id for the job) set; "
         "torchrun's c10d rendezvous numbers the nodes\n";
}

// The underscore spellings of torchrun's options, which every torchrun parses (the dashed
// aliases arrived in PyTorch 2); without a rendezvous or a node rank and master address,
// the nodes of a multi-node job each wait for the others forever (torch/distributed/run.py).
std::string torchrun(const Plan& plan) {
  std::string out =
      "torchrun --nnodes " + num(nodes_of(plan)) + " --nproc_per_node " + num(ranks_per_node(plan));
  if (nodes_of(plan) > 1) {
    out +=
        " --rdzv_backend c10d --rdzv_endpoint \"$MASTER_ADDR:$MASTER_PORT\" --rdzv_id \"$JOB_ID\"";
  }
  return out;
}

std::int64_t layers_in(const costmodel::StageRange& r, std::int64_t layers) {
  return std::max<std::int64_t>(0, std::min<std::int64_t>(r.last_layer, layers) -
                                       std::max<std::int64_t>(r.first_layer, 1) + 1);
}

}  // namespace emit_detail

std::string emit_plan(const Plan& plan, costmodel::Runtime runtime) {
  costmodel::Job job = plan.job;
  job.runtime = runtime;
  // An engine without TransformerEngine's overlap runs the tp collectives plainly.
  job.tp_comm_overlap =
      job.tp_comm_overlap && costmodel::runtime_rules(runtime).overlaps_tp_communication;
  if (auto why = costmodel::runtime_refusal(job, plan.strategy)) {
    throw InputError("--emit", "", *why);
  }
  const std::int64_t world = plan.strategy.world_size();
  const std::int64_t per_node = plan.cluster.devices_per_node;
  if (world > per_node && world % per_node != 0) {
    throw InputError("--emit", "",
                     "a plan whose " + emit_detail::num(world) + " ranks fill whole nodes of " +
                         emit_detail::num(per_node) +
                         " devices (torchrun starts the same count on every node)");
  }
  switch (runtime) {
    case costmodel::Runtime::kMegatron:
      return emit_detail::megatron(plan);
    case costmodel::Runtime::kDeepspeed:
      return emit_detail::deepspeed(plan);
    case costmodel::Runtime::kFsdp:
      return emit_detail::fsdp(plan);
    case costmodel::Runtime::kLoom:
    case costmodel::Runtime::kNemo:
      break;
  }
  throw InputError("--emit", "",
                   "expected megatron, deepspeed or fsdp (a plan is Loom's own input; NeMo takes "
                   "its launcher's configuration, which Loom does not write yet)");
}

}  // namespace loom::planner
