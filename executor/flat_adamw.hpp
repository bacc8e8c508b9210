// The arithmetic of loom train's optimizer step, shared by the training engines
// (executor/train_single.cpp, executor/flat_parameters.cpp) and the profiler's optimizer
// measurement (executor/profiler.cpp), so that the profile times exactly what a step runs.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace loom::executor {

// Whether AdamW's weight decay applies to the parameter `name` (Hugging Face names): not to
// biases and LayerNorm weights, as transformers' examples group them.
bool weight_decay_applies(const std::string& name);

// The one-rank step's clipping, as torch.nn.utils.clip_grad_norm_: the total L2 norm of the
// parameters' gradients, and, when max_norm > 0, every gradient multiplied by
// min(1, max_norm / (norm + 1e-6)). All on the gradients' device (multi-tensor kernels where
// LibTorch has them), with no host synchronisation. Returns the norm before clipping as a
// one-element float tensor on that device (inf/nan when a gradient is; then so are the clipped
// gradients, as with torch); a zero CPU tensor when no parameter has a gradient.
torch::Tensor clip_gradients(const std::vector<torch::Tensor>& parameters, double max_norm);

// The one-rank step's AdamW: torch::optim::AdamW::step's arithmetic and state (the same
// AdamWParamState entries, so torch::save and torch::load of `optimizer` work unchanged; amsgrad
// unsupported), run over lists of tensors in chunks of at most twice the largest parameter's
// elements. On CUDA with LibTorch 2.1 or later each chunk goes to ATen's fused multi-tensor
// kernel (compat::fused_adamw_: each value read and written once, torch.optim.AdamW's
// fused=True); otherwise to multi-tensor operations on CUDA, the same per-tensor operations on
// the CPU, whose one temporary per chunk stays within torch::optim::AdamW's own working set (two
// temporaries of the largest parameter), which the cost model counts. Parameters without a
// gradient are skipped.
void adamw_step(torch::optim::AdamW& optimizer);

// The many-rank step works on flat buffers (executor/flat_parameters.hpp): (start, length) ranges
// of one.
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
