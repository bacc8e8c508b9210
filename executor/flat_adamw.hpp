// The arithmetic of loom train's optimizer step, shared by the training loops
// (executor/train.cpp) and the profiler's optimizer measurement (executor/profiler.cpp), so that
// the profile times exactly what a step runs. Defined in executor/train.cpp.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace loom::executor {

// The one-rank loop's clipping: the total L2 norm of the parameters' gradients (as
// torch.nn.utils.clip_grad_norm_), which are scaled down to max_norm when larger (max_norm > 0).
// Returns the norm before clipping (inf/nan when a gradient is).
double clip_gradients(const std::vector<torch::Tensor>& parameters, double max_norm);

// The multi-rank loop works on flat buffers: (start, length) ranges of one.
using FlatRanges = std::vector<std::pair<std::int64_t, std::int64_t>>;

// Sum of squares of `flat`'s elements in `ranges`, as a one-element tensor on flat's device (no
// host synchronisation); one read of each range, no temporary of its size.
torch::Tensor squared_norm(const torch::Tensor& flat, const FlatRanges& ranges);

// AdamW (torch::optim::AdamW's arithmetic: betas 0.9 / 0.999, eps 1e-8, decoupled weight decay
// on `decay_ranges` only) of `parameters` with `grad`, the moments updated in place; `step` is
// the step number after this update (1 for the first). One temporary of parameters' size.
void flat_adamw_update(torch::Tensor& parameters, const torch::Tensor& grad, torch::Tensor& exp_avg,
                       torch::Tensor& exp_avg_sq, std::int64_t step, double lr, double weight_decay,
                       const FlatRanges& decay_ranges);

}  // namespace loom::executor
