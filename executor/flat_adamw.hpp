// The arithmetic of loom train's optimizer step on flat fp32 buffers, shared by the multi-rank
// training loop (executor/train.cpp) and the profiler's optimizer measurement
// (executor/profiler.cpp), so that the profile times exactly what a step runs. Defined in
// executor/train.cpp.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace loom::executor {

// (start, length) ranges of a flat buffer.
using FlatRanges = std::vector<std::pair<std::int64_t, std::int64_t>>;

// Sum of squares of `flat`'s elements in `ranges`, as a one-element tensor on flat's device (no
// host synchronisation); one read of each range, no temporary of its size.
torch::Tensor squared_norm(const torch::Tensor& flat, const FlatRanges& ranges);

// AdamW (torch::optim::AdamW's arithmetic: betas 0.9 / 0.999, eps 1e-8, decoupled weight decay
// on `decay_ranges` only) of `parameters` with `grad`, the moments updated in place; `step` is
// the step number after this update (1 for the first). One temporary of parameters' size.
void flat_adamw_update(torch::Tensor& parameters, const torch::Tensor& grad,
                       torch::Tensor& exp_avg, torch::Tensor& exp_avg_sq, std::int64_t step,
                       double lr, double weight_decay, const FlatRanges& decay_ranges);

}  // namespace loom::executor
