// Many ranks: where this process sits in the job, the rendezvous, and the process groups that
// carry every collective of the executor (c10d: Gloo for CPU tensors, NCCL for CUDA tensors in a
// CUDA build).
//
// Contracts:
// - Every collective and point-to-point call waits at most the group's timeout. A peer that is
//   lost (killed, crashed, stuck) makes every rank that waits on it throw CollectiveError naming
//   this rank, the operation, the group and the ranks that did not report a failure of their own
//   within one timeout (the lost ones); it never hangs.
// - Within a group every member issues the same collectives in the same order (c10d's rule).
//   Groups are created in the same order on every rank (world, then tp, dp and pp groups in
//   index order), each over its own PrefixStore, so the blocking Gloo rendezvous cannot cycle.
// - Tensors may be non-contiguous; the group copies through a contiguous buffer when needed.
//   Gloo gets CPU tensors. On NCCL, allreduce_sum and broadcast also take CPU tensors (small
//   control values: a stop flag, a loss, an evaluation's counts), staged through this rank's
//   device; the other operations refuse a CPU tensor there (a bug). The reductions are sums (SUM
//   then divide for averages: Gloo on 1.13 has no AVG, no reduce_scatter and no flat all-gather).
//   On Gloo the all-gather is one in-place broadcast per rank (no temporary) and the
//   reduce-scatter an all-reduce of the input and a copy of the rank's chunk.
// - Ranks are numbered as Megatron-LM does: rank = tp_rank + tp * (dp_rank + dp * pp_rank).
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#include "executor/model.hpp"

namespace loom::executor {

// ---------------------------------------------------------------------------------------------
// Where this process is

struct RankEnvironment {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string gloo_interface;  // GLOO_SOCKET_IFNAME; "" = by address
  std::string source = "no RANK/WORLD_SIZE or SLURM_PROCID/SLURM_NTASKS (a single process)";
};

// Looks up one environment variable; nullopt when unset. The tools pass a getenv wrapper; tests
// pass a map.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

// torchrun's RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT, else Slurm's
// SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID with the master on the first host of
// SLURM_JOB_NODELIST (MASTER_ADDR / MASTER_PORT still override), else a single process. Throws
// InputError naming the variable for a value that is not a non-negative integer or a rank outside
// [0, world size).
RankEnvironment rank_environment(const EnvLookup& lookup);

// Expands a Slurm host list: "node[01-03,7],gpu7" -> node01 node02 node03 node7 gpu7 (zero
// padding kept). Throws InputError for unbalanced brackets or a bad range.
std::vector<std::string> expand_nodelist(const std::string& nodelist);

// ---------------------------------------------------------------------------------------------
// Errors

// A collective or point-to-point operation failed or timed out.
class CollectiveError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// ---------------------------------------------------------------------------------------------
// Groups

enum class CommBackend { kGloo, kNccl };

struct GroupOptions {
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};  // every operation
  CommBackend backend = CommBackend::kGloo;  // kNccl only in a CUDA build, for CUDA tensors
  std::string host = "127.0.0.1";            // address Gloo binds to ("" = this host's name)
  std::string interface;                     // network interface for Gloo (wins over host)
  int device_index = 0;                      // NCCL: this rank's CUDA device
  // On a failure, the world ranks 0..watch_world_size-1 whose silence names them lost; 0 = the
  // group's own members.
  int watch_world_size = 0;
  // Gloo keeps NCCL's point-to-point rules (tests of schedules meant for NCCL, on CPUs): tags are
  // not sent, so the n-th send to a peer meets the peer's n-th receive from this rank in the same
  // group; and the group's sends and receives run one at a time in the order posted, on a thread
  // of their own, as on one NCCL stream, where a send holds what follows until it is received. A
  // schedule whose sides disagree on the order then trains wrong, and one that would deadlock on
  // NCCL times out.
  bool p2p_by_order = false;
  // Gloo with tensors on a CUDA device (ranks that share one GPU, which NCCL refuses): every
  // operation copies its tensor to a host buffer, runs there, and copies the result back when
  // waited for (a send's and a receive's as they complete). CPU tensors are copied too, so the
  // CPU tests run this path; results are bit-identical to the unstaged ones.
  bool host_staging = false;
};

// rank_environment() of this process's own environment variables.
RankEnvironment process_rank_environment();

// The groups' options for a rank of the job `environment`: every operation within `timeout`, Gloo
// bound to GLOO_SOCKET_IFNAME, else to 127.0.0.1 when the master is this host; NCCL on the local
// rank's device when `cuda`.
// With `cuda_over_gloo`, CUDA ranks use Gloo with host staging instead of NCCL.
GroupOptions job_group_options(const RankEnvironment& environment, bool cuda,
                               std::chrono::milliseconds timeout, bool cuda_over_gloo = false);

// The rendezvous store: a TCPStore served by rank 0 at master_addr:master_port.
c10::intrusive_ptr<c10d::Store> connect_store(const RankEnvironment& environment,
                                              std::chrono::milliseconds timeout);
// An in-memory store for ranks that are threads of one process (tests).
c10::intrusive_ptr<c10d::Store> make_local_store();

// `e`'s message without c10's backtrace (c10::Error::what_without_backtrace), as errors quote it.
std::string error_text(const std::exception& e);

// An operation started by a group (a point-to-point send, an asynchronous all-reduce): wait()
// blocks until it is done or throws CollectiveError after the group's timeout. Waiting twice is
// allowed; an unwaited handle is waited for in the destructor (errors then swallowed).
class PendingOperation {
 public:
  struct Impl;
  explicit PendingOperation(std::unique_ptr<Impl> impl);
  PendingOperation(PendingOperation&&) noexcept;
  PendingOperation& operator=(PendingOperation&&) noexcept;
  ~PendingOperation();
  void wait();
  // Whether the operation has finished, done or failed (wait() then returns or throws at once);
  // never blocks. True once waited for.
  bool completed() const;
  // Runs `after` once the operation is done (in wait(), or in the destructor of a handle never
  // waited for); at once when it is already waited for. Replaces an earlier one.
  void then(std::function<void()> after);

 private:
  std::unique_ptr<Impl> impl_;
};

// One process group. A group of one needs no store and makes every operation a copy or no-op.
class ProcessGroup {
 public:
  // Joins the group `name` made of the world ranks `members` (in group-rank order) as world rank
  // `world_rank` (a member). Blocks until every member has joined (Gloo) or up to the timeout.
  // `store` is the job's store; the group uses PrefixStore("loom/" + name + "/", store).
  ProcessGroup(const c10::intrusive_ptr<c10d::Store>& store, std::string name,
               std::vector<int> members, int world_rank, const GroupOptions& options);
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(members_.size()); }
  const std::string& name() const { return name_; }
  const std::vector<int>& members() const { return members_; }

  // In place: the element-wise sum over the group.
  void allreduce_sum(torch::Tensor& tensor);
  // Starts an in-place sum of a contiguous tensor; the result is there after wait().
  PendingOperation allreduce_sum_async(torch::Tensor& tensor);
  // output [size * n] = concatenation of every rank's input [n] (any shape, numel n), rank order.
  void allgather(torch::Tensor& output, const torch::Tensor& input);
  // Starts allgather() of a contiguous output and input (the input may be this rank's chunk of
  // the output); the output is complete after every returned operation's wait(). Both must stay
  // alive until then.
  std::vector<PendingOperation> allgather_async(torch::Tensor& output, const torch::Tensor& input);
  // output [n] = this rank's n-element chunk of the element-wise sum of every rank's input
  // [size * n]: NCCL's reduce-scatter; on Gloo an all-reduce of the input (which then holds the
  // whole sum). A contiguous input is overwritten (at least this rank's chunk); the output may be
  // that chunk (in place).
  void reduce_scatter_sum(torch::Tensor& output, const torch::Tensor& input);
  // Starts reduce_scatter_sum() in place: after wait(), this rank's chunk of the contiguous
  // `input` [size * n] holds the sum of every rank's chunk (on Gloo the whole input then holds
  // the sum). The input must stay alive until then.
  PendingOperation reduce_scatter_sum_async(torch::Tensor& input);
  // In place: every rank gets root's tensor (root is a group rank).
  void broadcast(torch::Tensor& tensor, int root);
  // Starts broadcast() of a contiguous tensor (on NCCL, on this rank's device); it must stay
  // alive until wait().
  PendingOperation broadcast_async(torch::Tensor& tensor, int root);
  // Point to point (group ranks; tags >= 0 matched on both sides). send() returns at once; the
  // tensor must stay alive and unchanged until the handle's wait(). recv() blocks.
  PendingOperation send(const torch::Tensor& tensor, int destination, int tag);
  void recv(torch::Tensor& tensor, int source, int tag);
  void barrier();

 private:
  struct Impl;
  [[noreturn]] void fail(const std::string& operation, const std::string& what) const;
  // NCCL with a host tensor: allreduce_sum and broadcast stage it through the device; the other
  // operations refuse it (fail, naming `operation`).
  bool stages_through_device(const torch::Tensor& tensor) const;
  // host_staging: a host copy of `tensor` for the operation to run on; else `tensor` made
  // contiguous.
  torch::Tensor operand(const torch::Tensor& tensor) const;
  void refuse_host_tensor(const std::string& operation, const torch::Tensor& tensor) const;
  // The tag a point-to-point operation carries: `tag`, or under p2p_by_order the operation's
  // number among this rank's sends to (receives from) `peer`.
  int wire_tag(bool send, int peer, int tag);
  // p2p_by_order: the task that runs one send (receive) on the group's stream thread.
  std::function<void()> stream_task(bool send, std::vector<torch::Tensor> tensors, int peer,
                                    int tag) const;
  // "send to rank R (tag T)" / "recv from rank R (tag T)", world ranks.
  std::string describe_p2p(bool send, int peer, int tag) const;
  // A pending operation of this group: its timeout, its failure naming `name`, Gloo or not.
  std::unique_ptr<PendingOperation::Impl> new_operation(std::string name) const;
  // Starts an in-place broadcast of a contiguous tensor from group rank `root`; a failure names
  // `operation`.
  PendingOperation start_broadcast(torch::Tensor& tensor, int root, const std::string& operation);

  std::string name_;
  std::vector<int> members_;
  int rank_ = 0;
  int world_rank_ = 0;
  std::chrono::milliseconds timeout_;
  c10::intrusive_ptr<c10d::Store> store_;
  std::unique_ptr<Impl> impl_;
};

// The groups of one rank of a dp x tp x pp grid in Megatron order.
struct RankCoordinates {
  int dp = 0;
  int tp = 0;
  int pp = 0;
  bool operator==(const RankCoordinates&) const = default;
};
RankCoordinates megatron_coordinates(int rank, int dp, int tp, int pp);
int megatron_rank(const RankCoordinates& c, int dp, int tp);

class ParallelGroups {
 public:
  // Creates, in this order on every rank: "world" (all ranks), "tp<i>" (the ranks sharing dp and
  // pp coordinates), "dp<i>" (sharing tp and pp), "pp<i>" and "ppdown<i>" (sharing tp and dp; the
  // second when pp > 1), joining the ones this rank belongs to. Throws InputError unless
  // 0 <= world_rank < dp * tp * pp.
  ParallelGroups(const c10::intrusive_ptr<c10d::Store>& store, int world_rank, int dp, int tp,
                 int pp, const GroupOptions& options);

  int world_rank() const { return world_->rank(); }
  RankCoordinates coordinates() const { return coordinates_; }
  int dp_size() const { return dp_->size(); }
  int tp_size() const { return tp_->size(); }
  int pp_size() const { return pp_->size(); }
  ProcessGroup& world() { return *world_; }
  ProcessGroup& dp() { return *dp_; }
  ProcessGroup& pp() { return *pp_; }
  // The pipeline's point-to-point traffic goes one way per group: "pp<i>" carries what goes to a
  // higher pp rank, "ppdown<i>" what goes to a lower one. On NCCL, where a send holds its stream
  // until received, a stage's send to a neighbour then never waits behind its own receive from
  // that neighbour (1F1B's steady state has both stages send first); each group's sends and
  // receives must still come in the same order on both sides (NCCL ignores tags).
  // The group for a send to (a receive from) the pp rank `peer`:
  ProcessGroup& pp_to(int peer);
  ProcessGroup& pp_from(int peer);
  // Shared: the model's tensor-parallel comm keeps it alive.
  std::shared_ptr<ProcessGroup> tp_group() const { return tp_; }
  ProcessGroup& tp() { return *tp_; }

 private:
  RankCoordinates coordinates_;
  std::shared_ptr<ProcessGroup> world_;
  std::shared_ptr<ProcessGroup> tp_;
  std::shared_ptr<ProcessGroup> dp_;
  std::shared_ptr<ProcessGroup> pp_;
  std::shared_ptr<ProcessGroup> pp_down_;
};

// The model's tensor-parallel comm (executor/model.hpp) over a process group. Sequence
// parallelism's all-gather and reduce-scatter are the group's: NCCL's own collectives on CUDA; on
// Gloo (LibTorch 1.13 has no reduce-scatter there) the reduce-scatter is an all-reduce of which
// each rank keeps its chunk, moving twice the bytes of a ring reduce-scatter
// (ProcessGroup::reduce_scatter_sum, the one place to swap in a ring).
class GroupTensorParallelComm final : public TensorParallelComm {
 public:
  explicit GroupTensorParallelComm(std::shared_ptr<ProcessGroup> group)
      : group_(std::move(group)) {}
  int rank() const override { return group_->rank(); }
  int size() const override { return group_->size(); }
  void allreduce_sum(torch::Tensor& tensor) override { group_->allreduce_sum(tensor); }
  void allgather(torch::Tensor& output, const torch::Tensor& input) override {
    group_->allgather(output, input);
  }
  void reduce_scatter_sum(torch::Tensor& output, const torch::Tensor& input) override {
    group_->reduce_scatter_sum(output, input);
  }

 private:
  std::shared_ptr<ProcessGroup> group_;
};

}  // namespace loom::executor
