// Megatron's tensor- and sequence-parallel operations of executor/model.hpp: the collectives as
// autograd functions, the parallel linears, and the tp comm's all-reduce fallbacks.
#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "executor/model.hpp"

namespace loom::executor {

// ---------------------------------------------------------------------------------------------
// Tensor parallelism

namespace {

// g: the forward all-reduces a copy, the backward passes the gradient through.
struct ReduceFromTensorParallel : torch::autograd::Function<ReduceFromTensorParallel> {
  static torch::Tensor forward(torch::autograd::AutogradContext* /*ctx*/, const torch::Tensor& x,
                               TensorParallelComm* comm) {
    torch::Tensor sum = x.clone();
    comm->allreduce_sum(sum);
    return sum;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* /*ctx*/,
                                                 torch::autograd::variable_list grads) {
    return {grads[0], torch::Tensor()};
  }
};

// [batch, seq, ...] <-> [size, batch, seq / size, ...]: the layout in which the sequence chunks
// of the ranks are the contiguous blocks a flat all-gather / reduce-scatter exchanges.
torch::Tensor chunks_first(const torch::Tensor& x, int size) {
  std::vector<std::int64_t> shape = x.sizes().vec();
  shape[1] /= size;
  shape.insert(shape.begin() + 1, size);
  return x.reshape(shape).transpose(0, 1).contiguous();
}

torch::Tensor chunks_joined(const torch::Tensor& chunks) {
  std::vector<std::int64_t> shape = chunks.sizes().vec();
  const std::int64_t size = shape[0];
  shape.erase(shape.begin());
  shape[1] *= size;
  return chunks.transpose(0, 1).reshape(shape);
}

torch::Tensor all_gather_sequence(const torch::Tensor& shard, TensorParallelComm* comm) {
  std::vector<std::int64_t> shape = shard.sizes().vec();
  shape.insert(shape.begin(), comm->size());
  torch::Tensor chunks = torch::empty(shape, shard.options());
  comm->allgather(chunks, shard.contiguous());
  return chunks_joined(chunks);
}

torch::Tensor reduce_scatter_sequence(const torch::Tensor& x, TensorParallelComm* comm) {
  TORCH_CHECK(x.size(1) % comm->size() == 0,
              "sequence parallelism: a sequence length divisible by the tp size");
  const torch::Tensor chunks = chunks_first(x, comm->size());
  std::vector<std::int64_t> shape = x.sizes().vec();
  shape[1] /= comm->size();
  torch::Tensor out = torch::empty(shape, x.options());
  comm->reduce_scatter_sum(out, chunks);
  return out;
}

// All-gather along the sequence forward, reduce-scatter of the gradient backward.
struct GatherSequence : torch::autograd::Function<GatherSequence> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               TensorParallelComm* comm) {
    ctx->saved_data["comm"] = reinterpret_cast<std::int64_t>(comm);
    return all_gather_sequence(x, comm);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* comm = reinterpret_cast<TensorParallelComm*>(ctx->saved_data["comm"].toInt());
    return {reduce_scatter_sequence(grads[0], comm), torch::Tensor()};
  }
};

// Reduce-scatter along the sequence forward, all-gather of the gradient backward.
struct ReduceScatterSequence : torch::autograd::Function<ReduceScatterSequence> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               TensorParallelComm* comm) {
    ctx->saved_data["comm"] = reinterpret_cast<std::int64_t>(comm);
    return reduce_scatter_sequence(x, comm);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* comm = reinterpret_cast<TensorParallelComm*>(ctx->saved_data["comm"].toInt());
    return {all_gather_sequence(grads[0], comm), torch::Tensor()};
  }
};

}  // namespace

void TensorParallelComm::allgather(torch::Tensor& output, const torch::Tensor& input) {
  const std::int64_t n = input.numel();
  torch::Tensor flat = torch::zeros({size() * n}, input.options());
  flat.narrow(0, rank() * n, n).copy_(input.reshape({n}));
  allreduce_sum(flat);
  output.view({size() * n}).copy_(flat);
}

void TensorParallelComm::reduce_scatter_sum(torch::Tensor& output, const torch::Tensor& input) {
  const std::int64_t n = output.numel();
  torch::Tensor sum = input.reshape({size() * n}).clone();
  allreduce_sum(sum);
  output.view({n}).copy_(sum.narrow(0, rank() * n, n));
}

torch::Tensor gather_sequence_parallel(const torch::Tensor& x_shard,
                                       const std::shared_ptr<TensorParallelComm>& comm) {
  if (comm->size() == 1) return x_shard;
  return GatherSequence::apply(x_shard, comm.get());
}

torch::Tensor reduce_scatter_sequence_parallel(const torch::Tensor& x,
                                               const std::shared_ptr<TensorParallelComm>& comm) {
  if (comm->size() == 1) return x;
  return ReduceScatterSequence::apply(x, comm.get());
}

torch::Tensor copy_to_tensor_parallel(const torch::Tensor& x,
                                      const std::shared_ptr<TensorParallelComm>& comm) {
  if (comm->size() == 1 || !x.requires_grad() || !torch::GradMode::is_enabled()) return x;
  torch::Tensor y = x.view_as(x);
  y.register_hook([comm](const torch::Tensor& grad) {
    torch::Tensor sum = grad.clone();
    comm->allreduce_sum(sum);
    return sum;
  });
  return y;
}

torch::Tensor reduce_from_tensor_parallel(const torch::Tensor& x,
                                          const std::shared_ptr<TensorParallelComm>& comm) {
  if (comm->size() == 1) return x;
  return ReduceFromTensorParallel::apply(x, comm.get());
}

torch::Tensor column_parallel_linear(const torch::Tensor& x, const torch::Tensor& weight_shard,
                                     const torch::Tensor& bias_shard,
                                     const std::shared_ptr<TensorParallelComm>& comm) {
  return torch::linear(copy_to_tensor_parallel(x, comm), weight_shard, bias_shard);
}

torch::Tensor row_parallel_linear(const torch::Tensor& x_shard, const torch::Tensor& weight_shard,
                                  const torch::Tensor& bias,
                                  const std::shared_ptr<TensorParallelComm>& comm) {
  if (comm->size() == 1) return torch::linear(x_shard, weight_shard, bias);
  torch::Tensor y = reduce_from_tensor_parallel(torch::linear(x_shard, weight_shard), comm);
  return bias.defined() ? y + bias : y;
}

}  // namespace loom::executor
