#include "executor/flat_adamw.hpp"

#include <algorithm>
#include <cmath>
#include <memory>

#include "executor/torch_compat.hpp"

namespace loom::executor {

bool weight_decay_applies(const std::string& name) {
  const bool bias = name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
  return !bias && name.find("LayerNorm.") == std::string::npos;
}

torch::Tensor clip_gradients(const std::vector<torch::Tensor>& parameters, double max_norm) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads;
  for (const torch::Tensor& p : parameters) {
    if (p.grad().defined()) grads.push_back(p.grad().detach());
  }
  if (grads.empty()) return torch::zeros({}, torch::kFloat);
  const std::vector<torch::Tensor> norms = at::_foreach_norm(grads, 2);
  const torch::Tensor total = torch::stack(norms).norm(2).to(torch::kFloat);
  if (max_norm > 0.0) {
    compat::foreach_mul_(grads, (max_norm / (total + 1e-6)).clamp_max(1.0));
  }
  return total;
}

void adamw_step(torch::optim::AdamW& optimizer) {
  torch::NoGradGuard no_grad;
  struct Lists {
    std::vector<torch::Tensor> parameters, grads, exp_avgs, exp_avg_sqs;
    std::int64_t numel = 0;
  };
  std::int64_t largest = 1;
  for (const auto& group : optimizer.param_groups()) {
    for (const torch::Tensor& p : group.params()) largest = std::max(largest, p.numel());
  }
  for (auto& group : optimizer.param_groups()) {
    const auto& options = static_cast<const torch::optim::AdamWOptions&>(group.options());
    TORCH_CHECK(!options.amsgrad(), "adamw_step: amsgrad is not supported");
    // Chunks of parameters at the same step count (all of them, unless some missed a step).
    std::vector<std::pair<std::int64_t, Lists>> chunks;
    for (const torch::Tensor& p : group.params()) {
      if (!p.grad().defined()) continue;
      auto& slot = optimizer.state()[compat::optimizer_state_key(optimizer, p)];
      if (!slot) {
        auto state = std::make_unique<torch::optim::AdamWParamState>();
        state->step(0);
        state->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        state->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        slot = std::move(state);
      }
      auto& state = static_cast<torch::optim::AdamWParamState&>(*slot);
      state.step(state.step() + 1);
      auto chunk = std::find_if(chunks.begin(), chunks.end(), [&](const auto& c) {
        return c.first == state.step() && c.second.numel + p.numel() <= 2 * largest;
      });
      if (chunk == chunks.end()) chunk = chunks.insert(chunks.end(), {state.step(), Lists{}});
      Lists& l = chunk->second;
      l.parameters.push_back(p);
      l.grads.push_back(p.grad());
      l.exp_avgs.push_back(state.exp_avg());
      l.exp_avg_sqs.push_back(state.exp_avg_sq());
      l.numel += p.numel();
    }
    const double lr = options.lr();
    const auto [beta1, beta2] = options.betas();
    for (auto& [step, l] : chunks) {
      if (compat::fused_adamw_(l.parameters, l.grads, l.exp_avgs, l.exp_avg_sqs, step, lr, beta1,
                               beta2, options.weight_decay(), options.eps())) {
        continue;
      }
      if (options.weight_decay() != 0) {
        at::_foreach_mul_(l.parameters, 1 - lr * options.weight_decay());
      }
      const double bias_correction1 = 1 - std::pow(beta1, static_cast<double>(step));
      const double bias_correction2 = 1 - std::pow(beta2, static_cast<double>(step));
      at::_foreach_mul_(l.exp_avgs, beta1);
      at::_foreach_add_(l.exp_avgs, l.grads, 1 - beta1);
      at::_foreach_mul_(l.exp_avg_sqs, beta2);
      at::_foreach_addcmul_(l.exp_avg_sqs, l.grads, l.grads, 1 - beta2);
      std::vector<torch::Tensor> denom = at::_foreach_sqrt(l.exp_avg_sqs);
      at::_foreach_div_(denom, std::sqrt(bias_correction2));
      at::_foreach_add_(denom, options.eps());
      at::_foreach_addcdiv_(l.parameters, l.exp_avgs, denom, -lr / bias_correction1);
    }
  }
}

torch::Tensor squared_norm(const torch::Tensor& flat, const FlatRanges& ranges) {
  torch::Tensor sum = torch::zeros({1}, flat.options());
  for (const auto& [start, length] : ranges) {
    const torch::Tensor norm = flat.narrow(0, start, length).norm();
    sum += norm * norm;
  }
  return sum;
}

void flat_adamw_update(torch::Tensor& parameters, const torch::Tensor& grad, torch::Tensor& exp_avg,
                       torch::Tensor& exp_avg_sq, std::int64_t step, double lr, double weight_decay,
                       const FlatRanges& decay_ranges) {
  torch::NoGradGuard no_grad;
  constexpr double kBeta1 = 0.9;
  constexpr double kBeta2 = 0.999;
  constexpr double kEps = 1e-8;
  const auto factor = static_cast<float>(1.0 - lr * weight_decay);
  for (const auto& [start, length] : decay_ranges) {
    parameters.narrow(0, start, length).mul_(factor);
  }
  exp_avg.mul_(kBeta1).add_(grad, 1.0 - kBeta1);
  exp_avg_sq.mul_(kBeta2).addcmul_(grad, grad, 1.0 - kBeta2);
  const double bias_correction1 = 1.0 - std::pow(kBeta1, static_cast<double>(step));
  const double bias_correction2 = 1.0 - std::pow(kBeta2, static_cast<double>(step));
  torch::Tensor denom = exp_avg_sq.sqrt();
  denom.div_(std::sqrt(bias_correction2)).add_(kEps);
  parameters.addcdiv_(exp_avg, denom, -lr / bias_correction1);
}

}  // namespace loom::executor
