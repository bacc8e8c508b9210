#include "executor/checkpoint.hpp"

#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <stdexcept>
#include <system_error>

#include "costmodel/zero.hpp"
#include "executor/device.hpp"
#include "profiles/errors.hpp"
#include "profiles/loader.hpp"

namespace loom::executor {

namespace fs = std::filesystem;

std::string step_folder(std::int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step-%08lld", static_cast<long long>(step));
  return name;
}

std::int64_t folder_step(const std::string& name) {
  if (name.size() <= 5 || name.compare(0, 5, "step-") != 0) return -1;
  const std::string digits = name.substr(5);
  if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return -1;
  }
  return std::stoll(digits);
}

std::optional<std::string> latest_checkpoint(const std::string& checkpoint_dir) {
  std::error_code error;
  if (checkpoint_dir.empty() || !fs::is_directory(checkpoint_dir, error)) return std::nullopt;
  std::int64_t best = -1;
  fs::path best_path;
  for (const auto& entry : fs::directory_iterator(checkpoint_dir, error)) {
    const std::int64_t step = folder_step(entry.path().filename().string());
    if (step > best && fs::exists(entry.path() / kTrainerStateFile, error)) {
      best = step;
      best_path = entry.path();
    }
  }
  if (best < 0) return std::nullopt;
  return best_path.string();
}

nlohmann::json read_trainer_state(const fs::path& checkpoint) {
  const fs::path path = checkpoint / kTrainerStateFile;
  std::ifstream in(path);
  if (!in) throw InputError(path.string(), "", "a readable file");
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw InputError(path.string(), "", std::string("valid JSON (") + e.what() + ")");
  }
}

void check_trainer_state(const nlohmann::json& state, const std::string& source,
                         const profiles::ModelSpec& spec, std::uint64_t seed,
                         std::int64_t global_batch, std::int64_t train_count) {
  auto expect = [&](const char* key, const nlohmann::json& value, const std::string& what) {
    if (!state.contains(key) || state[key] != value) {
      throw InputError(source, std::string("$.") + key,
                       what + " of this run (" + value.dump() + ")");
    }
  };
  expect("format", kCheckpointFormat, "the format");
  expect("model", profiles::model_to_json(spec), "the model");
  expect("seed", seed, "the seed");
  expect("global_batch", global_batch, "the global batch");
  expect("train_examples", train_count, "the number of training examples");
}

nlohmann::json layout_json(const TrainOptions& o) {
  const std::vector<costmodel::StageRange> stages =
      o.stages.empty() ? costmodel::even_partition(o.model, o.pp * o.virtual_stages) : o.stages;
  nlohmann::json layout = {{"dp", o.dp},
                           {"tp", o.tp},
                           {"pp", o.pp},
                           {"zero", o.zero},
                           {"virtual_stages", o.virtual_stages},
                           {"stages", nlohmann::json::array()}};
  for (const costmodel::StageRange& r : stages) {
    layout["stages"].push_back({r.first_layer, r.last_layer});
  }
  if (costmodel::zero_policy(o.zero).shards_gradients) layout[kZeroShardsKey] = kZeroShardsBlocks;
  return layout;
}

CheckpointLayout read_layout(const nlohmann::json& state, const std::string& source) {
  CheckpointLayout l;
  bool block_shards = false;
  try {
    const nlohmann::json& j = state.at("layout");
    const auto shards = j.find(kZeroShardsKey);
    block_shards = shards != j.end() && *shards == kZeroShardsBlocks;
    l.dp = j.at("dp").get<int>();
    l.tp = j.at("tp").get<int>();
    l.pp = j.at("pp").get<int>();
    l.zero = j.at("zero").get<int>();
    l.virtual_stages = j.at("virtual_stages").get<int>();
    for (const nlohmann::json& r : j.at("stages")) {
      l.stages.push_back({r.at(0).get<int>(), r.at(1).get<int>()});
    }
  } catch (const nlohmann::json::exception& e) {
    throw InputError(source, "$.layout",
                     std::string("dp, tp, pp, zero, virtual_stages and stages (") + e.what() + ")");
  }
  const bool sizes =
      l.dp >= 1 && l.tp >= 1 && l.pp >= 1 && l.virtual_stages >= 1 && l.zero >= 0 && l.zero <= 3;
  if (!sizes || static_cast<int>(l.stages.size()) != l.pp * l.virtual_stages ||
      state.value("world_size", 0) != l.world_size()) {
    throw InputError(source, "$.layout",
                     "a layout of world_size = dp * tp * pp ranks and pp * virtual_stages stages");
  }
  // ZeRO-2/3 shards cut over the whole flat buffer (the layout of earlier builds, whose
  // trainer_state.json has no zero_shards) would load silently scrambled into block-by-block
  // engines: refused. With dp = 1 the two layouts are the same buffer.
  if (costmodel::zero_policy(l.zero).shards_gradients && l.dp > 1 && !block_shards) {
    throw InputError(source, std::string("$.layout.") + kZeroShardsKey,
                     std::string("\"") + kZeroShardsBlocks +
                         "\": ZeRO-2/3 shards taken block by block (a checkpoint without it was "
                         "written by an earlier Loom that cut them over the whole buffer; resume "
                         "or export it with that build)");
  }
  return l;
}

std::vector<torch::Tensor> capture_rng(Device device, int device_index) {
  const GeneratorStates g = capture_generators(
      device == Device::kCuda
          ? torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(device_index))
          : torch::Device(torch::kCPU));
  std::vector<torch::Tensor> states{g.cpu};
  if (g.cuda.defined()) states.push_back(g.cuda);
  return states;
}

void restore_rng(const std::vector<torch::Tensor>& states, Device device, int device_index,
                 const std::string& source) {
  const std::size_t expected = device == Device::kCuda ? 2 : 1;
  if (states.size() != expected) {
    throw InputError(source, "", "the RNG states of a " + std::string(to_string(device)) + " run");
  }
  GeneratorStates g;
  g.cpu = states[0];
  if (device == Device::kCuda) {
    g.cuda = states[1];
    g.cuda_device = device_index;
  }
  restore_generators(g);
}

namespace {

// Keeps the step folder `step` of `dir` and the newest keep - 1 older ones, removing the rest of
// the older ones; keep 0 removes none. Later steps (of another run) stay.
void remove_older_steps(const fs::path& dir, std::int64_t step, std::int64_t keep) {
  if (keep <= 0) return;
  std::vector<std::pair<std::int64_t, fs::path>> older;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::int64_t other = folder_step(entry.path().filename().string());
    if (other >= 0 && other < step) older.emplace_back(other, entry.path());
  }
  std::sort(older.begin(), older.end(), [](const auto& a, const auto& b) { return a > b; });
  for (std::size_t i = static_cast<std::size_t>(keep - 1); i < older.size(); ++i) {
    fs::remove_all(older[i].second);
  }
}

}  // namespace

void write_checkpoint(const fs::path& dir, std::int64_t step, EncoderClassifier& model,
                      torch::optim::AdamW& optimizer, const std::vector<torch::Tensor>& rng,
                      const nlohmann::ordered_json& state, const StepFolderExtras& extras,
                      bool kill_midway) {
  fs::create_directories(dir);
  const std::string name = step_folder(step);
  const std::string pid = std::to_string(static_cast<long long>(getpid()));
  const fs::path tmp = dir / (".tmp-" + name + "-" + pid);
  fs::remove_all(tmp);
  fs::create_directory(tmp);
  // Everything goes to the temporary folder first; a failure (disk full) removes it, so the
  // checkpoints under their final names stay whole.
  auto failed = [&](const std::string& what) {
    std::error_code ignored;
    fs::remove_all(tmp, ignored);
    throw std::runtime_error("cannot write checkpoint " + (dir / name).string() + ": " + what);
  };
  try {
    model.save_safetensors((tmp / "model.safetensors").string());
    if (kill_midway) ::raise(SIGKILL);  // fault injection (TrainOptions::fault_kill_in_checkpoint)
    torch::save(optimizer, (tmp / "optimizer.pt").string());
    torch::save(rng, (tmp / "rng.pt").string());
    if (extras.write_files) extras.write_files(tmp);
    profiles::write_file_atomically((tmp / kTrainerStateFile).string(), state.dump(2) + "\n");
  } catch (const c10::Error& e) {
    failed(e.what_without_backtrace());
  } catch (const std::exception& e) {
    failed(e.what());
  }
  const fs::path target = dir / name;
  profiles::replace_folder(tmp, target);  // the same step written again: swapped
  remove_older_steps(dir, step, extras.keep);
}

void write_rank_checkpoint(const fs::path& dir, std::int64_t step, ProcessGroup& world,
                           const std::vector<torch::Tensor>& rank_state,
                           const nlohmann::ordered_json& state, const StepFolderExtras& extras,
                           bool kill_midway) {
  const int world_rank = world.rank();
  const std::string name = step_folder(step);
  const fs::path tmp = dir / (".tmp-" + name);
  if (world_rank == 0) {
    fs::create_directories(dir);
    fs::remove_all(tmp);
    fs::create_directory(tmp);
  }
  world.barrier();
  std::string error;
  try {
    torch::save(rank_state, (tmp / ("rank-" + std::to_string(world_rank) + ".pt")).string());
    if (kill_midway) ::raise(SIGKILL);  // fault injection
    if (world_rank == 0) {
      if (extras.write_files) extras.write_files(tmp);
      profiles::write_file_atomically((tmp / kTrainerStateFile).string(), state.dump(2) + "\n");
    }
  } catch (const c10::Error& e) {
    error = e.what_without_backtrace();
  } catch (const std::exception& e) {
    error = e.what();
  }
  // Every rank learns whether every write succeeded before rank 0 renames.
  torch::Tensor failed = torch::tensor({error.empty() ? 0.0 : 1.0}, torch::kDouble);
  world.allreduce_sum(failed);
  if (failed.item<double>() != 0) {
    if (world_rank == 0) {
      std::error_code ignored;
      fs::remove_all(tmp, ignored);
    }
    throw std::runtime_error("cannot write checkpoint " + (dir / name).string() + ": " +
                             (error.empty() ? "another rank failed to write its part" : error));
  }
  if (world_rank == 0) {
    profiles::replace_folder(tmp, dir / name);
    remove_older_steps(dir, step, extras.keep);
  }
  world.barrier();
}

std::vector<torch::Tensor> read_rank_state(const fs::path& checkpoint, int world_rank,
                                           std::size_t min_tensors) {
  const fs::path mine = checkpoint / ("rank-" + std::to_string(world_rank) + ".pt");
  std::vector<torch::Tensor> saved;
  try {
    torch::load(saved, mine.string());
  } catch (const c10::Error& e) {
    throw InputError(
        mine.string(), "",
        std::string("a rank state written by loom train (") + e.what_without_backtrace() + ")");
  }
  if (saved.size() < min_tensors) {
    throw InputError(mine.string(), "", "parameters, moments, step, RNG");
  }
  return saved;
}

}  // namespace loom::executor
