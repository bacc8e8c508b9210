#include "executor/reshard.hpp"

#include <exception>
#include <map>
#include <optional>
#include <thread>

#include "costmodel/zero.hpp"
#include "executor/flat_adamw.hpp"
#include "executor/safetensors.hpp"
#include "executor/torch_compat.hpp"
#include "profiles/errors.hpp"
#include "profiles/loader.hpp"
#include "profiles/units.hpp"

namespace loom::executor {

namespace fs = std::filesystem;

namespace {

// The entries of `table` that global chunk `range` holds, in order.
std::vector<ParameterInfo> chunk_infos(const std::vector<ParameterInfo>& table,
                                       const costmodel::StageRange& range) {
  std::vector<ParameterInfo> out;
  for (const ParameterInfo& info : table) {
    if (info.layer >= range.first_layer && info.layer <= range.last_layer) out.push_back(info);
  }
  return out;
}

// The tensors of `named` by name.
std::map<std::string, torch::Tensor> by_name(const NamedTensors& named) {
  return {named.begin(), named.end()};
}

// Tensor-parallel rank `rank`'s slice of a full tensor, as EncoderClassifier holds it
// (executor/model.hpp): ceil(n / size) indices of the split dimension per rank, zero-padded
// where they run past n (the word embedding's vocabulary).
torch::Tensor tp_slice(const torch::Tensor& full, TensorParallelSplit split, int rank, int size) {
  if (split == TensorParallelSplit::kReplicated || size == 1) return full.clone();
  const std::int64_t dim = split == TensorParallelSplit::kRows ? 0 : 1;
  const std::int64_t n = full.size(dim);
  const std::int64_t part = (n + size - 1) / size;
  const std::int64_t start = std::min(n, rank * part);
  const std::int64_t length = std::min(n, start + part) - start;
  std::vector<std::int64_t> shape = full.sizes().vec();
  shape[static_cast<std::size_t>(dim)] = part;
  torch::Tensor slice = torch::zeros(shape, full.options());
  slice.narrow(dim, 0, length).copy_(full.narrow(dim, start, length));
  return slice;
}

// AdamW over `model`'s parameters in the two groups of the one-rank engine (train_single.cpp's
// make_optimizer): weights that decay, then the rest, each in the model's order. torch::load
// maps a saved optimizer's state to parameters by that order.
std::unique_ptr<torch::optim::AdamW> one_rank_optimizer(const EncoderClassifier& model) {
  std::vector<torch::Tensor> decay;
  std::vector<torch::Tensor> no_decay;
  for (const auto& [name, parameter] : model.local_parameters()) {
    (weight_decay_applies(name) ? decay : no_decay).push_back(parameter);
  }
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(1e-3));
  groups.emplace_back(no_decay, std::make_unique<torch::optim::AdamWOptions>(1e-3));
  return std::make_unique<torch::optim::AdamW>(groups, torch::optim::AdamWOptions(1e-3));
}

// A one-rank step folder: model.safetensors, optimizer.pt, rng.pt.
TrainingState read_one_rank_checkpoint(const fs::path& step, const profiles::ModelSpec& spec,
                                       std::uint64_t seed) {
  const fs::path weights = step / "model.safetensors";
  if (!fs::is_regular_file(weights)) {
    throw InputError(weights.string(), "", "the checkpoint's weights (model.safetensors)");
  }
  EncoderOptions options;
  options.dropout = 0.0;
  options.seed = seed;
  EncoderClassifier model(spec, options);
  model.load_safetensors(weights.string());
  TrainingState full;
  full.parameters = model.full_state();
  const std::unique_ptr<torch::optim::AdamW> optimizer = one_rank_optimizer(model);
  try {
    torch::load(*optimizer, (step / "optimizer.pt").string());
    torch::load(full.rng, (step / "rng.pt").string());
  } catch (const c10::Error& e) {
    throw InputError(
        step.string(), "optimizer.pt / rng.pt",
        std::string("a readable optimizer and RNG state (") + e.what_without_backtrace() + ")");
  }
  torch::NoGradGuard no_grad;
  for (const auto& [name, parameter] : model.local_parameters()) {
    const auto found = optimizer->state().find(compat::optimizer_state_key(*optimizer, parameter));
    if (found == optimizer->state().end()) {  // never stepped: AdamW's zeros
      full.exp_avg.emplace_back(name, torch::zeros_like(parameter));
      full.exp_avg_sq.emplace_back(name, torch::zeros_like(parameter));
      continue;
    }
    const auto& state = static_cast<const torch::optim::AdamWParamState&>(*found->second);
    full.exp_avg.emplace_back(name, state.exp_avg().to(torch::kCPU).to(torch::kFloat).clone());
    full.exp_avg_sq.emplace_back(name,
                                 state.exp_avg_sq().to(torch::kCPU).to(torch::kFloat).clone());
    full.optimizer_step = std::max(full.optimizer_step, state.step());
  }
  return full;
}

// The ZeRO stage of an engine whose held parameters have the layout of a stage-`zero` rank's
// moments: ZeRO-2/3 shard every block (ZeRO-3's parameter shard); ZeRO-0/1 keep one buffer,
// whole in a ZeRO-0 engine (ZeRO-1's slice of it is cut or gathered around the engine).
int moment_engine_zero(int zero) { return costmodel::zero_policy(zero).shards_gradients ? 3 : 0; }

// Whether a stage-`zero` rank keeps its moments as its contiguous slice of the one buffer
// (ZeRO-1: the optimizer states sharded, the gradients not).
bool moments_in_slices(int zero) {
  const costmodel::ZeroPolicy policy = costmodel::zero_policy(zero);
  return policy.shards_optimizer_states && !policy.shards_gradients;
}

// This rank's contiguous slice of a ZeRO-1 buffer, gathered over dp into the whole buffer.
torch::Tensor gathered_over_dp(const torch::Tensor& slice, ParallelGroups& groups) {
  const int dp = groups.dp().size();
  if (dp == 1) return slice;
  torch::Tensor whole = torch::empty({slice.numel() * dp}, slice.options());
  groups.dp().allgather(whole, slice.contiguous());
  return whole;
}

// A many-rank step folder: the layout's ranks as threads, each loading its rank-R.pt three
// times (the parameters, then each moment in their place) and gathering the full tensors to
// rank 0 (see the top of reshard.hpp).
TrainingState read_many_rank_checkpoint(const fs::path& step, const nlohmann::json& state,
                                        const profiles::ModelSpec& spec, std::uint64_t seed) {
  const CheckpointLayout l = read_layout(state, (step / kTrainerStateFile).string());
  check_rank_files(step, l);
  // The moments' layout (flat_parameters.hpp): ZeRO-2/3 keep them as ZeRO-3's parameter shard
  // (this rank's piece of every block); ZeRO-1 as this rank's contiguous slice of the whole
  // buffer, gathered over dp back into the whole buffer of a ZeRO-0 engine; ZeRO-0 whole.
  const int moment_zero = moment_engine_zero(l.zero);
  TrainingState full;
  run_layout_ranks(l, [&](ParallelGroups& groups) {
    const int rank = groups.world_rank();
    const std::string file = (step / ("rank-" + std::to_string(rank) + ".pt")).string();
    std::vector<torch::Tensor> saved;
    if (!loaded_everywhere(groups, [&] { saved = read_rank_state(step, rank, 5); })) return;
    for (int pass = 0; pass < 3; ++pass) {
      LayoutRank r = build_layout_rank(spec, l, pass == 0 ? l.zero : moment_zero, seed, groups);
      torch::Tensor held = saved[static_cast<std::size_t>(pass)];
      if (pass > 0 && moments_in_slices(l.zero)) held = gathered_over_dp(held, groups);
      const std::vector<torch::Tensor> slots = {held, held, held, saved[3]};
      if (!loaded_everywhere(groups, [&] {
            r.flat->load_state(
                pass == 0 ? std::vector<torch::Tensor>(saved.begin(), saved.begin() + 4) : slots,
                file);
          })) {
        return;
      }
      NamedTensors named = gather_full_state(r.chunks, l.stages, *r.flat, groups);
      if (rank != 0) continue;
      (pass == 0 ? full.parameters : pass == 1 ? full.exp_avg : full.exp_avg_sq) = std::move(named);
    }
    if (rank == 0) {
      full.optimizer_step = saved[3].item<std::int64_t>();
      full.rng.assign(saved.begin() + 4, saved.end());
    }
  });
  return full;
}

}  // namespace

bool needs_reshard(const nlohmann::json& state, const TrainOptions& o) {
  const bool many = o.dp * o.tp * o.pp > 1;
  if (!state.contains("layout")) return many;
  return !many || state.at("layout") != layout_json(o);
}

TrainingState read_training_state(const fs::path& step, const nlohmann::json& state) {
  const std::string source = (step / kTrainerStateFile).string();
  if (!state.contains("model")) throw InputError(source, "$.model", "the model (loom-model/1)");
  const profiles::ModelSpec spec = profiles::model_from_json(state.at("model"), source);
  check_encoder(spec);
  const auto seed = state.value("seed", std::uint64_t{42});
  if (state.contains("layout")) return read_many_rank_checkpoint(step, state, spec, seed);
  return read_one_rank_checkpoint(step, spec, seed);
}

void load_training_state(const TrainingState& full,
                         const std::vector<std::unique_ptr<EncoderClassifier>>& chunks,
                         FlatParameters& flat, int zero, ParallelGroups& groups,
                         const std::string& source) {
  // What an engine of ZeRO stage `engine_zero` holds of `values` on this rank: this rank's tp
  // slices of its chunks' tensors, flattened and sharded as the engine does it.
  auto held = [&](const NamedTensors& values, int engine_zero) {
    const std::map<std::string, torch::Tensor> named = by_name(values);
    std::vector<std::vector<FlatParameter>> leaves;
    for (const auto& chunk : chunks) {
      const int tp = chunk->parallel().tp_size();
      const int tp_rank = chunk->parallel().tp_rank();
      std::vector<FlatParameter> list;
      for (const ParameterInfo& info : chunk->parameter_infos()) {
        const auto found = named.find(info.name);
        if (found == named.end() || found->second.sizes().vec() != info.shape) {
          throw InputError(source, info.name,
                           "a tensor of the model of this run, missing from the checkpoint");
        }
        torch::Tensor slice = tp_slice(found->second, info.split, tp_rank, tp);
        list.push_back(
            {slice.requires_grad_(true), weight_decay_applies(info.name), true, info.layer});
      }
      leaves.push_back(std::move(list));
    }
    FlatOptions options;
    options.zero = engine_zero;
    FlatParameters engine(leaves, options, groups, torch::kCPU);
    return engine.state()[0];
  };
  // ZeRO-1's moments: this rank's contiguous slice of the whole buffer (see above).
  const int moment_zero = moment_engine_zero(zero);
  auto moment = [&](const NamedTensors& values) {
    torch::Tensor whole = held(values, moment_zero);
    if (!moments_in_slices(zero)) return whole;
    std::vector<torch::Tensor> pieces;  // one range for ZeRO-1's single buffer
    for (const auto& [start, length] : flat.shard_ranges()) {
      pieces.push_back(whole.narrow(0, start, length));
    }
    return torch::cat(pieces).clone();
  };
  flat.load_state({held(full.parameters, zero), moment(full.exp_avg), moment(full.exp_avg_sq),
                   torch::tensor({full.optimizer_step}, torch::kLong)},
                  source);
}

void load_training_state(const TrainingState& full, EncoderClassifier& model,
                         torch::optim::AdamW& optimizer, const torch::Device& device) {
  const std::map<std::string, torch::Tensor> parameters = by_name(full.parameters);
  const std::map<std::string, torch::Tensor> exp_avg = by_name(full.exp_avg);
  const std::map<std::string, torch::Tensor> exp_avg_sq = by_name(full.exp_avg_sq);
  torch::NoGradGuard no_grad;
  for (const auto& [name, parameter] : model.local_parameters()) {
    const auto value = parameters.find(name);
    if (value == parameters.end() || !exp_avg.count(name) || !exp_avg_sq.count(name)) {
      throw InputError("checkpoint", name, "a tensor of the model of this run");
    }
    parameter.copy_(value->second);
    auto state = std::make_unique<torch::optim::AdamWParamState>();
    state->step(full.optimizer_step);
    state->exp_avg(exp_avg.at(name).to(device).clone());
    state->exp_avg_sq(exp_avg_sq.at(name).to(device).clone());
    optimizer.state()[compat::optimizer_state_key(optimizer, parameter)] = std::move(state);
  }
}

void restore_resharded_rng(const TrainingState& full, Device device, int device_index) {
  if (full.rng.empty()) return;
  // Both generators when both runs are on CUDA, else the CPU's alone.
  const bool both = device == Device::kCuda && full.rng.size() >= 2;
  const std::vector<torch::Tensor> states(full.rng.begin(), full.rng.begin() + (both ? 2 : 1));
  restore_rng(states, both ? Device::kCuda : Device::kCpu, device_index, "checkpoint RNG state");
}

void check_plan_memory(const planner::Plan& plan, const std::string& source) {
  const planner::Plan evaluated = planner::evaluate_strategy(planner::cost_model_of(plan), plan.job,
                                                             plan.strategy, plan.stages);
  const auto limit = static_cast<double>(plan.cluster.device.memory_bytes);
  const std::vector<costmodel::MemoryBreakdown>& stages = evaluated.predicted.memory_by_stage;
  for (std::size_t i = 0; i < stages.size(); ++i) {
    const double need = stages[i].total();
    if (need <= limit) continue;
    throw InputError(source, "$.strategy",
                     "a layout that holds the model to resume into: pipeline stage " +
                         std::to_string(i) + " needs " + profiles::gib_text(need) +
                         " per device, more than the " + profiles::gib_text(limit) + " of " +
                         plan.cluster.name + "'s devices (re-plan with loom plan)");
  }
}

void check_resume_memory(const TrainOptions& options, const planner::Plan& plan,
                         const std::string& source) {
  if (!options.resume) return;
  const std::optional<std::string> latest = latest_checkpoint(options.checkpoint_dir);
  if (!latest) return;
  if (needs_reshard(read_trainer_state(*latest), options)) check_plan_memory(plan, source);
}

LayoutRank build_layout_rank(const profiles::ModelSpec& model, const CheckpointLayout& l, int zero,
                             std::uint64_t seed, ParallelGroups& groups) {
  const RankCoordinates c = groups.coordinates();
  ParallelContext context;
  context.tp = std::make_shared<GroupTensorParallelComm>(groups.tp_group());
  LayoutRank r;
  for (int k = 0; k < l.virtual_stages; ++k) {
    EncoderOptions options;
    options.dropout = 0.0;
    options.seed = seed;
    const costmodel::StageRange& range = l.stages[static_cast<std::size_t>(k * l.pp + c.pp)];
    options.first_layer = range.first_layer;
    options.last_layer = range.last_layer;
    r.chunks.push_back(std::make_unique<EncoderClassifier>(model, options, context));
  }
  FlatOptions flat_options;
  flat_options.zero = zero;
  r.flat = std::make_unique<FlatParameters>(flat_parameters_of(r.chunks, c.tp == 0), flat_options,
                                            groups, torch::kCPU);
  return r;
}

void run_layout_ranks(const CheckpointLayout& l,
                      const std::function<void(ParallelGroups& groups)>& body) {
  const int world = l.world_size();
  const auto store = make_local_store();
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        GroupOptions options;
        ParallelGroups groups(store, r, l.dp, l.tp, l.pp, options);
        body(groups);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const std::exception_ptr& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

bool loaded_everywhere(ParallelGroups& groups, const std::function<void()>& load) {
  std::exception_ptr refused;
  try {
    load();
  } catch (const InputError&) {
    refused = std::current_exception();
  }
  torch::Tensor failed = torch::tensor({refused ? 1.0 : 0.0}, torch::kDouble);
  groups.world().allreduce_sum(failed);
  if (refused) std::rethrow_exception(refused);
  return failed.item<double>() == 0;
}

void check_rank_files(const fs::path& step, const CheckpointLayout& l) {
  const int world = l.world_size();
  for (int r = 0; r < world; ++r) {
    const fs::path file = step / ("rank-" + std::to_string(r) + ".pt");
    if (!fs::is_regular_file(file)) {
      throw InputError(file.string(), "",
                       "rank " + std::to_string(r) + "'s state of the " + std::to_string(world) +
                           " ranks this checkpoint was written by");
    }
  }
}

std::vector<std::pair<std::string, torch::Tensor>> gather_full_state(
    const std::vector<std::unique_ptr<EncoderClassifier>>& chunks,
    const std::vector<costmodel::StageRange>& stages, FlatParameters& flat,
    ParallelGroups& groups) {
  const torch::Device device = chunks.front()->local_parameters().front().second.device();
  flat.materialize();  // ZeRO-3: the full parameters from the dp shards
  std::vector<std::vector<std::pair<std::string, torch::Tensor>>> local;
  for (const auto& chunk : chunks) local.push_back(chunk->full_state());  // tp gathers
  flat.release();
  const RankCoordinates c = groups.coordinates();
  const int pp = groups.pp_size();
  std::vector<std::pair<std::string, torch::Tensor>> state;
  // The dp-0, tp-0 rank of each pipeline rank holds its stages in full; pipeline rank 0 of them
  // (world rank 0) receives the others', one global chunk at a time, in chunk order.
  if (c.dp == 0 && c.tp == 0) {
    const std::vector<ParameterInfo> table = parameter_table(chunks.front()->spec());
    for (int g = 0; g < static_cast<int>(stages.size()); ++g) {
      const int owner = g % pp;
      auto& mine = local[static_cast<std::size_t>(g / pp)];
      if (owner == c.pp && c.pp == 0) {
        state.insert(state.end(), mine.begin(), mine.end());
      } else if (owner == c.pp) {
        std::vector<torch::Tensor> parts;
        for (const auto& entry : mine) parts.push_back(entry.second.reshape({-1}));
        const torch::Tensor packed = torch::cat(parts).to(torch::kFloat).to(device);
        groups.pp_to(0).send(packed, 0, g).wait();
      } else if (c.pp == 0) {
        const std::vector<ParameterInfo> infos =
            chunk_infos(table, stages[static_cast<std::size_t>(g)]);
        std::int64_t numel = 0;
        for (const ParameterInfo& info : infos) numel += element_count(info.shape);
        torch::Tensor packed =
            torch::empty({numel}, torch::TensorOptions().dtype(torch::kFloat).device(device));
        groups.pp_from(owner).recv(packed, owner, g);
        packed = packed.to(torch::kCPU);
        std::int64_t offset = 0;
        for (const ParameterInfo& info : infos) {
          const std::int64_t n = element_count(info.shape);
          state.emplace_back(info.name, packed.narrow(0, offset, n).view(info.shape).clone());
          offset += n;
        }
      }
    }
  }
  return state;
}

std::vector<std::vector<FlatParameter>> flat_parameters_of(
    const std::vector<std::unique_ptr<EncoderClassifier>>& chunks, bool first_tp) {
  std::vector<std::vector<FlatParameter>> out;
  for (const auto& chunk : chunks) {
    const std::vector<ParameterInfo> infos = chunk->parameter_infos();
    std::vector<FlatParameter> parameters;
    std::size_t i = 0;
    for (const auto& [name, tensor] : chunk->local_parameters()) {
      const ParameterInfo& info = infos[i++];
      const bool replicated = info.split == TensorParallelSplit::kReplicated;
      parameters.push_back({tensor, weight_decay_applies(name), first_tp || !replicated, info.layer,
                            !lookup_table(name)});
    }
    out.push_back(std::move(parameters));
  }
  return out;
}

}  // namespace loom::executor
