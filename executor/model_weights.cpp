// The encoder's weights: the parameter table, their initial values and tensor-parallel shards,
// the constructor that places them, and the whole-model state read from and written to
// safetensors files. The forward pass is model.cpp's.
#include <ATen/CPUGeneratorImpl.h>

#include <cstring>
#include <map>
#include <sstream>
#include <string_view>

#include "executor/model.hpp"
#include "executor/safetensors.hpp"
#include "executor/torch_compat.hpp"
#include "profiles/errors.hpp"

namespace loom::executor {

using profiles::ModelSpec;
using profiles::ModelType;

// ---------------------------------------------------------------------------------------------
// Parameters

std::int64_t pad_token_id(ModelType type) { return type == ModelType::kRoberta ? 1 : 0; }

double layer_norm_eps(ModelType type) { return type == ModelType::kRoberta ? 1e-5 : 1e-12; }

void check_encoder(const ModelSpec& spec) {
  if (spec.family != profiles::Family::kEncoder ||
      (spec.model_type != ModelType::kBert && spec.model_type != ModelType::kRoberta)) {
    throw InputError("model " + spec.name, "model_type",
                     std::string("a BERT or RoBERTa encoder, got ") + to_string(spec.model_type));
  }
  if (spec.gated_mlp) {
    throw InputError("model " + spec.name, "mlp", "BERT's MLP (Loom's executor), got swiglu");
  }
  if (spec.activation != profiles::Activation::kGelu) {
    throw InputError("model " + spec.name, "activation",
                     std::string("the exact GeLU (Loom's executor runs no other), got ") +
                         to_string(spec.activation));
  }
  if (spec.layers <= 0 || spec.hidden <= 0 || spec.heads <= 0 || spec.ffn_hidden <= 0 ||
      spec.vocab <= 0 || spec.max_positions <= 0 || spec.type_vocab < 0 ||
      spec.hidden % spec.heads != 0 || classifier_labels(spec) <= 0) {
    throw InputError("model " + spec.name, "",
                     "positive sizes, heads dividing hidden and a positive label count");
  }
}

namespace {

std::string base_prefix(const ModelSpec& spec) {
  return spec.model_type == ModelType::kRoberta ? "roberta" : "bert";
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::ostringstream out;
  out << '[';
  for (std::size_t i = 0; i < shape.size(); ++i) out << (i > 0 ? ", " : "") << shape[i];
  out << ']';
  return out.str();
}

bool ends_with(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}

bool starts_with(std::string_view text, std::string_view prefix) {
  return text.substr(0, prefix.size()) == prefix;
}

// 64-bit FNV-1a of `text`, mixed with `seed` (splitmix64 finaliser): the per-tensor init seed.
std::uint64_t tensor_seed(std::uint64_t seed, std::string_view text) {
  std::uint64_t hash = 1469598103934665603ULL;
  for (char c : text) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 1099511628211ULL;
  }
  std::uint64_t z = hash ^ (seed + 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// The full initial value of one parameter (fp32, CPU).
torch::Tensor initial_value(const ParameterInfo& info, const ModelSpec& spec, std::uint64_t seed) {
  const auto options = torch::TensorOptions().dtype(torch::kFloat);
  if (ends_with(info.name, "LayerNorm.weight")) return torch::ones(info.shape, options);
  if (ends_with(info.name, ".bias")) return torch::zeros(info.shape, options);
  at::Generator generator = at::detail::createCPUGenerator(tensor_seed(seed, info.name));
  torch::Tensor value = torch::normal(0.0, 0.02, info.shape, generator, options);
  const std::int64_t pad = pad_token_id(spec.model_type);
  const bool padded = ends_with(info.name, "embeddings.word_embeddings.weight") ||
                      (spec.model_type == ModelType::kRoberta &&
                       ends_with(info.name, "embeddings.position_embeddings.weight"));
  if (padded && pad < info.shape[0]) value[pad].zero_();
  return value;
}

}  // namespace

SplitRange split_range(std::int64_t n, int rank, int size) {
  SplitRange r;
  r.part = (n + size - 1) / size;
  r.start = std::min(n, rank * r.part);
  r.length = std::min(n, r.start + r.part) - r.start;
  return r;
}

namespace {

// This rank's slice of a full tensor (a view unless zero rows pad it).
torch::Tensor shard_of(const torch::Tensor& full, TensorParallelSplit split, int rank, int size) {
  if (split == TensorParallelSplit::kReplicated || size == 1) return full;
  const std::int64_t dim = split == TensorParallelSplit::kRows ? 0 : 1;
  const SplitRange r = split_range(full.size(dim), rank, size);
  torch::Tensor real = full.narrow(dim, r.start, r.length);
  if (r.length == r.part) return real;
  std::vector<std::int64_t> shape = full.sizes().vec();
  shape[static_cast<std::size_t>(dim)] = r.part;
  torch::Tensor padded = torch::zeros(shape, full.options());
  padded.narrow(dim, 0, r.length).copy_(real);
  return padded;
}

// Writes a rank's slice (as shard_of returns it) into its place in a full tensor.
void write_shard(torch::Tensor& full, const torch::Tensor& shard, TensorParallelSplit split,
                 int rank, int size) {
  const std::int64_t dim = split == TensorParallelSplit::kRows ? 0 : 1;
  const SplitRange r = split_range(full.size(dim), rank, size);
  full.narrow(dim, r.start, r.length).copy_(shard.narrow(dim, 0, r.length));
}

}  // namespace

bool lookup_table(const std::string& name) {
  return ends_with(name, "embeddings.word_embeddings.weight") ||
         ends_with(name, "embeddings.position_embeddings.weight") ||
         ends_with(name, "embeddings.token_type_embeddings.weight");
}

std::vector<ParameterInfo> parameter_table(const ModelSpec& spec) {
  check_encoder(spec);
  using S = TensorParallelSplit;
  const std::string base = base_prefix(spec);
  const std::int64_t h = spec.hidden;
  const std::int64_t inner = spec.ffn_hidden;
  const int head_layer = static_cast<int>(spec.layers) + 1;
  std::vector<ParameterInfo> table;
  auto add = [&table](std::string name, std::vector<std::int64_t> shape, S split, int layer) {
    table.push_back({std::move(name), std::move(shape), split, layer});
  };
  const std::string emb = base + ".embeddings.";
  // Vocabulary-parallel (Megatron-LM's VocabParallelEmbedding).
  add(emb + "word_embeddings.weight", {spec.vocab, h}, S::kRows, 0);
  add(emb + "position_embeddings.weight", {spec.max_positions, h}, S::kReplicated, 0);
  if (spec.type_vocab > 0) {
    add(emb + "token_type_embeddings.weight", {spec.type_vocab, h}, S::kReplicated, 0);
  }
  add(emb + "LayerNorm.weight", {h}, S::kReplicated, 0);
  add(emb + "LayerNorm.bias", {h}, S::kReplicated, 0);
  for (std::int64_t i = 0; i < spec.layers; ++i) {
    const std::string p = base + ".encoder.layer." + std::to_string(i) + ".";
    const int layer = static_cast<int>(i) + 1;
    for (const char* qkv : {"query", "key", "value"}) {
      add(p + "attention.self." + qkv + ".weight", {h, h}, S::kRows, layer);
      add(p + "attention.self." + qkv + ".bias", {h}, S::kRows, layer);
    }
    add(p + "attention.output.dense.weight", {h, h}, S::kColumns, layer);
    add(p + "attention.output.dense.bias", {h}, S::kReplicated, layer);
    add(p + "attention.output.LayerNorm.weight", {h}, S::kReplicated, layer);
    add(p + "attention.output.LayerNorm.bias", {h}, S::kReplicated, layer);
    add(p + "intermediate.dense.weight", {inner, h}, S::kRows, layer);
    add(p + "intermediate.dense.bias", {inner}, S::kRows, layer);
    add(p + "output.dense.weight", {h, inner}, S::kColumns, layer);
    add(p + "output.dense.bias", {h}, S::kReplicated, layer);
    add(p + "output.LayerNorm.weight", {h}, S::kReplicated, layer);
    add(p + "output.LayerNorm.bias", {h}, S::kReplicated, layer);
  }
  const std::int64_t labels = classifier_labels(spec);
  if (spec.model_type == ModelType::kRoberta) {
    add("classifier.dense.weight", {h, h}, S::kReplicated, head_layer);
    add("classifier.dense.bias", {h}, S::kReplicated, head_layer);
    add("classifier.out_proj.weight", {labels, h}, S::kReplicated, head_layer);
    add("classifier.out_proj.bias", {labels}, S::kReplicated, head_layer);
  } else {
    add(base + ".pooler.dense.weight", {h, h}, S::kReplicated, head_layer);
    add(base + ".pooler.dense.bias", {h}, S::kReplicated, head_layer);
    add("classifier.weight", {labels, h}, S::kReplicated, head_layer);
    add("classifier.bias", {labels}, S::kReplicated, head_layer);
  }
  return table;
}

// ---------------------------------------------------------------------------------------------
// The model

EncoderClassifier::EncoderClassifier(const ModelSpec& spec, const EncoderOptions& options,
                                     ParallelContext parallel)
    : spec_(spec),
      parallel_(std::move(parallel)),
      dropout_(options.dropout),
      recompute_(options.recompute),
      recompute_layers_(options.recompute_layers),
      sequence_parallel_(options.sequence_parallel),
      attention_(options.attention),
      first_layer_(options.first_layer),
      last_layer_(options.last_layer < 0 ? static_cast<int>(spec.layers) + 1 : options.last_layer),
      pad_id_(pad_token_id(spec.model_type)),
      eps_(layer_norm_eps(spec.model_type)),
      base_(base_prefix(spec)) {
  const std::vector<ParameterInfo> table = parameter_table(spec);
  const std::string source = "model " + spec.name;
  if (first_layer_ < 0 || first_layer_ > last_layer_ || last_layer_ > spec.layers + 1) {
    throw InputError(source, "layer range",
                     "0 <= first_layer <= last_layer <= " + std::to_string(spec.layers + 1) +
                         ", got " + std::to_string(first_layer_) + ".." +
                         std::to_string(last_layer_));
  }
  if (!parallel_.tp) throw std::invalid_argument("EncoderClassifier: null tensor-parallel comm");
  const int tp = parallel_.tp_size();
  const int tp_rank = parallel_.tp_rank();
  if (tp < 1 || tp_rank < 0 || tp_rank >= tp || spec.heads % tp != 0 || spec.ffn_hidden % tp != 0) {
    throw InputError(source, "tp",
                     "a tensor-parallel size dividing heads (" + std::to_string(spec.heads) +
                         ") and ffn_hidden (" + std::to_string(spec.ffn_hidden) + "), got " +
                         std::to_string(tp));
  }
  if (options.dropout < 0.0 || options.dropout >= 1.0) {
    throw InputError(source, "dropout", "a probability in [0, 1)");
  }
  if (sequence_parallel_ && tp < 2) {
    throw InputError(source, "sequence_parallel", "a tensor-parallel size above 1 (got tp 1)");
  }
  if (!runs_attention(attention_)) {
    throw InputError(source, "attention",
                     std::string("an attention kernel this LibTorch runs: ") +
                         costmodel::to_string(attention_) +
                         " needs LibTorch 2 or later (scaled_dot_product_attention); use "
                         "--attention math");
  }

  const auto target = torch::TensorOptions().device(options.device).dtype(options.dtype);
  for (const ParameterInfo& info : table) {
    if (info.layer < first_layer_ || info.layer > last_layer_) continue;
    torch::Tensor full = initial_value(info, spec, options.seed);
    torch::Tensor local = shard_of(full, info.split, tp_rank, tp);
    // A slice is copied out: a view would keep the whole full-size tensor alive.
    if (tp > 1) local = local.clone(at::MemoryFormat::Contiguous);
    add_parameter(info, local.to(target));
  }

  if (has_embeddings()) {
    const std::string emb = base_ + ".embeddings.";
    EmbeddingWeights e;
    e.word = find(emb + "word_embeddings.weight");
    e.position = find(emb + "position_embeddings.weight");
    if (spec.type_vocab > 0) e.token_type = find(emb + "token_type_embeddings.weight");
    e.norm = {find(emb + "LayerNorm.weight"), find(emb + "LayerNorm.bias")};
    embeddings_ = e;
  }
  for (int layer = std::max(first_layer_, 1);
       layer <= std::min(last_layer_, static_cast<int>(spec.layers)); ++layer) {
    const std::string p = base_ + ".encoder.layer." + std::to_string(layer - 1) + ".";
    auto linear = [&](const std::string& name) {
      return Linear{find(p + name + ".weight"), find(p + name + ".bias")};
    };
    layers_.push_back({linear("attention.self.query"), linear("attention.self.key"),
                       linear("attention.self.value"), linear("attention.output.dense"),
                       linear("attention.output.LayerNorm"), linear("intermediate.dense"),
                       linear("output.dense"), linear("output.LayerNorm")});
  }
  if (has_head()) {
    auto linear = [&](const std::string& name) {
      return Linear{find(name + ".weight"), find(name + ".bias")};
    };
    if (spec.model_type == ModelType::kRoberta) {
      head_ = HeadWeights{linear("classifier.dense"), linear("classifier.out_proj")};
    } else {
      head_ = HeadWeights{linear(base_ + ".pooler.dense"), linear("classifier")};
    }
  }
}

torch::Tensor& EncoderClassifier::add_parameter(const ParameterInfo& info, torch::Tensor value) {
  // Walk (creating as needed) the submodule path of the dotted name so that named_parameters()
  // yields the Hugging Face name.
  torch::nn::Module* node = this;
  std::string_view rest = info.name;
  for (std::size_t dot = rest.find('.'); dot != std::string_view::npos; dot = rest.find('.')) {
    const std::string part(rest.substr(0, dot));
    rest.remove_prefix(dot + 1);
    auto children = node->named_children();  // a copy; the children live in `node`
    std::shared_ptr<torch::nn::Module>* child = children.find(part);
    node = child != nullptr
               ? child->get()
               : node->register_module(part, std::make_shared<torch::nn::Module>()).get();
  }
  torch::Tensor& parameter = node->register_parameter(std::string(rest), std::move(value));
  infos_.push_back(info);
  local_.emplace_back(info.name, parameter);
  return parameter;
}

const torch::Tensor& EncoderClassifier::find(const std::string& name) const {
  for (const auto& [key, tensor] : local_) {
    if (key == name) return tensor;
  }
  throw std::logic_error("EncoderClassifier: no parameter " + name);
}

// ---------------------------------------------------------------------------------------------
// State

std::vector<std::pair<std::string, torch::Tensor>> EncoderClassifier::full_state() {
  torch::NoGradGuard no_grad;
  const int tp = parallel_.tp_size();
  const int rank = parallel_.tp_rank();
  std::vector<std::pair<std::string, torch::Tensor>> state;
  state.reserve(local_.size());
  for (std::size_t i = 0; i < local_.size(); ++i) {
    const ParameterInfo& info = infos_[i];
    const torch::Tensor& local = local_[i].second;
    torch::Tensor full;
    if (tp == 1 || info.split == TensorParallelSplit::kReplicated) {
      full = local.detach().clone();
    } else {
      // Each rank writes its slice into zeros; the sum over the group is the full tensor.
      full = torch::zeros(info.shape, local.options());
      write_shard(full, local, info.split, rank, tp);
      parallel_.tp->allreduce_sum(full);
    }
    state.emplace_back(info.name, full.to(torch::kCPU).contiguous());
  }
  return state;
}

namespace {

torch::ScalarType torch_dtype(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return torch::kFloat;
    case DType::kF16:
      return torch::kHalf;
    case DType::kBF16:
      return torch::kBFloat16;
    case DType::kF64:
      return torch::kDouble;
    default:
      return torch::kByte;  // not floating; refused by the caller
  }
}

bool is_float(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16 ||
         dtype == DType::kF64;
}

// The Hugging Face name a checkpoint tensor stands for, or "" for tensors that are skipped.
std::string canonical_name(std::string name, const std::string& base) {
  if (ends_with(name, "position_ids") || starts_with(name, "cls.") ||
      starts_with(name, "lm_head.")) {
    return "";
  }
  for (const auto& [old_spelling, new_spelling] :
       {std::pair<std::string_view, std::string_view>{"LayerNorm.gamma", "LayerNorm.weight"},
        {"LayerNorm.beta", "LayerNorm.bias"}}) {
    const std::size_t at = name.find(old_spelling);
    if (at != std::string::npos) name.replace(at, old_spelling.size(), new_spelling);
  }
  if (starts_with(name, "embeddings.") || starts_with(name, "encoder.") ||
      starts_with(name, "pooler.")) {
    return base + "." + name;
  }
  return name;
}

}  // namespace

LoadReport EncoderClassifier::load_safetensors(const std::string& path) {
  const SafetensorsFile file = SafetensorsFile::read(path);
  std::map<std::string, const TensorView*> by_name;
  for (const TensorView& view : file.tensors()) {
    const std::string name = canonical_name(view.name, base_);
    if (!name.empty()) by_name.emplace(name, &view);
  }
  LoadReport report;
  const int tp = parallel_.tp_size();
  const int rank = parallel_.tp_rank();
  const int head_layer = static_cast<int>(spec_.layers) + 1;
  torch::NoGradGuard no_grad;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> assignments;  // checked before any copy
  for (std::size_t i = 0; i < local_.size(); ++i) {
    const ParameterInfo& info = infos_[i];
    const auto found = by_name.find(info.name);
    if (found == by_name.end()) {
      if (info.layer == head_layer) {
        report.initialized.push_back(info.name);
        continue;
      }
      throw InputError(path, info.name,
                       "a tensor of shape " + shape_text(info.shape) + ", missing from the file");
    }
    const TensorView& view = *found->second;
    by_name.erase(found);
    if (view.shape != info.shape) {
      throw InputError(path, view.name,
                       "shape " + shape_text(info.shape) + " for " + info.name + ", found " +
                           shape_text(view.shape));
    }
    if (!is_float(view.dtype)) {
      throw InputError(
          path, view.name,
          "a floating-point tensor (F32, F16, BF16 or F64), found " + to_string(view.dtype));
    }
    const auto dtype = torch_dtype(view.dtype);
    torch::Tensor full = torch::empty(info.shape, torch::TensorOptions().dtype(dtype));
    if (static_cast<std::size_t>(full.nbytes()) != view.size_bytes) {
      throw InputError(path, view.name, "a data size matching its shape and dtype");
    }
    if (view.size_bytes > 0) std::memcpy(full.data_ptr(), view.data, view.size_bytes);
    assignments.emplace_back(local_[i].second, shard_of(full, info.split, rank, tp));
  }
  for (auto& [parameter, value] : assignments) parameter.copy_(value);
  for (const auto& [name, view] : by_name) report.unused.push_back(view->name);
  return report;
}

void EncoderClassifier::save_safetensors(const std::string& path) {
  const auto state = full_state();
  if (parallel_.tp_rank() != 0) return;
  std::vector<torch::Tensor> keep_alive;
  std::vector<TensorView> views;
  for (const auto& [name, tensor] : state) {
    torch::Tensor t = tensor;
    DType dtype = DType::kF32;
    if (t.scalar_type() == torch::kHalf) {
      dtype = DType::kF16;
    } else if (t.scalar_type() == torch::kBFloat16) {
      dtype = DType::kBF16;
    } else if (t.scalar_type() == torch::kDouble) {
      dtype = DType::kF64;
    } else {
      t = t.to(torch::kFloat);
    }
    t = t.contiguous();
    keep_alive.push_back(t);
    TensorView view;
    view.name = name;
    view.dtype = dtype;
    view.shape = t.sizes().vec();
    view.data = static_cast<const std::byte*>(t.data_ptr());
    view.size_bytes = static_cast<std::size_t>(t.nbytes());
    views.push_back(std::move(view));
  }
  write_safetensors(path, views, {{"format", "pt"}});
}

}  // namespace loom::executor
