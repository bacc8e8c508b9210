// The simulator's task graph of one training step. Internal to the simulator.
//
// Symmetry: ranks of one pipeline stage that differ only in their dp or tp index run the same
// tasks at the same times, so one representative per pipeline rank is played (engine rank r is
// pipeline rank r); each communication task is a flow standing for all of its copies
// (sim_network.hpp).
//
// Tasks of one rank, in pipeline_order() (schedule.hpp), per micro-batch and model chunk: forward
// and backward compute (recomputation inside the backward); the chunk's tensor-parallel
// collectives (all-reduces, or all-gathers and reduce-scatters with sequence parallelism) lumped
// into one flow right after each (blocking: the compute stream waits, as the collectives sit
// inside the layers); a send of the activation (forward) or its gradient
// (backward) to the neighbouring chunk's rank, blocking like Megatron-LM's p2p calls, and, when
// tp > 1 without sequence parallelism, the receiving group's all-gather of it (Megatron's
// scatter-gather; on the receiver's pp stream). Data parallelism: a chunk's gradients are
// all-reduced in buckets of StepSpec::bucket_bytes issued as its backward produces them (gradient
// bytes in proportion to backward time), during the chunk's last micro-batch, or during every
// micro-batch when the ZeRO policy reduces every micro-batch. The ZeRO policy's gathers: before
// the step's first forward pass, or after the optimizer step. The optimizer step on the rank's
// shard runs after every gradient reduction; the rank's step ends when all its streams are done,
// with the step's scalar all-reduces. Activations are allocated when a chunk's forward starts and
// freed when its backward ends.
#pragma once

#include <cstdint>
#include <vector>

#include "costmodel/schedule.hpp"
#include "costmodel/sim_engine.hpp"
#include "costmodel/sim_network.hpp"
#include "costmodel/strategy.hpp"
#include "costmodel/zero.hpp"

namespace loom::costmodel::sim {

// A tensor-parallel flow with what its slice name says: the collectives' kind ("allreduce", or
// "all-gather/reduce-scatter" with sequence parallelism), their number and the largest buffer.
struct TpSpec {
  FlowSpec flow;
  const char* kind = "allreduce";
  double count = 0;
  double bytes = 0;
};

struct ChunkSpec {
  StageRange range;
  double forward_s = 0;  // compute only
  double backward_s = 0;
  TpSpec tp_forward;
  TpSpec tp_backward;
  double activation_bytes = 0;
  double gradient_bytes = 0;
  // ZeRO-3: what the forward and backward passes' gathers move, and the lookup mask all-reduced
  // before the forward pass's first gather (runtime.hpp, lookup_mask_bytes).
  double forward_gather_bytes = 0;
  double lookup_mask_bytes = 0;
  double backward_gather_bytes = 0;
};

struct StepSpec {
  int pp = 1;
  int virtual_stages = 1;
  int ranks_per_stage = 1;  // dp * tp
  int dp = 1;
  ZeroPolicy zero;
  std::int64_t micro_batches = 1;
  Schedule schedule = Schedule::k1F1B;
  double bucket_bytes = 0;
  double p2p_bytes = 0;
  double p2p_all_gather_bytes = 0;
  bool cpu = false;  // CPU ranks: communication does not overlap compute (Task::queue)
  // CPU ranks: how long each pipeline transfer keeps the receiving rank's cores busy (Gloo
  // receives on the cores the compute uses); 0 on GPUs, whose transfers run beside the compute.
  double p2p_receive_s = 0;
  std::vector<ChunkSpec> chunks;
  std::vector<double> optimizer_s;            // per pipeline rank
  std::vector<double> zero_grad_s;            // per pipeline rank: the step's first task
  std::vector<double> post_all_gather_bytes;  // per pipeline rank (ZeRO-1/2)
  double step_sync_s = 0;                     // the step's scalar all-reduces (StepTerms)
};

// Adds the tasks of one step to `engine` (pipeline rank r is engine rank r). Without `comms` no
// flow is played (the schedule alone); `names` gives tasks their trace names.
void build_step(const StepSpec& spec, Engine& engine, Comms* comms, bool names);

// The schedule's own bubble of a played step: (end of the last forward or backward - ideal) /
// ideal, the ideal being the busiest rank's forward and backward compute.
double pipeline_bubble(Engine& engine, int pp);

// The bubble of `spec`'s schedule with the same compute, communication free (no flows, no
// optimizer), played on its own engine.
double replay_bubble(const StepSpec& spec);

}  // namespace loom::costmodel::sim
