#include "executor/flat_parameters.hpp"

#include <c10/core/StorageImpl.h>

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

// Frees the memory behind `buffer` and every view of it, keeping the tensors (autograd's saved
// views of the parameters among them) valid for a later refill: FSDP's storage resize to zero.
void free_storage(const torch::Tensor& buffer) {
  c10::StorageImpl* storage = buffer.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(at::DataPtr(nullptr, buffer.device()));
  storage->set_nbytes(0);
}

// Gives `buffer`'s storage memory again (its old size; contents undefined).
void allocate_storage(const torch::Tensor& buffer, std::int64_t numel) {
  c10::StorageImpl* storage = buffer.storage().unsafeGetStorageImpl();
  const auto bytes = static_cast<std::size_t>(numel) * buffer.element_size();
  storage->set_data_ptr_noswap(storage->allocator()->allocate(bytes));
  storage->set_nbytes(bytes);
}

// Appends [start, start + length) to sorted, disjoint ranges, merging it with the last one when
// they touch.
void add_range(FlatRanges& ranges, std::int64_t start, std::int64_t length) {
  if (!ranges.empty() && ranges.back().first + ranges.back().second == start) {
    ranges.back().second += length;
  } else {
    ranges.emplace_back(start, length);
  }
}

}  // namespace

// The hooks chunk k's model calls around each layer.
class FlatParameters::UnitHooks final : public LayerHooks {
 public:
  UnitHooks(FlatParameters& flat, int k) : flat_(flat), k_(k) {}
  void before_forward(int layer, const std::vector<LookupRows>& lookups) override {
    flat_.enter_forward(k_, layer, lookups);
  }
  torch::Tensor after_forward(int layer, const torch::Tensor& output) override {
    return flat_.exit_forward(k_, layer, output);
  }

 private:
  FlatParameters& flat_;
  int k_;
};

// The identity, whose backward gathers a unit before autograd runs that unit's backward (the
// gradient of a unit's output is complete before any of the unit's own backward runs).
class FlatParameters::GatherBeforeBackward
    : public torch::autograd::Function<GatherBeforeBackward> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               FlatParameters* flat, std::int64_t unit) {
    ctx->saved_data["flat"] = reinterpret_cast<std::int64_t>(flat);
    ctx->saved_data["unit"] = unit;
    return x.view_as(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* flat = reinterpret_cast<FlatParameters*>(ctx->saved_data["flat"].toInt());
    flat->enter_backward(static_cast<std::size_t>(ctx->saved_data["unit"].toInt()));
    return {grads[0], torch::Tensor(), torch::Tensor()};
  }
};

FlatParameters::FlatParameters(const std::vector<std::vector<FlatParameter>>& chunks,
                               const FlatOptions& o, ParallelGroups& groups,
                               const torch::Device& device)
    : zero_(costmodel::zero_policy(o.zero)), weight_decay_(o.weight_decay), groups_(groups) {
  const int dp = groups.dp_size();
  sharded_gradients_ = zero_.shards_gradients && dp > 1;
  per_block_ = zero_.gathers_per_block;
  make_units(chunks, zero_.shards_gradients, dp);
  shard_numel_ = padded_ / dp;
  shard_offset_ = zero_.shards_optimizer_states ? groups.coordinates().dp * shard_numel_ : 0;
  const std::int64_t updated = zero_.shards_optimizer_states ? shard_numel_ : padded_;
  const auto options = torch::TensorOptions().dtype(torch::kFloat).device(device);
  copy_into_flat(chunks, options);
  const std::int64_t bucket_numel = std::max<std::int64_t>(o.bucket_bytes / 4, 1);
  if (sharded_gradients_) {
    shard_grad_ = torch::zeros({shard_numel_}, options);
    // Pieces of at most a bucket over the dp ranks: a piece is that many elements of every
    // rank's chunk of a unit.
    std::int64_t piece = 1;
    for (const Unit& u : units_) {
      piece =
          std::max(piece, std::min(u.shard_numel, std::max<std::int64_t>(bucket_numel / dp, 1)));
    }
    staging_ = torch::empty({piece * dp}, options);
    staging_piece_ = piece;
  }
  if (zero_.shards_parameters) {
    std::vector<torch::Tensor> parts;
    for (const auto& [start, length] : shard_ranges_)
      parts.push_back(flat_.narrow(0, start, length));
    shard_ = torch::cat(parts);
    torch::NoGradGuard no_grad;
    if (!sharded_gradients_) grad_ = torch::zeros({padded_}, options);
    for (Unit& u : units_) {
      u.gathered = torch::empty({u.padded}, options);
      for (std::size_t i = u.first; i < u.last; ++i) {
        const std::int64_t at = offsets_[i] - u.offset;
        parameters_[i].set_data(u.gathered.narrow(0, at, numels_[i]).view(shapes_[i]));
        if (!sharded_gradients_) {
          parameters_[i].mutable_grad() = grad_.narrow(0, offsets_[i], numels_[i]).view(shapes_[i]);
        }
      }
      free_storage(u.gathered);
    }
    flat_ = torch::Tensor();
  } else {
    bind();
    if (o.overlap && dp > 1 && !zero_.reduces_every_micro_batch) make_buckets(bucket_numel);
  }
  // After the parameters have their final tensors (a hooked accumulator keeps its parameter).
  if (sharded_gradients_) make_unit_hooks();
  // After the parameters moved into the flat buffer (their first copies are freed by then).
  exp_avg_ = torch::zeros({updated}, options);
  exp_avg_sq_ = torch::zeros({updated}, options);
}

// Groups the parameters into units (one for all, or one per chunk and layer) and lays them out:
// offsets, padding, this rank's chunk of each.
void FlatParameters::make_units(const std::vector<std::vector<FlatParameter>>& chunks,
                                bool per_layer, int dp) {
  std::vector<std::int64_t> within;  // each parameter's offset within its unit
  for (std::size_t k = 0; k < chunks.size(); ++k) {
    ChunkUnits chunk;
    chunk.begin = units_.size();
    for (const FlatParameter& entry : chunks[k]) {
      if (units_.empty() ||
          (per_layer && (units_.size() == chunk.begin || units_.back().layer != entry.unit))) {
        Unit u;
        u.first = parameters_.size();
        u.chunk = static_cast<int>(k);
        u.layer = entry.unit;
        units_.push_back(std::move(u));
      }
      Unit& u = units_.back();
      parameters_.push_back(entry.tensor);
      within.push_back(u.padded);  // the unit's unpadded numel so far
      if (entry.read_by_backward) add_range(u.backward_ranges, u.padded, entry.tensor.numel());
      numels_.push_back(entry.tensor.numel());
      shapes_.push_back(entry.tensor.sizes().vec());
      numel_ += entry.tensor.numel();
      u.padded += entry.tensor.numel();
      u.last = parameters_.size();
    }
    chunk.end = units_.size();
    chunk.next = chunk.end;
    for (std::size_t u = chunk.begin; u < chunk.end; ++u) {  // all read: the whole unit
      const FlatRanges& ranges = units_[u].backward_ranges;
      if (ranges.size() == 1 && ranges[0].first == 0 && ranges[0].second == units_[u].padded) {
        units_[u].backward_ranges.clear();
      }
    }
    chunk_units_.push_back(chunk);
  }
  const int rank = groups_.coordinates().dp;
  padded_ = 0;
  std::int64_t shard_at = 0;
  for (Unit& u : units_) {
    u.padded = (u.padded + dp - 1) / dp * dp;
    u.offset = padded_;
    for (std::size_t i = u.first; i < u.last; ++i) offsets_.push_back(u.offset + within[i]);
    u.shard_numel = u.padded / dp;
    u.shard_offset = shard_at;
    shard_ranges_.emplace_back(u.offset + rank * u.shard_numel, u.shard_numel);
    shard_at += u.shard_numel;
    padded_ += u.padded;
  }
}

// Fills the flat buffer with the parameters' values and computes the decay and norm ranges of
// the updated part (ranges, not per-element masks, which would cost another copy of it).
void FlatParameters::copy_into_flat(const std::vector<std::vector<FlatParameter>>& chunks,
                                    const torch::TensorOptions& options) {
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
  // In the coordinates of what this rank updates: the full buffer, or its shard.
  auto updated_part = [&](const torch::Tensor& mask) {
    if (!zero_.shards_optimizer_states) return mask;
    std::vector<torch::Tensor> parts;
    for (const auto& [start, length] : shard_ranges_)
      parts.push_back(mask.narrow(0, start, length));
    return torch::cat(parts);
  };
  decay_ranges_ = true_ranges(updated_part(decay));
  counted_ranges_ = true_ranges(updated_part(counted));
  if (zero_.shards_optimizer_states) {
    for (std::size_t u = 0; u < units_.size(); ++u) {
      const auto& [start, length] = shard_ranges_[u];
      units_[u].decay = true_ranges(decay.narrow(0, start, length));
    }
  }
}

void FlatParameters::arm() {
  if (buckets_.empty()) return;
  armed_ = true;
  for (Bucket& b : buckets_) b.remaining = b.parameters;
  next_bucket_ = 0;
  pending_.clear();
}

std::shared_ptr<LayerHooks> FlatParameters::layer_hooks(int k) {
  if (!per_block_) return nullptr;
  return std::make_shared<UnitHooks>(*this, k);
}

void FlatParameters::materialize() {
  if (!per_block_ || materialized_) return;
  for (std::size_t u = 0; u < units_.size(); ++u) start_gather(u);
  for (std::size_t u = 0; u < units_.size(); ++u) gather(u);
  materialized_ = true;
}

void FlatParameters::release() {
  if (!per_block_) return;
  materialized_ = false;
  for (std::size_t u = 0; u < units_.size(); ++u) free_unit(u);
  if (sharded_gradients_) {
    for (torch::Tensor& p : parameters_) p.mutable_grad() = torch::Tensor();
  }
}

std::size_t FlatParameters::unit_of(int k, int layer) const {
  const ChunkUnits& chunk = chunk_units_.at(static_cast<std::size_t>(k));
  for (std::size_t u = chunk.begin; u < chunk.end; ++u) {
    if (units_[u].layer == layer) return u;
  }
  throw std::logic_error("FlatParameters: chunk " + std::to_string(k) + " has no layer " +
                         std::to_string(layer));
}

void FlatParameters::allocate_gathered(Unit& unit) {
  allocate_storage(unit.gathered, unit.padded);
  gathered_numel_ += unit.padded;
  peak_gathered_ = std::max(peak_gathered_, gathered_numel_);
  ++gather_count_;
}

void FlatParameters::start_gather(std::size_t u, bool backward) {
  Unit& unit = units_[u];
  const bool partial = backward && !unit.backward_ranges.empty();
  if (unit.partial && !partial) free_unit(u);  // the forward pass needs the whole unit
  if (unit.held || !unit.gathering.empty()) return;
  allocate_gathered(unit);
  unit.partial = partial;
  torch::Tensor mine = shard_.narrow(0, unit.shard_offset, unit.shard_numel);
  if (!partial) {
    gathered_elements_ += unit.padded;
    unit.gathering = groups_.dp().allgather_async(unit.gathered, mine);
  } else {
    // Each range's part in rank r's chunk comes from rank r (one broadcast per part, the same
    // list on every rank); this rank's own parts are copied from its shard.
    const int dp = groups_.dp_size();
    const int rank = groups_.coordinates().dp;
    for (const auto& [start, length] : unit.backward_ranges) {
      gathered_elements_ += length;
      for (int r = 0; r < dp; ++r) {
        const std::int64_t chunk_begin = r * unit.shard_numel;
        const std::int64_t from = std::max(start, chunk_begin);
        const std::int64_t to = std::min(start + length, chunk_begin + unit.shard_numel);
        if (from >= to) continue;
        torch::Tensor part = unit.gathered.narrow(0, from, to - from);
        if (r == rank) part.copy_(mine.narrow(0, from - chunk_begin, to - from));
        if (dp > 1) unit.gathering.push_back(groups_.dp().broadcast_async(part, r));
      }
    }
  }
  if (unit.gathering.empty()) unit.held = true;  // a group of one copied at once
}

void FlatParameters::gather(std::size_t u, bool backward) {
  Unit& unit = units_[u];
  start_gather(u, backward);
  for (PendingOperation& p : unit.gathering) p.wait();
  unit.gathering.clear();
  unit.held = true;
}

void FlatParameters::free_unit(std::size_t u) {
  Unit& unit = units_[u];
  if (materialized_) return;
  const bool in_flight = !unit.gathering.empty();
  for (PendingOperation& p : unit.gathering) p.wait();
  unit.gathering.clear();
  if (!unit.held && !in_flight) return;
  unit.held = false;
  unit.partial = false;
  free_storage(unit.gathered);
  gathered_numel_ -= unit.padded;
}

void FlatParameters::enter_forward(int k, int layer, const std::vector<LookupRows>& lookups) {
  const std::size_t u = unit_of(k, layer);
  if (lookups.empty() || groups_.dp_size() == 1) {
    gather(u);
  } else {
    gather_rows(u, lookups);
  }
  // The next unit of the chunk gathers while this one computes.
  if (u + 1 < chunk_units_[static_cast<std::size_t>(k)].end) start_gather(u + 1);
}

void FlatParameters::gather_rows(std::size_t u, const std::vector<LookupRows>& lookups) {
  Unit& unit = units_[u];
  if (unit.held && !unit.partial) return;
  if (!unit.gathering.empty() || unit.held) {  // already on its way whole, or held in part
    gather(u);
    return;
  }
  torch::NoGradGuard no_grad;
  const torch::TensorOptions longs = torch::TensorOptions().dtype(torch::kLong);
  // Which of the unit's parameters are looked up, and the rows any dp rank reads (a mask over
  // all their rows, summed over the group).
  std::vector<std::pair<std::size_t, torch::Tensor>> tables;
  std::int64_t all_rows = 0;
  for (std::size_t i = unit.first; i < unit.last; ++i) {
    for (const LookupRows& l : lookups) {
      if (l.table.is_same(parameters_[i]) && shapes_[i].size() == 2) {
        tables.emplace_back(i, l.rows.reshape({-1}).to(shard_.device(), torch::kLong));
        all_rows += shapes_[i][0];
      }
    }
  }
  torch::Tensor mask = torch::zeros({all_rows}, shard_.options());
  std::int64_t at = 0;
  for (const auto& [i, rows] : tables) {
    mask.narrow(0, at, shapes_[i][0]).index_fill_(0, rows, 1.0);
    at += shapes_[i][0];
  }
  groups_.dp().allreduce_sum(mask);
  const torch::Tensor read = mask.gt(0).to(torch::kCPU);
  // The unit-relative elements to gather, ascending: whole parameters, and the read rows of the
  // tables.
  std::vector<torch::Tensor> parts;
  at = 0;
  std::size_t next_table = 0;
  for (std::size_t i = unit.first; i < unit.last; ++i) {
    const std::int64_t start = offsets_[i] - unit.offset;
    if (next_table < tables.size() && tables[next_table].first == i) {
      const std::int64_t rows = shapes_[i][0];
      const std::int64_t width = numels_[i] / std::max<std::int64_t>(rows, 1);
      const torch::Tensor kept = read.narrow(0, at, rows).nonzero().reshape({-1, 1});
      parts.push_back((start + kept * width + torch::arange(width, longs)).reshape({-1}));
      at += rows;
      ++next_table;
    } else {
      parts.push_back(torch::arange(start, start + numels_[i], longs));
    }
  }
  const torch::Tensor index = torch::cat(parts);
  // Rank r's part: the elements in its chunk [r * S, (r + 1) * S), a contiguous run of `index`.
  const int dp = groups_.dp_size();
  const int rank = groups_.coordinates().dp;
  const torch::Tensor bounds =
      torch::searchsorted(index, torch::arange(dp + 1, longs) * unit.shard_numel);
  const auto* bound = bounds.data_ptr<std::int64_t>();
  torch::Tensor values = torch::empty({index.numel()}, shard_.options());
  allocate_gathered(unit);
  gathered_elements_ += index.numel();
  const torch::Tensor mine = shard_.narrow(0, unit.shard_offset, unit.shard_numel);
  const torch::Tensor device_index = index.to(shard_.device());
  std::vector<PendingOperation> pending;
  for (int r = 0; r < dp; ++r) {
    const std::int64_t length = bound[r + 1] - bound[r];
    if (length == 0) continue;
    torch::Tensor part = values.narrow(0, bound[r], length);
    if (r == rank) {
      part.copy_(
          mine.index_select(0, device_index.narrow(0, bound[r], length) - r * unit.shard_numel));
    }
    pending.push_back(groups_.dp().broadcast_async(part, r));
  }
  for (PendingOperation& p : pending) p.wait();
  unit.gathered.index_copy_(0, device_index, values);
  unit.held = true;
  unit.partial = true;
}

torch::Tensor FlatParameters::exit_forward(int k, int layer, const torch::Tensor& output) {
  const std::size_t u = unit_of(k, layer);
  free_unit(u);
  if (!output.requires_grad() || !torch::GradMode::is_enabled()) return output;
  return GatherBeforeBackward::apply(output, this, static_cast<std::int64_t>(u));
}

void FlatParameters::enter_backward(std::size_t u) {
  gather(u, true);
  const ChunkUnits& chunk = chunk_units_[static_cast<std::size_t>(units_[u].chunk)];
  if (u > chunk.begin) start_gather(u - 1, true);
}

void FlatParameters::zero_grad() {
  if (grad_.defined()) grad_.zero_();
  if (shard_grad_.defined()) shard_grad_.zero_();
  reduction_log_.clear();
  gather_count_ = 0;
  gathered_elements_ = 0;
  peak_gathered_ = gathered_numel_;
}

void FlatParameters::finish_backward(int k) {
  ChunkUnits& chunk = chunk_units_[static_cast<std::size_t>(k)];
  if (sharded_gradients_) {
    while (chunk.next > chunk.begin) reduce_unit(--chunk.next);
    settle_reduction();
    for (std::size_t u = chunk.begin; u < chunk.end; ++u) {
      units_[u].remaining = units_[u].last - units_[u].first;
    }
    chunk.next = chunk.end;
  }
  if (per_block_) {
    for (std::size_t u = chunk.begin; u < chunk.end; ++u) free_unit(u);
  }
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
  if (materialized_) {  // the held units gather the loaded shard
    materialized_ = false;
    release();
    materialize();
  }
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
  ++step_;
  // One temporary of the updated part's size (the cost model's optimizer working set).
  if (zero_.shards_parameters || !zero_.shards_optimizer_states) {
    torch::Tensor p = zero_.shards_parameters ? shard_ : flat_;
    flat_adamw_update(p, grad, exp_avg_, exp_avg_sq_, step_, lr, weight_decay_, decay_ranges_);
    return;
  }
  // ZeRO-1/2: this rank's chunk of each unit of the full buffer, then the unit's all-gather (in
  // place: the chunk is this rank's part of the gathered unit).
  for (std::size_t u = 0; u < units_.size(); ++u) {
    const Unit& unit = units_[u];
    torch::Tensor p = flat_.narrow(0, shard_ranges_[u].first, unit.shard_numel);
    torch::Tensor exp_avg = exp_avg_.narrow(0, unit.shard_offset, unit.shard_numel);
    torch::Tensor exp_avg_sq = exp_avg_sq_.narrow(0, unit.shard_offset, unit.shard_numel);
    flat_adamw_update(p, grad.narrow(0, unit.shard_offset, unit.shard_numel), exp_avg, exp_avg_sq,
                      step_, lr, weight_decay_, unit.decay);
  }
  if (!zero_.gathers_after_step) return;
  for (const Unit& unit : units_) {
    torch::Tensor whole = flat_.narrow(0, unit.offset, unit.padded);
    groups_.dp().allgather(
        whole, whole.narrow(0, groups_.coordinates().dp * unit.shard_numel, unit.shard_numel));
  }
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

// Each parameter's gradient hook counts down its unit; the chunk's units reduce from its last, a
// unit as soon as it and every unit after it in the chunk are complete.
void FlatParameters::make_unit_hooks() {
  for (Unit& u : units_) u.remaining = u.last - u.first;
  for (std::size_t index = 0; index < units_.size(); ++index) {
    const auto chunk_index = static_cast<std::size_t>(units_[index].chunk);
    for (std::size_t k = units_[index].first; k < units_[index].last; ++k) {
      accumulators_.push_back(
          compat::add_gradient_ready_hook(parameters_[k], [this, index, chunk_index]() {
            --units_[index].remaining;
            ChunkUnits& chunk = chunk_units_[chunk_index];
            while (chunk.next > chunk.begin && units_[chunk.next - 1].remaining == 0) {
              reduce_unit(--chunk.next);
            }
          }));
    }
  }
}

// Reduce-scatters unit `index`'s gradients in pieces: piece j is elements [j, j + length) of
// every rank's chunk of the unit, staged rank by rank; this rank's sum goes into its shard.
void FlatParameters::reduce_unit(std::size_t index) {
  Unit& unit = units_[index];
  const int dp = groups_.dp_size();
  torch::NoGradGuard no_grad;
  reduction_log_.emplace_back(unit.offset, unit.padded);
  const std::int64_t piece = staging_piece_;
  const int rank = groups_.coordinates().dp;
  for (std::int64_t at = 0; at < unit.shard_numel; at += piece) {
    const std::int64_t length = std::min(piece, unit.shard_numel - at);
    settle_reduction();  // the staging buffer is free again
    torch::Tensor buffer = staging_.narrow(0, 0, length * dp);
    for (int r = 0; r < dp; ++r) {
      // Elements [begin, begin + length) of the unit: rank r's chunk, from `at`.
      const std::int64_t begin = unit.offset + r * unit.shard_numel + at;
      torch::Tensor slot = buffer.narrow(0, r * length, length);
      slot.zero_();
      for (std::size_t i = unit.first; i < unit.last; ++i) {
        const std::int64_t from = std::max(begin, offsets_[i]);
        const std::int64_t to = std::min(begin + length, offsets_[i] + numels_[i]);
        const torch::Tensor& g = parameters_[i].grad();
        if (from >= to || !g.defined()) continue;
        slot.narrow(0, from - begin, to - from)
            .copy_(g.reshape({numels_[i]}).narrow(0, from - offsets_[i], to - from));
      }
    }
    // In place: this rank's sum lands in its own slot of the staging buffer, added to the shard
    // when the buffer is needed again or the backward pass ends; the backward pass goes on
    // meanwhile.
    in_flight_ = InFlight{groups_.dp().reduce_scatter_sum_async(buffer),
                          buffer.narrow(0, rank * length, length), unit.shard_offset + at};
  }
  for (std::size_t i = unit.first; i < unit.last; ++i)
    parameters_[i].mutable_grad() = torch::Tensor();
  if (per_block_) free_unit(index);
}

void FlatParameters::settle_reduction() {
  if (!in_flight_) return;
  in_flight_->operation.wait();
  torch::NoGradGuard no_grad;
  shard_grad_.narrow(0, in_flight_->shard_at, in_flight_->mine.numel()).add_(in_flight_->mine);
  in_flight_.reset();
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
