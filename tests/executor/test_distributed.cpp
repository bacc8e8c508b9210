// Many ranks: the environment, c10d groups over Gloo (ranks are threads of this process sharing an
// in-memory store), a lost peer, and the gold standard: every parallel layout trains to the same
// losses as one process on the same data and seed.
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <exception>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "executor/distributed.hpp"
#include "executor/profiler.hpp"
#include "executor/train.hpp"
#include "profiles/errors.hpp"
#include "tests/executor/fixtures.hpp"
#include "tests/executor/thread_ranks.hpp"
#include "tests/executor/torch_catch.hpp"

using loom::InputError;
using loom::executor::CollectiveError;
using loom::executor::EncodedExample;
using loom::executor::GroupOptions;
using loom::executor::ParallelGroups;
using loom::executor::ProcessGroup;
using loom::executor::TrainOptions;
using loom::executor::TrainSummary;
using loom::profiles::ModelSpec;
using loom::profiles::ModelType;
using Schedule = loom::costmodel::Schedule;

namespace {

using loom::test::run_ranks;

GroupOptions quick(std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  GroupOptions o;
  o.timeout = timeout;
  return o;
}

}  // namespace

TEST_CASE("Rank, world and master come from torchrun or Slurm variables", "[distributed]") {
  using loom::executor::expand_nodelist;
  using loom::executor::rank_environment;
  CHECK(expand_nodelist("node[01-03,7],gpu7") ==
        std::vector<std::string>{"node01", "node02", "node03", "node7", "gpu7"});
  CHECK(expand_nodelist("a1") == std::vector<std::string>{"a1"});
  CHECK(expand_nodelist("n[9-11]x") == std::vector<std::string>{"n9x", "n10x", "n11x"});
  CHECK_THROWS_AS(expand_nodelist("node[1-"), InputError);
  CHECK_THROWS_AS(expand_nodelist("node[3-1]"), InputError);

  auto from = [](std::map<std::string, std::string> vars) {
    return rank_environment([vars](const std::string& name) -> std::optional<std::string> {
      const auto found = vars.find(name);
      if (found == vars.end()) return std::nullopt;
      return found->second;
    });
  };
  const auto single = from({});
  CHECK(single.world_size == 1);
  CHECK(single.rank == 0);
  const auto torchrun = from({{"RANK", "3"},
                              {"WORLD_SIZE", "4"},
                              {"LOCAL_RANK", "1"},
                              {"MASTER_ADDR", "10.0.0.2"},
                              {"MASTER_PORT", "1234"}});
  CHECK(torchrun.rank == 3);
  CHECK(torchrun.world_size == 4);
  CHECK(torchrun.local_rank == 1);
  CHECK(torchrun.master_addr == "10.0.0.2");
  CHECK(torchrun.master_port == 1234);
  const auto slurm = from({{"SLURM_PROCID", "5"},
                           {"SLURM_NTASKS", "8"},
                           {"SLURM_LOCALID", "1"},
                           {"SLURM_JOB_NODELIST", "gpu[07-08]"}});
  CHECK(slurm.rank == 5);
  CHECK(slurm.world_size == 8);
  CHECK(slurm.local_rank == 1);
  CHECK(slurm.master_addr == "gpu07");
  CHECK_THROWS_AS(from({{"RANK", "4"}, {"WORLD_SIZE", "4"}}), InputError);
  CHECK_THROWS_AS(from({{"WORLD_SIZE", "two"}}), InputError);
}

TEST_CASE("Gloo groups: collectives, point to point and sub-groups", "[distributed]") {
  const auto store = loom::executor::make_local_store();
  // dp=2 x tp=2: tp groups {0,1} {2,3}, dp groups {0,2} {1,3}.
  run_ranks(4, [&](int rank) {
    ParallelGroups groups(store, rank, 2, 2, 1, quick());
    CHECK(groups.coordinates().tp == rank % 2);
    CHECK(groups.coordinates().dp == rank / 2);
    torch::Tensor x = torch::full({3}, static_cast<float>(rank + 1));
    groups.tp().allreduce_sum(x);
    const float tp_sum = rank < 2 ? 3.0f : 7.0f;
    CHECK(torch::allclose(x, torch::full({3}, tp_sum)));
    torch::Tensor y = torch::full({2, 2}, static_cast<float>(rank)).t();  // not contiguous
    groups.dp().allreduce_sum(y);
    CHECK(torch::allclose(y, torch::full({2, 2}, static_cast<float>(rank % 2 == 0 ? 2 : 4))));

    ProcessGroup& world = groups.world();
    torch::Tensor gathered = torch::empty({8});
    world.allgather(gathered, torch::full({2}, static_cast<float>(rank)));
    CHECK(torch::equal(gathered, torch::tensor({0.f, 0.f, 1.f, 1.f, 2.f, 2.f, 3.f, 3.f})));
    torch::Tensor chunk = torch::empty({2});
    world.reduce_scatter_sum(chunk, torch::arange(8, torch::kFloat));
    CHECK(torch::equal(chunk, torch::tensor({8.f * rank, 8.f * rank + 4.f})));
    torch::Tensor b = torch::full({1}, static_cast<float>(rank));
    world.broadcast(b, 2);
    CHECK(b.item<float>() == 2.0f);
    if (rank % 2 == 0) {
      auto pending = world.send(torch::full({4}, 10.0f + rank), rank + 1, 5);
      pending.wait();
    } else {
      torch::Tensor in = torch::empty({4});
      world.recv(in, rank - 1, 5);
      CHECK(torch::equal(in, torch::full({4}, 10.0f + rank - 1)));
    }
    world.barrier();
  });
}

// (No ';' in test names: CTest's discovery splits a name at it into two tests that run nothing.)
TEST_CASE("Point to point: tags match on Gloo, order alone under p2p_by_order as on NCCL",
          "[distributed]") {
  // Rank 0 sends 1 (tag 1) then 2 (tag 2); rank 1 receives tag 2 first. Gloo matches the tags;
  // NCCL, which ignores them, would hand the first send to the first receive.
  for (const bool by_order : {false, true}) {
    INFO("p2p_by_order " << by_order);
    const auto store = loom::executor::make_local_store();
    run_ranks(2, [&](int rank) {
      GroupOptions options = quick();
      options.p2p_by_order = by_order;
      ParallelGroups groups(store, rank, 1, 1, 2, options);
      if (rank == 0) {
        auto first = groups.pp_to(1).send(torch::full({2}, 1.0f), 1, 1);
        auto second = groups.pp_to(1).send(torch::full({2}, 2.0f), 1, 2);
        first.wait();
        second.wait();
        // The other way goes through the other group: no tag or order is shared with the above.
        groups.pp_to(1).barrier();
        torch::Tensor back = torch::empty({2});
        groups.pp_from(1).recv(back, 1, 1);
        CHECK(back[0].item<float>() == 3.0f);
      } else {
        torch::Tensor a = torch::empty({2});
        torch::Tensor b = torch::empty({2});
        groups.pp_from(0).recv(a, 0, 2);
        groups.pp_from(0).recv(b, 0, 1);
        CHECK(a[0].item<float>() == (by_order ? 1.0f : 2.0f));
        CHECK(b[0].item<float>() == (by_order ? 2.0f : 1.0f));
        groups.pp_from(0).barrier();
        groups.pp_to(0).send(torch::full({2}, 3.0f), 0, 1).wait();
      }
    });
  }
}

TEST_CASE("Under p2p_by_order a send holds the group's next operation until it is received",
          "[distributed]") {
  // Both ranks send, then receive, in one group. Gloo runs the two sends at once and both
  // receives meet them; on one NCCL stream each send waits for a receive that is queued behind
  // the peer's own send, so the pair deadlocks, and under p2p_by_order the receive times out.
  for (const bool by_order : {false, true}) {
    INFO("p2p_by_order " << by_order);
    const auto store = loom::executor::make_local_store();
    std::vector<std::string> errors(2);
    const auto started = std::chrono::steady_clock::now();
    run_ranks(2, [&](int rank) {
      GroupOptions options = quick(std::chrono::milliseconds(1000));
      options.p2p_by_order = by_order;
      ProcessGroup group(store, "pair", {0, 1}, rank, options);
      const int peer = 1 - rank;
      try {
        auto sent = group.send(torch::full({2}, static_cast<float>(rank)), peer, 0);
        torch::Tensor in = torch::empty({2});
        group.recv(in, peer, 0);
        sent.wait();
        CHECK(in[0].item<float>() == static_cast<float>(peer));
      } catch (const CollectiveError& e) {
        errors[static_cast<std::size_t>(rank)] = e.what();
      }
    });
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    for (const std::string& error : errors) {
      INFO(error);
      if (by_order) {
        CHECK_THAT(error, Catch::Contains("recv from rank"));
      } else {
        CHECK(error.empty());
      }
    }
    CHECK(seconds < 10.0);
  }
}

TEST_CASE("A lost peer ends the others with an error naming it and the operation",
          "[distributed]") {
  const auto store = loom::executor::make_local_store();
  std::string message;
  const auto started = std::chrono::steady_clock::now();
  run_ranks(2, [&](int rank) {
    ParallelGroups groups(store, rank, 2, 1, 1, quick(std::chrono::milliseconds(1500)));
    if (rank == 1) return;  // lost: leaves without taking part (its groups are torn down)
    torch::Tensor x = torch::ones({4});
    try {
      groups.dp().allreduce_sum(x);
    } catch (const CollectiveError& e) {
      message = e.what();
    }
  });
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  INFO(message);
  CHECK_THAT(message,
             Catch::Contains("rank 0: allreduce_sum on group dp0 (ranks 0,1, timeout 1.5 s)"));
  CHECK_THAT(message, Catch::Contains("lost rank(s) 1"));
  CHECK(seconds < 10.0);
}

// ---------------------------------------------------------------------------------------------
// The gold standard

namespace {

TrainOptions base_options(std::int64_t layers) {
  TrainOptions o;
  o.model.name = "synthetic";
  o.model.model_type = ModelType::kBert;
  o.model.layers = layers;
  o.model.hidden = 32;
  o.model.heads = 4;
  o.model.ffn_hidden = 64;
  o.model.vocab = 32;
  o.model.max_positions = 16;
  o.model.type_vocab = 2;
  o.model.num_labels = 2;
  o.micro_batch = 2;
  o.steps = 10;
  o.lr = 2e-3;
  o.warmup_steps = 2;
  o.max_grad_norm = 1.0;
  o.dropout = 0.0;  // equivalence needs no dropout (or a replicated RNG)
  o.seed = 11;
  o.progress = false;
  return o;
}

struct Layout {
  const char* name;
  int dp, tp, pp, zero;
  Schedule schedule;
  std::int64_t micro_batches;  // per dp rank
  std::int64_t layers;
  int virtual_stages = 1;
  bool sequence_parallel = false;
};

// The losses of every rank of `layout`, and the validation loss of rank 0.
TrainSummary run_layout(const Layout& l, const std::vector<EncodedExample>& train,
                        const std::vector<EncodedExample>& validation, std::int64_t steps = 10,
                        bool host_staging = false) {
  TrainOptions o = base_options(l.layers);
  o.steps = steps;
  o.dp = l.dp;
  o.tp = l.tp;
  o.pp = l.pp;
  o.zero = l.zero;
  o.schedule = l.schedule;
  o.virtual_stages = l.virtual_stages;
  o.sequence_parallel = l.sequence_parallel;
  o.num_micro_batches = l.micro_batches;
  o.bucket_bytes = 16 << 10;  // several buckets, started from gradient hooks
  const int world = l.dp * l.tp * l.pp;
  const auto store = loom::executor::make_local_store();
  std::vector<TrainSummary> summaries(static_cast<std::size_t>(world));
  // Point-to-point operations matched by order, as NCCL matches them: a schedule whose stages
  // disagree on the order of their sends and receives trains wrong here.
  GroupOptions options = quick();
  options.p2p_by_order = true;
  options.host_staging = host_staging;
  run_ranks(world, [&](int rank) {
    ParallelGroups groups(store, rank, l.dp, l.tp, l.pp, options);
    summaries[static_cast<std::size_t>(rank)] =
        loom::executor::train_classifier(o, train, validation, groups);
  });
  for (const TrainSummary& s : summaries) CHECK(s.losses == summaries[0].losses);
  return summaries[0];
}

}  // namespace

TEST_CASE("Every parallel layout trains to the single-process losses", "[distributed][gold]") {
  // Tolerance (fp32, dropout 0, the same seeded full tensors and the same global batch): each of
  // the 10 losses and the final validation loss within 1e-4 relative (+1e-6 absolute) of the one
  // process run; what differs is only the order of floating-point sums (all-reduce, the
  // tensor-parallel split of matmuls, the clipping norm).
  const auto train = loom::test::synthetic_examples(256, 3);
  const auto validation = loom::test::synthetic_examples(24, 4);
  const std::vector<Layout> layouts = {
      {"dp2", 2, 1, 1, 0, Schedule::k1F1B, 2, 2},
      {"dp2 zero1", 2, 1, 1, 1, Schedule::k1F1B, 2, 2},
      {"dp2 zero2", 2, 1, 1, 2, Schedule::k1F1B, 2, 2},
      {"dp2 zero3", 2, 1, 1, 3, Schedule::k1F1B, 2, 2},
      {"dp4 zero3", 4, 1, 1, 3, Schedule::k1F1B, 1, 2},
      {"dp4 zero2", 4, 1, 1, 2, Schedule::k1F1B, 1, 2},
      {"tp2", 1, 2, 1, 0, Schedule::k1F1B, 4, 2},
      {"pp2 gpipe", 1, 1, 2, 0, Schedule::kGpipe, 4, 2},
      {"pp2 1f1b", 1, 1, 2, 0, Schedule::k1F1B, 4, 2},
      {"pp4 1f1b", 1, 1, 4, 0, Schedule::k1F1B, 4, 4},
      {"pp2 interleaved v2", 1, 1, 2, 0, Schedule::kInterleaved, 4, 4, 2},
      {"pp4 interleaved v2", 1, 1, 4, 0, Schedule::kInterleaved, 8, 8, 2},
      {"dp2 x tp2", 2, 2, 1, 0, Schedule::k1F1B, 2, 2},
      {"dp2 x pp2", 2, 1, 2, 1, Schedule::k1F1B, 2, 2},
      {"tp2 x pp2", 1, 2, 2, 0, Schedule::kGpipe, 4, 2},
      {"dp2 x tp2 zero3", 2, 2, 1, 3, Schedule::kGpipe, 2, 2},
      {"dp2 x pp2 zero2 interleaved v2", 2, 1, 2, 2, Schedule::kInterleaved, 4, 4, 2},
      {"dp2 x pp2 zero2", 2, 1, 2, 2, Schedule::k1F1B, 2, 2},
      {"dp2 x pp2 zero3", 2, 1, 2, 3, Schedule::k1F1B, 2, 2},
      // Sequence parallelism (12 tokens: 6 per tp rank; stages exchange the shards).
      {"tp2 sp", 1, 2, 1, 0, Schedule::k1F1B, 4, 2, 1, true},
      {"dp2 x tp2 sp", 2, 2, 1, 0, Schedule::k1F1B, 2, 2, 1, true},
      {"tp2 x pp2 sp", 1, 2, 2, 0, Schedule::k1F1B, 4, 2, 1, true},
  };
  std::map<std::pair<std::int64_t, std::int64_t>, TrainSummary> references;
  for (const Layout& l : layouts) {
    const auto key = std::make_pair(l.layers, l.dp * l.micro_batches);
    if (references.count(key) == 0) {
      TrainOptions o = base_options(l.layers);
      o.num_micro_batches = l.dp * l.micro_batches;
      references[key] = loom::executor::train_classifier(o, train, validation);
    }
    const TrainSummary& reference = references[key];
    REQUIRE(reference.losses.size() == 10);
    const auto started = std::chrono::steady_clock::now();
    const TrainSummary s = run_layout(l, train, validation);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    INFO(l.name << " (" << seconds << " s)");
    REQUIRE(s.losses.size() == reference.losses.size());
    double worst = 0.0;
    for (std::size_t i = 0; i < s.losses.size(); ++i) {
      const double error = std::abs(s.losses[i] - reference.losses[i]);
      worst = std::max(worst, error / std::abs(reference.losses[i]));
      INFO("step " << i + 1 << ": " << s.losses[i] << " vs " << reference.losses[i]);
      CHECK(error <= 1e-4 * std::abs(reference.losses[i]) + 1e-6);
    }
    REQUIRE(s.validation_loss);
    CHECK(std::abs(*s.validation_loss - *reference.validation_loss) <=
          1e-4 * std::abs(*reference.validation_loss) + 1e-6);
    CHECK(s.validation_accuracy == reference.validation_accuracy);
    WARN(l.name << ": worst relative loss difference " << worst << ", " << seconds << " s");
  }
}

TEST_CASE("Ranks staged through host memory train to the unstaged losses, bit for bit",
          "[distributed]") {
  // The path of ranks sharing one GPU over Gloo: every collective and point-to-point operation
  // runs on a host copy and copies its result back. On CPU tensors the copies are exact, so each
  // layout's losses equal its unstaged run's exactly.
  const auto train = loom::test::synthetic_examples(128, 3);
  const auto validation = loom::test::synthetic_examples(24, 4);
  const std::vector<Layout> layouts = {
      {"dp2", 2, 1, 1, 0, Schedule::k1F1B, 2, 2},
      {"dp2 zero1", 2, 1, 1, 1, Schedule::k1F1B, 2, 2},
      {"dp2 zero2", 2, 1, 1, 2, Schedule::k1F1B, 2, 2},
      {"dp2 zero3", 2, 1, 1, 3, Schedule::k1F1B, 2, 2},
      {"tp2", 1, 2, 1, 0, Schedule::k1F1B, 4, 2},
      {"tp2 sp", 1, 2, 1, 0, Schedule::k1F1B, 4, 2, 1, true},
      {"pp2 1f1b", 1, 1, 2, 0, Schedule::k1F1B, 4, 2},
      {"pp2 interleaved v2", 1, 1, 2, 0, Schedule::kInterleaved, 4, 4, 2},
  };
  for (const Layout& l : layouts) {
    INFO(l.name);
    const TrainSummary plain = run_layout(l, train, validation, 4);
    const TrainSummary staged = run_layout(l, train, validation, 4, /*host_staging=*/true);
    REQUIRE(plain.losses.size() == 4);
    CHECK(staged.losses == plain.losses);
    CHECK(staged.validation_loss == plain.validation_loss);
  }
}

TEST_CASE("ZeRO-3 evaluates a batch count that dp does not divide", "[distributed][zero]") {
  // 22 validation examples in batches of 2: 11 batches, so one dp replica has none in the last
  // round. Its forward gathers are dp collectives: it must still take part (running a batch whose
  // scores it drops), or the other replica waits until the timeout. The validation loss is the
  // single-process one.
  const auto train = loom::test::synthetic_examples(256, 3);
  const auto validation = loom::test::synthetic_examples(22, 4);
  TrainOptions o = base_options(2);
  o.steps = 2;
  o.num_micro_batches = 4;
  const TrainSummary reference = loom::executor::train_classifier(o, train, validation);
  REQUIRE(reference.validation_loss);
  for (const Layout& l : {Layout{"dp2 zero3", 2, 1, 1, 3, Schedule::k1F1B, 2, 2},
                          Layout{"dp2 x pp2 zero3", 2, 1, 2, 3, Schedule::k1F1B, 2, 2}}) {
    INFO(l.name);
    const TrainSummary s = run_layout(l, train, validation, 2);
    REQUIRE(s.validation_loss);
    CHECK(std::abs(*s.validation_loss - *reference.validation_loss) <=
          1e-4 * std::abs(*reference.validation_loss) + 1e-6);
    CHECK(s.validation_accuracy == reference.validation_accuracy);
  }
}

TEST_CASE("A layout that does not match the groups is refused", "[distributed]") {
  const auto train = loom::test::synthetic_examples(64, 3);
  const auto store = loom::executor::make_local_store();
  run_ranks(2, [&](int rank) {
    ParallelGroups groups(store, rank, 2, 1, 1, quick());
    // Both ranks have joined before either refuses and tears its groups down (a peer that leaves
    // while the other still connects fails that one's join instead).
    groups.world().barrier();
    TrainOptions o = base_options(2);
    o.tp = 2;  // the plan says tp=2, the groups are dp=2
    CHECK_THROWS_AS(loom::executor::train_classifier(o, train, {}, groups), InputError);
  });
  TrainOptions o = base_options(2);
  o.dp = 2;
  CHECK_THROWS_AS(loom::executor::train_classifier(o, train, {}), InputError);
}

TEST_CASE("A stop signal on some ranks stops every rank after the same step with one signal",
          "[distributed]") {
  // pp=2 x dp=2: rank 1 received SIGTERM and rank 2 SIGINT before the first step; ranks 0 and 3
  // none. Every rank stops after step 1 and reports SIGINT, the lowest-numbered signal received;
  // the evaluation due after that step is not started (this set is too small for it to vote and
  // abandon itself).
  const auto train = loom::test::synthetic_examples(64, 3);
  const auto validation = loom::test::synthetic_examples(24, 4);
  const auto store = loom::executor::make_local_store();
  const std::vector<int> received = {0, SIGTERM, SIGINT, 0};
  std::vector<TrainSummary> summaries(4);
  run_ranks(4, [&](int rank) {
    ParallelGroups groups(store, rank, 2, 1, 2, quick());
    std::atomic<int> signal{received[static_cast<std::size_t>(rank)]};
    TrainOptions o = base_options(2);
    o.dp = 2;
    o.pp = 2;
    o.num_micro_batches = 2;
    o.stop_signal = &signal;
    o.eval_every = 1;
    summaries[static_cast<std::size_t>(rank)] =
        loom::executor::train_classifier(o, train, validation, groups);
  });
  for (const TrainSummary& s : summaries) {
    CHECK(s.steps == 1);
    CHECK(s.stopped_by_signal == SIGINT);
    CHECK_FALSE(s.validation_loss);
  }
}

TEST_CASE("A launched profile keeps each figure of its slowest rank", "[distributed]") {
  const auto store = loom::executor::make_local_store();
  run_ranks(3, [&](int rank) {
    ParallelGroups groups(store, rank, 3, 1, 1, quick());
    // Rank r is slowest on figure r.
    std::vector<double> mine = {1.0, 2.0, 3.0};
    mine[static_cast<std::size_t>(rank)] = 10.0 + rank;
    const std::vector<double> out =
        loom::executor::slowest_rank(groups.world(), loom::executor::Device::kCpu, 0, mine);
    CHECK(out == std::vector<double>{10.0, 11.0, 12.0});
  });
}
