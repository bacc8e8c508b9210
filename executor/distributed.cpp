#include "executor/distributed.hpp"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <utility>

#include "executor/backends.hpp"
#include "executor/torch_compat.hpp"
#include "profiles/errors.hpp"

namespace loom::executor {

std::string error_text(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) {
    return c10_error->what_without_backtrace();
  }
  return e.what();
}

namespace {

std::string join_ranks(const std::vector<int>& ranks) {
  std::ostringstream out;
  for (std::size_t i = 0; i < ranks.size(); ++i) out << (i > 0 ? "," : "") << ranks[i];
  return out.str();
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Pending operations

// Gloo's worker thread drops its reference to a finished work a moment after completing it. If
// that is the last one, the work's tensors are freed on the worker thread, where LibTorch's
// allocator reports do not reach the rank's memory counter (which then never sees them leave).
// So the waiting rank thread gives the worker a moment (FinishedWorks::kGrace) to let go and drops
// the work itself; a work still held after that goes to its group's list, which drops what nothing
// else holds at the group's next operation and at the group's end. The hot path never waits longer
// than the grace, and the list is bounded (the oldest entries are dropped, wherever they free).
// A named namespace, not an anonymous one: the group's Impl structs below hold these types, and
// GCC warns (-Wsubobject-linkage) when a class with linkage holds a type without it outside the
// main file, as this file is when compiled in its unity group (executor/CMakeLists.txt).
namespace group_detail {

class FinishedWorks {
 public:
  static constexpr auto kGrace = std::chrono::microseconds(500);
  static constexpr std::size_t kMostKept = 64;

  void keep(c10::intrusive_ptr<c10d::Work> work) {
    const auto give_up = std::chrono::steady_clock::now() + kGrace;
    while (work.use_count() > 1 && std::chrono::steady_clock::now() < give_up) {
      std::this_thread::yield();
    }
    if (work.use_count() <= 1) return;  // the last reference: released here, now
    const std::lock_guard<std::mutex> lock(mutex_);
    if (works_.size() >= kMostKept) works_.erase(works_.begin());
    works_.push_back(std::move(work));
  }
  // Drops the works that nothing else holds any more.
  void sweep() {
    const std::lock_guard<std::mutex> lock(mutex_);
    works_.erase(std::remove_if(works_.begin(), works_.end(),
                                [](const auto& w) { return w.use_count() <= 1; }),
                 works_.end());
  }

 private:
  std::mutex mutex_;  // hooks of the backward pass may wait on another thread (CUDA autograd)
  std::vector<c10::intrusive_ptr<c10d::Work>> works_;
};

// One operation run by a P2pStream: done once its task returned or threw (`error`).
class StreamOp {
 public:
  // Called once by the stream thread.
  void finish(std::string error) {
    const std::lock_guard<std::mutex> lock(mutex_);
    error_ = std::move(error);
    done_ = true;
    changed_.notify_all();
  }
  bool done() {
    const std::lock_guard<std::mutex> lock(mutex_);
    return done_;
  }
  // Blocks until finished (the task ends within the group's timeout); its error, empty if none.
  std::string await() {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [this] { return done_; });
    return error_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  bool done_ = false;
  std::string error_;
};

// Under GroupOptions::p2p_by_order, the group's point-to-point operations run on a thread of their
// own, one at a time and in the order posted, as on one NCCL stream (a communicator whose
// point-to-point work shares the stream, as an eagerly initialised one does): a send holds every
// operation after it until it is received, while the rank's own thread (its compute stream) goes
// on. A receive's wait() is the compute stream waiting for the data.
class P2pStream {
 public:
  P2pStream() : thread_([this] { run(); }) {}
  ~P2pStream() {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    changed_.notify_all();
    thread_.join();
  }
  P2pStream(const P2pStream&) = delete;
  P2pStream& operator=(const P2pStream&) = delete;

  // Queues `task`, which posts one operation and waits for it (throwing on failure).
  std::shared_ptr<StreamOp> post(std::function<void()> task) {
    auto op = std::make_shared<StreamOp>();
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      queue_.emplace_back(std::move(task), op);
    }
    changed_.notify_all();
    return op;
  }

 private:
  void run() {
    for (;;) {
      std::pair<std::function<void()>, std::shared_ptr<StreamOp>> next;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        changed_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;
        next = std::move(queue_.front());
        queue_.pop_front();
      }
      std::string error;
      if (!failed_.empty()) {  // as on a stream whose earlier work failed: not run at all
        error = "not started: an earlier point-to-point operation of this group failed (" +
                failed_ + ")";
      } else {
        try {
          next.first();
        } catch (const std::exception& e) {
          error = error_text(e);
          failed_ = error;
        }
      }
      // The task's tensors go on the rank's own thread, whose memory counter saw them come.
      next.first = nullptr;
      next.second->finish(std::move(error));
    }
  }

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::pair<std::function<void()>, std::shared_ptr<StreamOp>>> queue_;
  bool stopping_ = false;
  std::string failed_;  // the stream thread's own: the first failure, after which nothing runs
  std::thread thread_;  // last: starts once the members above exist
};

}  // namespace group_detail

using group_detail::FinishedWorks;
using group_detail::P2pStream;
using group_detail::StreamOp;

struct PendingOperation::Impl {
  c10::intrusive_ptr<c10d::Work> work;
  std::shared_ptr<StreamOp> stream_op;  // instead of `work`: run by the group's P2pStream
  std::chrono::milliseconds timeout{0};
  std::function<void(const std::string&)> on_failure;  // throws
  torch::Tensor keep_alive;
  std::function<void()> after;  // host_staging: copies the result back, once done
  bool done = false;
  FinishedWorks* finished = nullptr;  // Gloo: the group's list; the group outlives the operation
};

PendingOperation::PendingOperation(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PendingOperation::PendingOperation(PendingOperation&&) noexcept = default;
PendingOperation& PendingOperation::operator=(PendingOperation&&) noexcept = default;

PendingOperation::~PendingOperation() {
  if (!impl_ || impl_->done) return;
  if (impl_->stream_op) {
    impl_->stream_op->await();
    return;
  }
  if (!impl_->work) return;
  try {
    if (impl_->work->wait(impl_->timeout) && impl_->after) impl_->after();
  } catch (...) {  // NOLINT(bugprone-empty-catch): a destructor must not throw
  }
}

void PendingOperation::then(std::function<void()> after) {
  if (!impl_ || impl_->done) {
    after();
    return;
  }
  impl_->after = std::move(after);
}

bool PendingOperation::completed() const {
  if (!impl_ || impl_->done) return true;
  if (impl_->stream_op) return impl_->stream_op->done();
  if (!impl_->work) return true;
  try {
    return impl_->work->isCompleted();
  } catch (const std::exception&) {
    return true;  // failed: wait() reports it
  }
}

void PendingOperation::wait() {
  if (!impl_ || impl_->done) return;
  impl_->done = true;
  if (impl_->stream_op) {
    const std::string error = impl_->stream_op->await();
    impl_->keep_alive = torch::Tensor();
    if (!error.empty()) impl_->on_failure(error);
    return;
  }
  if (!impl_->work) return;
  bool completed = false;
  std::string what;
  try {
    completed = impl_->work->wait(impl_->timeout);
    if (!completed) what = "not completed within the timeout";
  } catch (const std::exception& e) {
    what = error_text(e);
  }
  if (!completed) impl_->on_failure(what);
  if (impl_->after) impl_->after();
  impl_->keep_alive = torch::Tensor();
  if (impl_->finished != nullptr) impl_->finished->keep(std::move(impl_->work));
  impl_->work.reset();
}

// ---------------------------------------------------------------------------------------------
// Groups

struct ProcessGroup::Impl {
  // Gloo works its worker still held when they were waited for. Declared before the backend, so
  // destroyed after it, when Gloo's workers are joined and the list holds the last references.
  FinishedWorks finished;
  c10::intrusive_ptr<compat::CollectiveBackend> backend;  // null for a group of one
  CommBackend kind = CommBackend::kGloo;
  int device_index = 0;  // NCCL: this rank's CUDA device
  int watch_world_size = 0;
  bool p2p_by_order = false;
  bool host_staging = false;
  std::map<std::pair<bool, int>, int> p2p_counts;  // (send?, peer) -> operations so far
  // p2p_by_order: the thread that runs the point-to-point operations. Declared after the backend,
  // so joined before the backend goes.
  std::unique_ptr<P2pStream> stream;
};

ProcessGroup::ProcessGroup(const c10::intrusive_ptr<c10d::Store>& store, std::string name,
                           std::vector<int> members, int world_rank, const GroupOptions& options)
    : name_(std::move(name)),
      members_(std::move(members)),
      world_rank_(world_rank),
      timeout_(options.timeout),
      store_(store),
      impl_(std::make_unique<Impl>()) {
  const auto found = std::find(members_.begin(), members_.end(), world_rank);
  if (found == members_.end()) {
    throw std::invalid_argument("ProcessGroup " + name_ + ": rank " + std::to_string(world_rank) +
                                " is not a member");
  }
  rank_ = static_cast<int>(found - members_.begin());
  impl_->kind = options.backend;
  impl_->device_index = options.device_index;
  impl_->watch_world_size = options.watch_world_size;
  impl_->p2p_by_order = options.p2p_by_order && options.backend == CommBackend::kGloo;
  impl_->host_staging = options.host_staging && options.backend == CommBackend::kGloo;
  if (members_.size() == 1) return;
  try {
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>("loom/" + name_ + "/", store);
    if (options.backend == CommBackend::kNccl) {
      impl_->backend = make_nccl_backend(prefixed, rank_, size(), timeout_);
    } else {
      impl_->backend =
          make_gloo_backend(prefixed, rank_, size(), timeout_, options.host, options.interface);
    }
  } catch (const std::exception& e) {
    fail("joining the group", error_text(e));
  }
  if (impl_->p2p_by_order) impl_->stream = std::make_unique<P2pStream>();
}

ProcessGroup::~ProcessGroup() {
  if (impl_->backend && impl_->kind == CommBackend::kNccl) {
    try {
      shutdown_nccl_backend(impl_->backend);
    } catch (...) {  // NOLINT(bugprone-empty-catch): a destructor must not throw
    }
  }
}

void ProcessGroup::fail(const std::string& operation, const std::string& what) const {
  std::ostringstream message;
  const double timeout_s = static_cast<double>(timeout_.count()) / 1000.0;
  message << "rank " << world_rank_ << ": " << operation << " on group " << name_ << " (ranks "
          << join_ranks(members_) << ", timeout " << timeout_s << " s) failed: " << what;
  // Every rank that fails says so in the store; the ranks that do not within one timeout are the
  // lost ones.
  const std::string prefix = "loom/failed/";
  std::vector<int> watch;
  if (impl_->watch_world_size > 0) {
    watch.reserve(static_cast<std::size_t>(impl_->watch_world_size));
    for (int r = 0; r < impl_->watch_world_size; ++r) watch.push_back(r);
  } else {
    watch = members_;
  }
  bool store_alive = true;
  try {
    const std::string text = operation + " on " + name_;
    store_->set(prefix + std::to_string(world_rank_),
                std::vector<uint8_t>(text.begin(), text.end()));
  } catch (const std::exception&) {
    store_alive = false;
  }
  std::vector<int> silent;
  for (int r : watch) {
    if (r != world_rank_) silent.push_back(r);
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  while (store_alive && !silent.empty() && std::chrono::steady_clock::now() < deadline) {
    try {
      std::vector<int> still;
      for (int r : silent) {
        if (!store_->check({prefix + std::to_string(r)})) still.push_back(r);
      }
      silent = std::move(still);
    } catch (const std::exception&) {
      store_alive = false;
      break;
    }
    if (!silent.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (!store_alive) {
    message << "; the rendezvous store is unreachable: its host, rank 0, is lost";
  } else if (!silent.empty()) {
    message << "; lost rank(s) " << join_ranks(silent) << " (no failure report within " << timeout_s
            << " s)";
  } else {
    message << "; no rank is lost (all reported a failure)";
  }
  throw CollectiveError(message.str());
}

namespace {

// The tensor a backend may work on: `tensor` itself when contiguous, else a contiguous copy.
torch::Tensor contiguous_buffer(const torch::Tensor& tensor) {
  return tensor.is_contiguous() ? tensor : tensor.contiguous();
}

// Starts the collective `issue()` calls on the backend (it returns the c10d work), keeping
// `tensor` alive until the operation completes; an exception from c10d becomes the group's
// failure (the operation's on_failure throws).
template <typename Issue>
PendingOperation started(std::unique_ptr<PendingOperation::Impl> impl, const torch::Tensor& tensor,
                         Issue&& issue) {
  try {
    impl->work = issue();
  } catch (const std::exception& e) {
    impl->on_failure(error_text(e));
  }
  impl->keep_alive = tensor;
  return PendingOperation(std::move(impl));
}

}  // namespace

std::unique_ptr<PendingOperation::Impl> ProcessGroup::new_operation(std::string name) const {
  auto impl = std::make_unique<PendingOperation::Impl>();
  if (impl_->kind == CommBackend::kGloo) {
    impl_->finished.sweep();
    impl->finished = &impl_->finished;
  }
  impl->timeout = wait_timeout(impl_->kind == CommBackend::kNccl, timeout_);
  impl->on_failure = [this, name = std::move(name)](const std::string& what) { fail(name, what); };
  return impl;
}

bool ProcessGroup::stages_through_device(const torch::Tensor& tensor) const {
  return impl_->kind == CommBackend::kNccl && !tensor.is_cuda();
}

torch::Tensor ProcessGroup::operand(const torch::Tensor& tensor) const {
  if (!impl_->host_staging) return contiguous_buffer(tensor);
  return torch::empty(tensor.sizes(), tensor.options().device(torch::kCPU)).copy_(tensor);
}

void ProcessGroup::refuse_host_tensor(const std::string& operation,
                                      const torch::Tensor& tensor) const {
  if (stages_through_device(tensor)) fail(operation, "a CPU tensor on an NCCL group (a bug)");
}

void ProcessGroup::allreduce_sum(torch::Tensor& tensor) {
  if (size() == 1) return;
  // NCCL reduces device memory only: a host value goes to this rank's device and back.
  torch::Tensor buffer =
      stages_through_device(tensor)
          ? tensor.to(torch::Device(torch::kCUDA, impl_->device_index)).contiguous()
          : contiguous_buffer(tensor);
  PendingOperation pending = allreduce_sum_async(buffer);
  pending.wait();
  if (!buffer.is_same(tensor)) tensor.copy_(buffer);
}

PendingOperation ProcessGroup::allreduce_sum_async(torch::Tensor& tensor) {
  auto impl = new_operation("allreduce_sum");
  if (size() == 1) return PendingOperation(std::move(impl));
  refuse_host_tensor("allreduce_sum", tensor);
  if (!tensor.is_contiguous()) fail("allreduce_sum", "a non-contiguous tensor (a bug)");
  c10d::AllreduceOptions options;
  options.reduceOp = c10d::ReduceOp::SUM;
  options.timeout = timeout_;
  torch::Tensor wire = operand(tensor);
  if (!wire.is_same(tensor)) impl->after = [tensor, wire]() mutable { tensor.copy_(wire); };
  return started(std::move(impl), wire, [&] {
    std::vector<torch::Tensor> tensors{wire};
    return impl_->backend->allreduce(tensors, options);
  });
}

void ProcessGroup::allgather(torch::Tensor& output, const torch::Tensor& input) {
  const std::int64_t n = input.numel();
  if (output.numel() != n * size()) {
    fail("allgather", "an output of " + std::to_string(n * size()) + " elements (a bug)");
  }
  torch::Tensor flat_in = contiguous_buffer(input).view({n});
  if (size() == 1) {
    output.view({n}).copy_(flat_in);
    return;
  }
  refuse_host_tensor("allgather", output);
  torch::Tensor flat_out = contiguous_buffer(output).view({size() * n});
  torch::Tensor output_buffer = flat_out;
  for (PendingOperation& p : allgather_async(flat_out, flat_in)) p.wait();
  if (!output_buffer.is_same(output) && output_buffer.data_ptr() != output.data_ptr()) {
    output.copy_(output_buffer.view(output.sizes()));
  }
}

// NCCL gathers the whole flat buffer at once. On Gloo each rank broadcasts its chunk straight
// into its slice of the output: the same bytes per rank as a ring all-gather, with no temporary
// and no copies, where Gloo's list all-gather flattens the input, stages the whole output in a
// temporary and copies it out (about twice the time on CPU ranks: bench/RESULTS.md, "ZeRO on
// the CPU", and bench/reports/2026-11-26-zero-cpu.md).
std::vector<PendingOperation> ProcessGroup::allgather_async(torch::Tensor& output,
                                                            const torch::Tensor& input) {
  const std::int64_t n = input.numel();
  if (output.numel() != n * size() || !output.is_contiguous() || !input.is_contiguous()) {
    fail("allgather", "a contiguous output of " + std::to_string(n * size()) +
                          " elements and a contiguous input (a bug)");
  }
  std::vector<PendingOperation> out;
  torch::Tensor flat_in = input.view({n});
  torch::Tensor flat_out = output.view({size() * n});
  torch::Tensor mine = flat_out.narrow(0, static_cast<std::int64_t>(rank_) * n, n);
  if (size() == 1) {
    if (mine.data_ptr() != flat_in.data_ptr()) mine.copy_(flat_in);
    return out;
  }
  refuse_host_tensor("allgather", output);
  if (impl_->kind == CommBackend::kNccl) {
    c10d::AllgatherOptions options;
    options.timeout = timeout_;
    out.push_back(started(new_operation("allgather"), flat_out, [&] {
      return impl_->backend->_allgather_base(flat_out, flat_in, options);
    }));
    return out;
  }
  if (mine.data_ptr() != flat_in.data_ptr()) mine.copy_(flat_in);
  torch::Tensor wire = operand(flat_out);
  // Staged: the output gets the host buffer back once the last broadcast is waited for.
  auto remaining = std::make_shared<int>(size());
  for (int root = 0; root < size(); ++root) {
    torch::Tensor slice = wire.narrow(0, static_cast<std::int64_t>(root) * n, n);
    out.push_back(start_broadcast(slice, root, "allgather"));
    if (!wire.is_same(flat_out)) {
      out.back().then([flat_out, wire, remaining]() mutable {
        if (--*remaining == 0) flat_out.copy_(wire);
      });
    }
  }
  return out;
}

void ProcessGroup::reduce_scatter_sum(torch::Tensor& output, const torch::Tensor& input) {
  const std::int64_t n = output.numel();
  if (input.numel() != n * size()) {
    fail("reduce_scatter_sum", "an input of " + std::to_string(n * size()) + " elements (a bug)");
  }
  if (size() == 1) {
    output.copy_(input.reshape(output.sizes()));
    return;
  }
  torch::Tensor flat_in = contiguous_buffer(input).view({size() * n});
  reduce_scatter_sum_async(flat_in).wait();
  const torch::Tensor mine = flat_in.narrow(0, static_cast<std::int64_t>(rank_) * n, n);
  if (mine.data_ptr() != output.data_ptr()) output.copy_(mine.view(output.sizes()));
}

// NCCL reduce-scatters in place (the output is this rank's chunk of the input). Gloo all-reduces
// the whole input: twice the bytes of a ring reduce-scatter, but faster on CPU ranks than a ring
// of point-to-point sends (bench/RESULTS.md, ZeRO on the CPU); costmodel's loom runtime charges
// it so.
PendingOperation ProcessGroup::reduce_scatter_sum_async(torch::Tensor& input) {
  const std::int64_t n = input.numel() / size();
  if (input.numel() != n * size() || !input.is_contiguous()) {
    fail("reduce_scatter_sum",
         "a contiguous input of a multiple of " + std::to_string(size()) + " elements (a bug)");
  }
  if (impl_->kind != CommBackend::kNccl || size() == 1) return allreduce_sum_async(input);
  refuse_host_tensor("reduce_scatter_sum", input);
  torch::Tensor flat_in = input.view({size() * n});
  torch::Tensor mine = flat_in.narrow(0, static_cast<std::int64_t>(rank_) * n, n);
  c10d::ReduceScatterOptions options;
  options.reduceOp = c10d::ReduceOp::SUM;
  options.timeout = timeout_;
  return started(new_operation("reduce_scatter_sum"), flat_in,
                 [&] { return impl_->backend->_reduce_scatter_base(mine, flat_in, options); });
}

PendingOperation ProcessGroup::start_broadcast(torch::Tensor& tensor, int root,
                                               const std::string& operation) {
  c10d::BroadcastOptions options;
  options.rootRank = root;
  options.timeout = timeout_;
  return started(new_operation(operation), tensor, [&] {
    std::vector<torch::Tensor> tensors{tensor};
    return impl_->backend->broadcast(tensors, options);
  });
}

PendingOperation ProcessGroup::broadcast_async(torch::Tensor& tensor, int root) {
  if (size() == 1) return PendingOperation(new_operation("broadcast"));
  if (!tensor.is_contiguous()) fail("broadcast", "a non-contiguous tensor (a bug)");
  refuse_host_tensor("broadcast", tensor);
  torch::Tensor wire = operand(tensor);
  PendingOperation pending = start_broadcast(wire, root, "broadcast");
  if (!wire.is_same(tensor)) pending.then([tensor, wire]() mutable { tensor.copy_(wire); });
  return pending;
}

void ProcessGroup::broadcast(torch::Tensor& tensor, int root) {
  if (size() == 1) return;
  torch::Tensor buffer =
      stages_through_device(tensor)
          ? tensor.to(torch::Device(torch::kCUDA, impl_->device_index)).contiguous()
          : operand(tensor);
  start_broadcast(buffer, root, "broadcast").wait();
  if (!buffer.is_same(tensor)) tensor.copy_(buffer);
}

int ProcessGroup::wire_tag(bool send, int peer, int tag) {
  if (!impl_->p2p_by_order) return tag;
  return impl_->p2p_counts[{send, peer}]++;
}

std::string ProcessGroup::describe_p2p(bool send, int peer, int tag) const {
  return std::string(send ? "send to" : "recv from") + " rank " +
         std::to_string(members_.at(static_cast<std::size_t>(peer))) + " (tag " +
         std::to_string(tag) + ")";
}

PendingOperation ProcessGroup::send(const torch::Tensor& tensor, int destination, int tag) {
  const std::string operation = describe_p2p(true, destination, tag);
  auto impl = new_operation(operation);
  if (size() == 1) fail(operation, "a group of one has no peer (a bug)");
  refuse_host_tensor(operation, tensor);
  torch::Tensor buffer = operand(tensor);
  std::vector<torch::Tensor> tensors{buffer};
  impl->keep_alive = buffer;
  const int wire = wire_tag(true, destination, tag);
  if (impl_->stream) {
    impl->stream_op = impl_->stream->post(stream_task(true, tensors, destination, wire));
    return PendingOperation(std::move(impl));
  }
  try {
    impl->work = impl_->backend->send(tensors, destination, wire);
  } catch (const std::exception& e) {
    fail(operation, error_text(e));
  }
  return PendingOperation(std::move(impl));
}

std::function<void()> ProcessGroup::stream_task(bool send, std::vector<torch::Tensor> tensors,
                                                int peer, int tag) const {
  return [backend = impl_->backend, tensors = std::move(tensors), send, peer, tag,
          timeout = timeout_]() mutable {
    const auto work = send ? backend->send(tensors, peer, tag) : backend->recv(tensors, peer, tag);
    if (!work->wait(timeout)) throw std::runtime_error("not completed within the timeout");
  };
}

void ProcessGroup::recv(torch::Tensor& tensor, int source, int tag) {
  const std::string operation = describe_p2p(false, source, tag);
  if (size() == 1) fail(operation, "a group of one has no peer (a bug)");
  refuse_host_tensor(operation, tensor);
  torch::Tensor buffer = operand(tensor);
  auto impl = new_operation(operation);
  std::vector<torch::Tensor> tensors{buffer};
  const int wire = wire_tag(false, source, tag);
  if (impl_->stream) {
    impl->stream_op = impl_->stream->post(stream_task(false, tensors, source, wire));
  } else {
    try {
      impl->work = impl_->backend->recv(tensors, source, wire);
    } catch (const std::exception& e) {
      fail(operation, error_text(e));
    }
  }
  PendingOperation(std::move(impl)).wait();
  if (!buffer.is_same(tensor)) tensor.copy_(buffer);
}

void ProcessGroup::barrier() {
  if (size() == 1) return;
  auto impl = new_operation("barrier");
  c10d::BarrierOptions options;
  options.timeout = timeout_;
  // NCCL's barrier is an all-reduce on a device: this rank's, not one guessed from its rank in
  // the group (which differs from the local device in groups across nodes).
  if (impl_->kind == CommBackend::kNccl) options.device_ids = {impl_->device_index};
  try {
    impl->work = impl_->backend->barrier(options);
  } catch (const std::exception& e) {
    fail("barrier", error_text(e));
  }
  PendingOperation(std::move(impl)).wait();
}

}  // namespace loom::executor
