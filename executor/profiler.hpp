// The profiler behind `loom profile`: measures the model's layers and the links between ranks on
// the machine it runs on, and returns loom-profile/1 measurements (profiles/profile.hpp).
//
// Layers: each kind (embedding, one transformer layer, head) runs as a one-layer stage of the
// real executor model (executor/model.hpp) in training mode (dropout on), for every micro-batch,
// tp degree, recomputation and CPU thread count asked for: forward and backward time are medians
// of `repeats` runs, taken in up to 5 rounds over all shapes (each round builds the stage anew and
// runs `warmup` untimed passes first), the device synchronised around each pass. With tp > 1 the
// stage holds one tp rank's shard. When the ranks of a launched group of exactly tp ranks measure
// together (`group`), each runs its own shard with the real all-reduces and the times include
// them, waits for the slower rank and contention for the cores included (tp_communication);
// otherwise the collectives are skipped and the cost model adds them from the links. In a
// launched group every time (layers and optimizer) is the slowest rank's: the ranks of a plan
// work in step, so the slowest one paces them. Memory:
// bytes still allocated after the forward pass (what backward will use: saved tensors and the
// output), bytes allocated above that during backward (peak temporary), and the stage's
// parameter bytes; CPU tensors are counted through LibTorch's allocator reports, CUDA ones from
// the caching allocator's statistics.
//
// Links: every rank of a launched group calls profile_links(); collectives over all ranks (and
// p2p between ranks 0 and 1) for each message size, medians of `repeats` after a warm-up.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "executor/executor.hpp"
#include "executor/train.hpp"
#include "profiles/profile.hpp"

namespace loom::executor {

class ProcessGroup;

struct ProfileOptions {
  profiles::ModelSpec model;
  Device device = Device::kCpu;
  int device_index = 0;
  profiles::Precision precision = profiles::Precision::kFp32;
  std::int64_t seq_len = 128;
  std::vector<std::int64_t> micro_batches = {1, 2, 4, 8};
  std::vector<int> tp = {1};
  std::vector<costmodel::Recompute> recompute = {costmodel::Recompute::kNone};
  // The attention core of the transformer layers (what a plan's `attention` runs; the caller
  // checks that this build has it).
  costmodel::Attention attention = costmodel::Attention::kMath;
  std::vector<int> threads;  // CPU threads to measure with; empty = this machine's cores (what
                             // loom train gives a CPU rank that runs alone)
  // The optimizer loops profile_optimizer() times: the one-rank loop (false) and the multi-rank
  // loop over flat buffers (true).
  std::vector<bool> optimizer_loops = {false, true};
  double dropout = 0.1;
  int warmup = 2;
  int repeats = 5;
  std::function<void(const std::string&)> progress;  // one line per measurement; may be empty
  // The launched group whose ranks all call profile_layers() with the same options; may be null.
  std::shared_ptr<ProcessGroup> group;
};

// Throws InputError for a model that is not a BERT/RoBERTa encoder, a tp that does not divide
// the heads and ffn, a seq_len beyond the model's positions, or bf16/fp16 on the CPU.
std::vector<profiles::LayerMeasurement> profile_layers(const ProfileOptions& options);

// The optimizer part of a step as loom train runs it (flat_adamw.hpp): zeroing the gradients, their
// norm, clipping and AdamW over the whole model's parameters, per thread count of `options`
// (median of repeats after warm-up), as the one-rank loop does it (torch::optim::AdamW, per
// tensor) and as the multi-rank loop does (flat buffers; `flat`), each when in optimizer_loops.
std::vector<profiles::OptimizerMeasurement> profile_optimizer(const ProfileOptions& options);

// Collective over `group`: every rank passes its figures in the same order and gets, for each,
// the largest over the ranks. A plan's ranks work in step, so the slowest rank's time is the one
// that paces them (on shared cores one rank often runs 10-20 % slower than another for seconds).
// The group's tensors live on `device` (NCCL takes CUDA tensors only).
std::vector<double> slowest_rank(ProcessGroup& group, Device device, int device_index,
                                 const std::vector<double>& values);

struct LinkProfileOptions {
  std::vector<double> message_bytes = {4096, 65536, 1 << 20, 4 << 20, 16 << 20};
  // CPU only: p2p_loaded, a message each way between group ranks 0 and 1 while both compute (a
  // pipeline's steady state on shared cores, where waking the receiver costs far more than the
  // idle ping-pong shows): the time it adds to a round of compute.
  std::vector<double> loaded_message_bytes = {65536, 1 << 20};
  // The collectives to time, by their loom-profile/1 names ("allreduce", "reduce_scatter",
  // "all_gather", "p2p").
  std::vector<std::string> collectives = {"allreduce", "reduce_scatter", "all_gather", "p2p"};
  int warmup = 2;
  int repeats = 5;
  std::string scope = "intra_node";
};

// Collective: every rank of `group` calls it with the same options. Times allreduce,
// reduce-scatter and all-gather over the group and p2p from group rank 0 to 1 (those of
// `collectives`), on `device`, and on CPU p2p_loaded (LinkProfileOptions).
std::vector<profiles::LinkMeasurement> profile_links(ProcessGroup& group, Device device,
                                                     int device_index,
                                                     const LinkProfileOptions& options);

// The whole job this process is a rank of (torchrun's or Slurm's variables, as `loom train` reads
// them): joins the rendezvous and builds the world group `name` (Gloo on the CPU, NCCL on CUDA).
// A job of one rank gets no group (null); `source` says where the rank variables came from.
struct JobGroup {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  bool one_node = true;  // LOCAL_WORLD_SIZE equals WORLD_SIZE
  std::string source;
  std::shared_ptr<ProcessGroup> group;
};
JobGroup join_job(Device device, double timeout_s, const std::string& name);

// profile_links() over the whole job this process is a rank of (torchrun's or Slurm's variables,
// as `loom train` reads them): joins the rendezvous, builds the world group (Gloo on the CPU, NCCL
// on CUDA), measures, and returns the measurements with this process's rank. The scope is
// intra_node when every rank is local (LOCAL_WORLD_SIZE equals WORLD_SIZE), else inter_node.
struct JobLinks {
  int rank = 0;
  int world_size = 1;
  std::vector<profiles::LinkMeasurement> links;
};
JobLinks profile_job_links(Device device, LinkProfileOptions options, double timeout_s);

// This machine's name for profiles: the CUDA device's name, or the CPU model from /proc/cpuinfo.
std::string device_description(Device device, int device_index);

}  // namespace loom::executor
