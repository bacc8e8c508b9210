#include "executor/flat_parameters.hpp"

#include <algorithm>

#include "profiles/errors.hpp"

namespace loom::executor {

namespace {

// The maximal runs of true elements of a 1-D bool tensor, as (start, length).
FlatRanges true_ranges(const torch::Tensor& mask) {
  const torch::Tensor cpu = mask.to(torch::kCPU).contiguous();
  const bool* data = cpu.data_ptr<bool>();
  FlatRanges out;
  const std::int64_t n = cpu.numel();
  for (std::int64_t i = 0; i < n;) {
    if (!data[i]) {
      ++i;
      continue;
    }
    std::int64_t j = i;
    while (j < n && data[j]) ++j;
    out.emplace_back(i, j - i);
    i = j;
  }
  return out;
}

}  // namespace

FlatParameters::FlatParameters(const std::vector<std::vector<FlatParameter>>& chunks,
                               const FlatOptions& o, ParallelGroups& groups,
                               const torch::Device& device)
    : zero_(costmodel::zero_policy(o.zero)), weight_decay_(o.weight_decay), groups_(groups) {
  const int dp = groups.dp_size();
  sharded_gradients_ = zero_.shards_gradients && dp > 1;
  std::vector<std::size_t> chunk_ends;
  for (const std::vector<FlatParameter>& chunk : chunks) {
    for (const FlatParameter& entry : chunk) {
      const torch::Tensor& parameter = entry.tensor;
      parameters_.push_back(parameter);
      offsets_.push_back(numel_);
      numels_.push_back(parameter.numel());
      shapes_.push_back(parameter.sizes().vec());
      numel_ += parameter.numel();
    }
    chunk_ends.push_back(parameters_.size());
  }
  padded_ = (numel_ + dp - 1) / dp * dp;
  shard_numel_ = padded_ / dp;
  shard_offset_ = zero_.shards_optimizer_states ? groups.coordinates().dp * shard_numel_ : 0;
  const std::int64_t updated = zero_.shards_optimizer_states ? shard_numel_ : padded_;
  const auto options = torch::TensorOptions().dtype(torch::kFloat).device(device);
  copy_into_flat(chunks, options);
  const std::int64_t bucket_numel = std::max<std::int64_t>(o.bucket_bytes / 4, 1);
  if (sharded_gradients_) {
    // Before ZeRO-3's release: a hooked gradient accumulator keeps the parameter's shape.
    shard_grad_ = torch::zeros({shard_numel_}, options);
    make_shard_buckets(chunk_ends, bucket_numel);
    std::int64_t largest = 1;
    for (const ShardBucket& b : shard_buckets_) {
      largest = std::max(largest, offsets_[b.last - 1] + numels_[b.last - 1] - offsets_[b.first]);
    }
    staging_ = torch::empty({std::min(largest, bucket_numel)}, options);
  }
  if (zero_.shards_parameters) {
    shard_ = flat_.narrow(0, shard_offset_, shard_numel_).clone();
    release();
  } else {
    bind();
    if (o.overlap && dp > 1 && !zero_.reduces_every_micro_batch) make_buckets(bucket_numel);
  }
  // After the parameters moved into the flat buffer (their first copies are freed by then).
  exp_avg_ = torch::zeros({updated}, options);
  exp_avg_sq_ = torch::zeros({updated}, options);
}

// Fills the flat buffer with the parameters' values and computes the decay and norm ranges of
// the updated part (ranges, not per-element masks, which would cost another copy of it).
void FlatParameters::copy_into_flat(const std::vector<std::vector<FlatParameter>>& chunks,
                                    const torch::TensorOptions& options) {
  const std::int64_t updated = zero_.shards_optimizer_states ? shard_numel_ : padded_;
  torch::Tensor decay = torch::zeros({padded_}, options.dtype(torch::kBool));
  torch::Tensor counted = torch::zeros({padded_}, options.dtype(torch::kBool));
  flat_ = torch::zeros({padded_}, options);
  {
    torch::NoGradGuard no_grad;
    std::size_t i = 0;
    for (const std::vector<FlatParameter>& chunk : chunks) {
      for (const FlatParameter& entry : chunk) {
        const std::int64_t n = parameters_[i].numel();
        flat_.narrow(0, offsets_[i], n).copy_(parameters_[i].reshape({n}));
        if (entry.decays) decay.narrow(0, offsets_[i], n).fill_(true);
        if (entry.counted) counted.narrow(0, offsets_[i], n).fill_(true);
        ++i;
      }
    }
  }
  decay_ranges_ = true_ranges(decay.narrow(0, shard_offset_, updated));
  counted_ranges_ = true_ranges(counted.narrow(0, shard_offset_, updated));
}

void FlatParameters::arm() {
  if (buckets_.empty()) return;
  armed_ = true;
  for (Bucket& b : buckets_) b.remaining = b.parameters;
  next_bucket_ = 0;
  pending_.clear();
}

void FlatParameters::materialize() {
  if (!zero_.gathers_before_forward || flat_.defined()) return;
  flat_ = torch::empty({padded_}, shard_.options());
  groups_.dp().allgather(flat_, shard_);
  bind();
}

void FlatParameters::release() {
  if (!zero_.shards_parameters) return;
  torch::NoGradGuard no_grad;
  for (torch::Tensor& p : parameters_) {
    p.set_data(torch::empty({0}, shard_.options()));
    p.mutable_grad() = torch::Tensor();
  }
  flat_ = torch::Tensor();
  grad_ = torch::Tensor();
}

void FlatParameters::zero_grad() {
  if (grad_.defined()) grad_.zero_();
  if (shard_grad_.defined()) shard_grad_.zero_();
  reduction_log_.clear();
}

void FlatParameters::finish_backward(int k) {
  if (!sharded_gradients_) return;
  ShardChunk& chunk = shard_chunks_[static_cast<std::size_t>(k)];
  while (chunk.next < chunk.end) reduce_shard_bucket(chunk.next++);
  for (std::size_t b = chunk.begin; b < chunk.end; ++b) {
    shard_buckets_[b].remaining = shard_buckets_[b].last - shard_buckets_[b].first;
  }
  chunk.next = chunk.begin;
}

std::vector<torch::Tensor> FlatParameters::state() const {
  return {(zero_.shards_parameters ? shard_ : flat_).to(torch::kCPU), exp_avg_.to(torch::kCPU),
          exp_avg_sq_.to(torch::kCPU), torch::tensor({step_}, torch::kLong)};
}

void FlatParameters::load_state(const std::vector<torch::Tensor>& state,
                                const std::string& source) {
  torch::Tensor& held = zero_.shards_parameters ? shard_ : flat_;
  if (state.size() != 4 || state[0].sizes() != held.sizes() ||
      state[1].sizes() != exp_avg_.sizes() || state[2].sizes() != exp_avg_sq_.sizes()) {
    throw InputError(source, "", "the parameters and AdamW state of this rank of this plan");
  }
  torch::NoGradGuard no_grad;
  held.copy_(state[0]);
  exp_avg_.copy_(state[1]);
  exp_avg_sq_.copy_(state[2]);
  step_ = state[3].item<std::int64_t>();
}

torch::Tensor FlatParameters::reduce_gradients() {
  const int dp = groups_.dp_size();
  if (sharded_gradients_) {  // reduced by finish_backward
    shard_grad_.div_(dp);
    return shard_grad_;
  }
  if (zero_.shards_gradients) {
    torch::Tensor shard = torch::empty({shard_numel_}, grad_.options());
    reduction_log_.emplace_back(0, padded_);
    groups_.dp().reduce_scatter_sum(shard, grad_);
    if (dp > 1) shard.div_(dp);
    return shard;
  }
  if (armed_) {  // buckets started during the backward pass: start the rest, wait for all
    armed_ = false;
    while (next_bucket_ < buckets_.size()) launch(next_bucket_++);
    for (PendingOperation& p : pending_) p.wait();
    pending_.clear();
  } else {
    reduction_log_.emplace_back(0, padded_);
    groups_.dp().allreduce_sum(grad_);
  }
  if (dp > 1) grad_.div_(dp);
  return zero_.shards_optimizer_states ? grad_.narrow(0, shard_offset_, shard_numel_) : grad_;
}

torch::Tensor FlatParameters::global_norm(const torch::Tensor& grad) {
  torch::Tensor sum = squared_norm(grad, counted_ranges_);
  if (zero_.reduces_norm_over_dp) groups_.dp().allreduce_sum(sum);
  groups_.tp().allreduce_sum(sum);
  groups_.pp().allreduce_sum(sum);
  return sum.sqrt();
}

void FlatParameters::step(const torch::Tensor& grad, double lr) {
  torch::Tensor p = zero_.shards_parameters         ? shard_
                    : zero_.shards_optimizer_states ? flat_.narrow(0, shard_offset_, shard_numel_)
                                                    : flat_;
  // One temporary of the updated part's size (the cost model's optimizer working set).
  flat_adamw_update(p, grad, exp_avg_, exp_avg_sq_, ++step_, lr, weight_decay_, decay_ranges_);
  // In place: this rank's updated part is its chunk of the gathered buffer.
  if (zero_.gathers_after_step) groups_.dp().allgather(flat_, p);
}

void FlatParameters::bind() {
  torch::NoGradGuard no_grad;
  if (!sharded_gradients_) grad_ = torch::zeros({padded_}, flat_.options());
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    const std::int64_t n = numels_[i];
    parameters_[i].set_data(flat_.narrow(0, offsets_[i], n).view(shapes_[i]));
    if (!sharded_gradients_) {
      parameters_[i].mutable_grad() = grad_.narrow(0, offsets_[i], n).view(shapes_[i]);
    }
  }
}

void FlatParameters::make_shard_buckets(const std::vector<std::size_t>& chunk_ends,
                                        std::int64_t bucket_numel) {
  std::vector<std::size_t> bucket_of(parameters_.size());
  std::size_t chunk_begin = 0;
  for (std::size_t chunk_end : chunk_ends) {
    ShardChunk chunk;
    chunk.begin = shard_buckets_.size();
    std::int64_t filled = bucket_numel;
    for (std::size_t k = chunk_end; k-- > chunk_begin;) {
      if (filled >= bucket_numel) {
        shard_buckets_.push_back({k, k + 1, 0});
        filled = 0;
      }
      shard_buckets_.back().first = k;
      filled += numels_[k];
      bucket_of[k] = shard_buckets_.size() - 1;
    }
    chunk.end = shard_buckets_.size();
    chunk.next = chunk.begin;
    shard_chunks_.push_back(chunk);
    chunk_begin = chunk_end;
  }
  for (ShardBucket& b : shard_buckets_) b.remaining = b.last - b.first;
  for (std::size_t k = 0; k < parameters_.size(); ++k) {
    const std::size_t index = bucket_of[k];
    std::size_t chunk_index = 0;
    while (shard_chunks_[chunk_index].end <= index) ++chunk_index;
    accumulators_.push_back(
        compat::add_gradient_ready_hook(parameters_[k], [this, index, chunk_index]() {
          --shard_buckets_[index].remaining;
          ShardChunk& chunk = shard_chunks_[chunk_index];
          while (chunk.next < chunk.end && shard_buckets_[chunk.next].remaining == 0) {
            reduce_shard_bucket(chunk.next++);
          }
        }));
  }
}

void FlatParameters::reduce_shard_bucket(std::size_t index) {
  const ShardBucket& b = shard_buckets_[index];
  const std::int64_t begin = offsets_[b.first];
  const std::int64_t end = offsets_[b.last - 1] + numels_[b.last - 1];
  torch::NoGradGuard no_grad;
  reduction_log_.emplace_back(begin, end - begin);
  const std::int64_t piece = staging_.numel();
  for (std::int64_t at = begin; at < end; at += piece) {
    const std::int64_t length = std::min(piece, end - at);
    torch::Tensor buffer = staging_.narrow(0, 0, length);
    for (std::size_t i = b.first; i < b.last; ++i) {
      const std::int64_t from = std::max(at, offsets_[i]);
      const std::int64_t to = std::min(at + length, offsets_[i] + numels_[i]);
      if (from >= to) continue;
      torch::Tensor slice = buffer.narrow(0, from - at, to - from);
      const torch::Tensor& g = parameters_[i].grad();
      if (g.defined()) {
        slice.copy_(g.reshape({numels_[i]}).narrow(0, from - offsets_[i], to - from));
      } else {
        slice.zero_();
      }
    }
    groups_.dp().allreduce_sum(buffer);
    const std::int64_t from = std::max(at, shard_offset_);
    const std::int64_t to = std::min(at + length, shard_offset_ + shard_numel_);
    if (from < to) {
      shard_grad_.narrow(0, from - shard_offset_, to - from)
          .add_(buffer.narrow(0, from - at, to - from));
    }
  }
  for (std::size_t i = b.first; i < b.last; ++i) parameters_[i].mutable_grad() = torch::Tensor();
}

void FlatParameters::make_buckets(std::int64_t bucket_numel) {
  std::vector<int> bucket_of(parameters_.size());
  for (std::size_t k = parameters_.size(); k-- > 0;) {
    if (buckets_.empty() || buckets_.back().end - buckets_.back().begin >= bucket_numel) {
      buckets_.push_back({offsets_[k], offsets_[k] + numels_[k], 0, 0});
    }
    Bucket& b = buckets_.back();
    b.begin = offsets_[k];
    ++b.parameters;
    bucket_of[k] = static_cast<int>(buckets_.size()) - 1;
  }
  for (std::size_t k = 0; k < parameters_.size(); ++k) {
    const int index = bucket_of[k];
    accumulators_.push_back(compat::add_gradient_ready_hook(parameters_[k], [this, index]() {
      if (!armed_) return;
      --buckets_[static_cast<std::size_t>(index)].remaining;
      while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].remaining == 0) {
        launch(next_bucket_++);
      }
    }));
  }
}

void FlatParameters::launch(std::size_t index) {
  const Bucket& b = buckets_[index];
  torch::Tensor range = grad_.narrow(0, b.begin, b.end - b.begin);
  reduction_log_.emplace_back(b.begin, b.end - b.begin);
  pending_.push_back(groups_.dp().allreduce_sum_async(range));
}

}  // namespace loom::executor
