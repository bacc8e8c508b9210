// The encoder's forward pass: embeddings, attention, transformer layers (recomputed where the
// plan says), the classifier head. Its weights are placed by model_weights.cpp.
#include "executor/model.hpp"

#include <ATen/CPUGeneratorImpl.h>

#include <cstring>
#include <map>
#include <sstream>
#include <string_view>

#include "executor/device.hpp"
#include "executor/safetensors.hpp"
#include "executor/torch_compat.hpp"
#include "profiles/errors.hpp"

namespace loom::executor {

using profiles::ModelSpec;
using profiles::ModelType;

bool runs_attention(costmodel::Attention attention) {
  return attention == costmodel::Attention::kMath || compat::kHasFusedAttention;
}

torch::Tensor EncoderClassifier::dropout(const torch::Tensor& x) const {
  if (dropout_ <= 0.0 || !is_training()) return x;
  return torch::dropout(x, dropout_, /*train=*/true);
}

torch::Tensor EncoderClassifier::hidden_dropout(const torch::Tensor& x) const {
  if (!sequence_parallel_ || dropout_ <= 0.0 || !is_training()) return dropout(x);
  // The mask one process draws for the whole sequence (dropout of ones: the same generator calls
  // as dropout(x) on the full tensor), of which this rank applies its slice; cloned so that the
  // whole mask is not kept for the backward pass.
  const int tp = parallel_.tp_size();
  const std::int64_t shard = x.size(1);
  std::vector<std::int64_t> shape = x.sizes().vec();
  shape[1] = shard * tp;
  torch::Tensor scale;
  {
    torch::NoGradGuard no_grad;
    scale = torch::dropout(torch::ones(shape, x.options().requires_grad(false)), dropout_,
                           /*train=*/true)
                .narrow(1, parallel_.tp_rank() * shard, shard)
                .clone();
  }
  return x * scale;
}

torch::Tensor EncoderClassifier::shard_used(const torch::Tensor& parameter) const {
  return sequence_parallel_ ? copy_to_tensor_parallel(parameter, parallel_.tp) : parameter;
}

torch::Tensor EncoderClassifier::layer_norm(const torch::Tensor& x, const Linear& w) const {
  return torch::layer_norm(x, {spec_.hidden}, shard_used(w.weight), shard_used(w.bias), eps_);
}

torch::Tensor EncoderClassifier::column_linear(const torch::Tensor& x, const Linear& w) const {
  if (!sequence_parallel_) return column_parallel_linear(x, w.weight, w.bias, parallel_.tp);
  return torch::linear(gather_sequence_parallel(x, parallel_.tp), w.weight, w.bias);
}

torch::Tensor EncoderClassifier::row_linear(const torch::Tensor& x, const Linear& w) const {
  if (!sequence_parallel_) return row_parallel_linear(x, w.weight, w.bias, parallel_.tp);
  return reduce_scatter_sequence_parallel(torch::linear(x, w.weight), parallel_.tp) +
         shard_used(w.bias);
}

EncoderClassifier::EmbeddingIds EncoderClassifier::embedding_ids(
    const EncoderInputs& inputs) const {
  const torch::Tensor& ids = inputs.input_ids;
  const std::int64_t batch = ids.size(0);
  const std::int64_t seq = ids.size(1);
  const int tp = parallel_.tp_size();
  if (sequence_parallel_ && seq % tp != 0) {
    throw InputError("model " + spec_.name, "sequence_parallel",
                     "a sequence length divisible by tp = " + std::to_string(tp) + ", got " +
                         std::to_string(seq));
  }
  EmbeddingIds out;
  if (spec_.model_type == ModelType::kRoberta) {
    const torch::Tensor real = ids.ne(pad_id_).to(torch::kLong);
    out.positions = torch::cumsum(real, 1) * real + pad_id_;
  } else {
    out.positions = torch::arange(seq, ids.options()).unsqueeze(0).expand({batch, seq});
  }
  out.word = ids;
  out.word_pad = pad_id_;
  if (tp > 1) {
    // This rank looks up the ids of its vocabulary rows (row 0 in place of the others).
    const SplitRange r = split_range(spec_.vocab, parallel_.tp_rank(), tp);
    out.outside = ids.lt(r.start).logical_or(ids.ge(r.start + r.length));
    out.word = (ids - r.start).masked_fill(out.outside, 0);
    out.word_pad = pad_id_ >= r.start && pad_id_ < r.start + r.length ? pad_id_ - r.start : -1;
  }
  out.types = inputs.token_type_ids.defined() ? inputs.token_type_ids : torch::zeros_like(ids);
  if (sequence_parallel_) {
    // The rest of the embedding works on this rank's positions.
    const std::int64_t shard = seq / tp;
    out.positions = out.positions.narrow(1, parallel_.tp_rank() * shard, shard);
    out.types = out.types.narrow(1, parallel_.tp_rank() * shard, shard);
  }
  return out;
}

std::vector<LookupRows> EncoderClassifier::lookup_rows(const EmbeddingIds& ids) const {
  const EmbeddingWeights& e = *embeddings_;
  std::vector<LookupRows> rows = {{e.word, ids.word}, {e.position, ids.positions}};
  if (e.token_type.defined()) rows.push_back({e.token_type, ids.types});
  return rows;
}

torch::Tensor EncoderClassifier::embed(const EmbeddingIds& ids) const {
  const EmbeddingWeights& e = *embeddings_;
  torch::Tensor x = torch::embedding(e.word, ids.word, ids.word_pad);
  if (ids.outside.defined()) {
    // Zeros where another rank holds the row; the sum over the tp group is the full lookup (its
    // backward needs no communication).
    x = x.masked_fill(ids.outside.unsqueeze(-1), 0.0);
    x = sequence_parallel_ ? reduce_scatter_sequence_parallel(x, parallel_.tp)
                           : reduce_from_tensor_parallel(x, parallel_.tp);
  }
  x = x + torch::embedding(shard_used(e.position), ids.positions,
                           spec_.model_type == ModelType::kRoberta ? pad_id_ : -1);
  if (e.token_type.defined()) x = x + torch::embedding(shard_used(e.token_type), ids.types);
  return hidden_dropout(layer_norm(x, e.norm));
}

namespace {

// What a recomputed region needs again in the backward pass: the function and the state it ran
// under (random generators, autocast).
struct Recomputed : torch::CustomClassHolder {
  std::function<torch::Tensor(const std::vector<torch::Tensor>&)> fn;
  std::vector<bool> needs_grad;
  GeneratorStates rng;
  torch::Device device = torch::kCPU;
  bool autocast = false;
  c10::ScalarType autocast_dtype = c10::ScalarType::BFloat16;
};

// Activation checkpointing as PyTorch's reentrant torch.utils.checkpoint: the forward pass runs
// without recording a graph and keeps only the inputs; the backward pass runs the function again
// with the same random state and autocast, then back-propagates through it (gradients of weights
// captured by the function accumulate into their .grad as usual).
class Checkpoint : public torch::autograd::Function<Checkpoint> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const c10::intrusive_ptr<Recomputed>& r,
                                                torch::TensorList inputs) {
    r->device = inputs[0].device();
    r->rng = capture_generators(r->device);
    const c10::DeviceType type = r->device.type();
    r->autocast = compat::AutocastGuard::is_enabled(type);
    r->autocast_dtype = compat::AutocastGuard::get_dtype(type);
    std::vector<torch::Tensor> in(inputs.begin(), inputs.end());
    r->needs_grad.clear();
    for (const torch::Tensor& t : in) r->needs_grad.push_back(t.requires_grad());
    torch::Tensor out = r->fn(in);
    ctx->save_for_backward(in);
    ctx->saved_data["recomputed"] = c10::IValue::make_capsule(r);
    return {out};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto r =
        c10::static_intrusive_pointer_cast<Recomputed>(ctx->saved_data["recomputed"].toCapsule());
    std::vector<torch::Tensor> in;
    for (const torch::Tensor& saved : ctx->get_saved_variables()) {
      in.push_back(saved.detach());
    }
    for (std::size_t i = 0; i < in.size(); ++i) {
      if (r->needs_grad[i]) in[i].requires_grad_(true);
    }
    torch::Tensor out;
    {
      const GeneratorStates now = capture_generators(r->device);
      restore_generators(r->rng);
      torch::AutoGradMode grad_on(true);
      compat::AutocastGuard autocast(r->device.type(), r->autocast_dtype, r->autocast);
      out = r->fn(in);
      restore_generators(now);
    }
    torch::autograd::backward({out}, {grads[0]});
    torch::autograd::variable_list result;
    result.emplace_back();  // the Recomputed argument
    for (std::size_t i = 0; i < in.size(); ++i) {
      result.push_back(r->needs_grad[i] ? in[i].grad() : torch::Tensor());
    }
    return result;
  }
};

torch::Tensor checkpointed(std::function<torch::Tensor(const std::vector<torch::Tensor>&)> fn,
                           const std::vector<torch::Tensor>& inputs) {
  auto r = c10::make_intrusive<Recomputed>();
  r->fn = std::move(fn);
  return Checkpoint::apply(r, torch::TensorList(inputs))[0];
}

}  // namespace

torch::Tensor EncoderClassifier::attention_core(const torch::Tensor& q, const torch::Tensor& k,
                                                const torch::Tensor& v,
                                                const torch::Tensor& keep) const {
  const double p = is_training() ? dropout_ : 0.0;
  // Both kernels draw their dropout from the device's default generator (the fused one inside
  // the kernel, from the generator's seed and offset); recomputation restores that generator, so
  // the recomputed core draws the mask of the first pass.
  const bool fused = attention_ == costmodel::Attention::kFlash;
  auto core = [p, fused](const torch::Tensor& q_in, const torch::Tensor& k_in,
                         const torch::Tensor& v_in, const torch::Tensor& keep_in) {
    return fused ? compat::attention(q_in, k_in, v_in, keep_in, p)
                 : compat::unfused_attention(q_in, k_in, v_in, keep_in, p);
  };
  if (recompute_ != costmodel::Recompute::kSelective || !is_training() ||
      !torch::GradMode::is_enabled()) {
    return core(q, k, v, keep);
  }
  std::vector<torch::Tensor> inputs = {q, k, v};
  if (keep.defined()) inputs.push_back(keep);
  return checkpointed(
      [core](const std::vector<torch::Tensor>& in) {
        return core(in[0], in[1], in[2], in.size() > 3 ? in[3] : torch::Tensor());
      },
      inputs);
}

torch::Tensor EncoderClassifier::transformer_layer(const LayerWeights& w, const torch::Tensor& x,
                                                   const torch::Tensor& keep) const {
  // x: the residual stream, [batch, seq, hidden] or (sequence parallel) this rank's shard.
  const std::int64_t batch = x.size(0);
  const std::int64_t local_heads = spec_.heads / parallel_.tp_size();
  const std::int64_t head_dim = spec_.hidden / spec_.heads;
  torch::Tensor input = sequence_parallel_ ? gather_sequence_parallel(x, parallel_.tp)
                                           : copy_to_tensor_parallel(x, parallel_.tp);
  // Under autocast each of the three products below would cast the fp32 residual stream to 16
  // bits on its own, and autograd would keep all three copies: cast it once for them.
  const c10::DeviceType type = input.device().type();
  if (compat::AutocastGuard::is_enabled(type) && input.scalar_type() == torch::kFloat) {
    input = input.to(compat::AutocastGuard::get_dtype(type));
  }
  const std::int64_t seq = input.size(1);
  auto heads = [&](const Linear& l) {
    return torch::linear(input, l.weight, l.bias)
        .view({batch, seq, local_heads, head_dim})
        .permute({0, 2, 1, 3});
  };
  torch::Tensor context = attention_core(heads(w.query), heads(w.key), heads(w.value), keep);
  context = context.permute({0, 2, 1, 3}).reshape({batch, seq, local_heads * head_dim});
  const torch::Tensor attended =
      layer_norm(hidden_dropout(row_linear(context, w.attention_output)) + x, w.attention_norm);
  const torch::Tensor inner = torch::gelu(column_linear(attended, w.intermediate));
  return layer_norm(hidden_dropout(row_linear(inner, w.output)) + attended, w.output_norm);
}

torch::Tensor EncoderClassifier::head(const torch::Tensor& x) const {
  const HeadWeights& h = *head_;
  torch::Tensor first = x.select(1, 0);
  if (sequence_parallel_) {
    // The first token is on tp rank 0: the others contribute zeros to a sum (whose backward
    // passes the head's gradient to rank 0's token only). Every rank builds the same graph, so
    // their backward passes run the group's collectives in the same order.
    first =
        reduce_from_tensor_parallel(first * (parallel_.tp_rank() == 0 ? 1.0 : 0.0), parallel_.tp);
  }
  if (spec_.model_type == ModelType::kRoberta) {
    torch::Tensor z = torch::tanh(torch::linear(dropout(first), h.dense.weight, h.dense.bias));
    return torch::linear(dropout(z), h.out.weight, h.out.bias);
  }
  const torch::Tensor pooled = torch::tanh(torch::linear(first, h.dense.weight, h.dense.bias));
  return torch::linear(dropout(pooled), h.out.weight, h.out.bias);
}

torch::Tensor EncoderClassifier::forward(const EncoderInputs& inputs, const torch::Tensor& hidden) {
  // The layer hooks around entry `layer` of the layer sequence (ZeRO-3's per-block gathers).
  auto before = [this](int layer, const std::vector<LookupRows>& lookups = {}) {
    if (hooks_) hooks_->before_forward(layer, lookups);
  };
  auto after = [this](int layer, const torch::Tensor& out) {
    return hooks_ ? hooks_->after_forward(layer, out) : out;
  };
  torch::Tensor x;
  if (has_embeddings()) {
    const EmbeddingIds ids = embedding_ids(inputs);
    before(0, hooks_ ? lookup_rows(ids) : std::vector<LookupRows>());
    x = after(0, embed(ids));
  } else {
    TORCH_CHECK(hidden.defined(), "EncoderClassifier: a stage without embeddings needs hidden");
    x = hidden;
  }
  torch::Tensor keep;
  if (!layers_.empty() && inputs.attention_mask.defined()) {
    const torch::Tensor& mask = inputs.attention_mask;
    keep = mask.to(torch::kBool).view({mask.size(0), 1, 1, mask.size(1)});
  }
  // Checkpointing needs an input that requires grad, or no gradient would reach the weights.
  const bool full = recompute_ == costmodel::Recompute::kFull && is_training() &&
                    torch::GradMode::is_enabled() && x.requires_grad();
  int index = std::max(first_layer_, 1);
  int local = 0;
  for (const LayerWeights& layer : layers_) {
    before(index);
    const bool recomputes = full && (recompute_layers_ <= 0 || local++ < recompute_layers_);
    if (!recomputes) {
      x = after(index++, transformer_layer(layer, x, keep));
      continue;
    }
    std::vector<torch::Tensor> inputs;
    inputs.push_back(x);
    if (keep.defined()) inputs.push_back(keep);
    x = checkpointed(
        [this, &layer](const std::vector<torch::Tensor>& in) {
          return transformer_layer(layer, in[0], in.size() > 1 ? in[1] : torch::Tensor());
        },
        inputs);
    x = after(index++, x);
  }
  if (!has_head()) return x;
  const int head_layer = static_cast<int>(spec_.layers) + 1;
  before(head_layer);
  return after(head_layer, head(x));
}

}  // namespace loom::executor
