// How the ranks of a job find each other and form their groups: the rendezvous store (the rank
// environment is rank_environment.cpp's) and the grid of data-, tensor- and pipeline-parallel
// groups in Megatron's rank order. The groups' operations are distributed.cpp's.
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "executor/distributed.hpp"
#include "executor/torch_compat.hpp"
#include "profiles/errors.hpp"

namespace loom::executor {

// ---------------------------------------------------------------------------------------------
// The rendezvous store

c10::intrusive_ptr<c10d::Store> connect_store(const RankEnvironment& environment,
                                              std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(environment.master_port);
  options.isServer = environment.rank == 0;
  options.numWorkers = static_cast<std::size_t>(environment.world_size);
  options.waitWorkers = true;
  options.timeout = timeout;
  try {
    try {
      return c10::make_intrusive<c10d::TCPStore>(environment.master_addr, options);
    } catch (const std::exception& e) {
      // A LibTorch without libuv: the classic backend instead (every rank decides alike).
      if (error_text(e).find("libuv") == std::string::npos ||
          !compat::use_classic_tcp_store(options)) {
        throw;
      }
      return c10::make_intrusive<c10d::TCPStore>(environment.master_addr, options);
    }
  } catch (const std::exception& e) {
    throw CollectiveError("rank " + std::to_string(environment.rank) + ": rendezvous at " +
                          environment.master_addr + ":" + std::to_string(environment.master_port) +
                          " (TCPStore, " + std::to_string(environment.world_size) +
                          " ranks) failed: " + error_text(e));
  }
}

c10::intrusive_ptr<c10d::Store> make_local_store() {
  return c10::make_intrusive<c10d::HashStore>();
}

// ---------------------------------------------------------------------------------------------
// The grid

RankCoordinates megatron_coordinates(int rank, int dp, int tp, int /*pp*/) {
  RankCoordinates c;
  c.tp = rank % tp;
  c.dp = (rank / tp) % dp;
  c.pp = rank / (tp * dp);
  return c;
}

int megatron_rank(const RankCoordinates& c, int dp, int tp) {
  return c.tp + tp * (c.dp + dp * c.pp);
}

ParallelGroups::ParallelGroups(const c10::intrusive_ptr<c10d::Store>& store, int world_rank, int dp,
                               int tp, int pp, const GroupOptions& options) {
  const int world = dp * tp * pp;
  if (dp < 1 || tp < 1 || pp < 1 || world_rank < 0 || world_rank >= world) {
    throw InputError("parallel layout", "",
                     "0 <= rank < dp * tp * pp, found rank " + std::to_string(world_rank) +
                         " of dp=" + std::to_string(dp) + " tp=" + std::to_string(tp) +
                         " pp=" + std::to_string(pp));
  }
  GroupOptions o = options;
  o.watch_world_size = world;
  coordinates_ = megatron_coordinates(world_rank, dp, tp, pp);
  std::vector<int> all(static_cast<std::size_t>(world));
  for (int r = 0; r < world; ++r) all[static_cast<std::size_t>(r)] = r;
  world_ = std::make_shared<ProcessGroup>(store, "world", all, world_rank, o);

  // tp groups: index = dp + dp_size * pp.
  for (int p = 0; p < pp; ++p) {
    for (int d = 0; d < dp; ++d) {
      std::vector<int> members;
      for (int t = 0; t < tp; ++t) members.push_back(megatron_rank({d, t, p}, dp, tp));
      if (coordinates_.dp == d && coordinates_.pp == p) {
        tp_ = std::make_shared<ProcessGroup>(store, "tp" + std::to_string(d + dp * p), members,
                                             world_rank, o);
      }
    }
  }
  for (int p = 0; p < pp; ++p) {
    for (int t = 0; t < tp; ++t) {
      std::vector<int> members;
      for (int d = 0; d < dp; ++d) members.push_back(megatron_rank({d, t, p}, dp, tp));
      if (coordinates_.tp == t && coordinates_.pp == p) {
        dp_ = std::make_shared<ProcessGroup>(store, "dp" + std::to_string(t + tp * p), members,
                                             world_rank, o);
      }
    }
  }
  for (int d = 0; d < dp; ++d) {
    for (int t = 0; t < tp; ++t) {
      std::vector<int> members;
      for (int p = 0; p < pp; ++p) members.push_back(megatron_rank({d, t, p}, dp, tp));
      if (coordinates_.tp == t && coordinates_.dp == d) {
        pp_ = std::make_shared<ProcessGroup>(store, "pp" + std::to_string(t + tp * d), members,
                                             world_rank, o);
        pp_down_ = pp == 1
                       ? pp_
                       : std::make_shared<ProcessGroup>(
                             store, "ppdown" + std::to_string(t + tp * d), members, world_rank, o);
      }
    }
  }
}

ProcessGroup& ParallelGroups::pp_to(int peer) { return peer > coordinates_.pp ? *pp_ : *pp_down_; }

ProcessGroup& ParallelGroups::pp_from(int peer) {
  return peer < coordinates_.pp ? *pp_ : *pp_down_;
}

}  // namespace loom::executor
