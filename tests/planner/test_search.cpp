#include <algorithm>
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "planner/search.hpp"
#include "profiles/loader.hpp"
#include "profiles/units.hpp"

using namespace loom;
using namespace loom::planner;

namespace {
costmodel::CostModel bert_on_dgx() {
  return costmodel::CostModel(profiles::load_model("bert-large"),
                              profiles::load_cluster("dgx-a100-80g"));
}
const costmodel::Job kJob{512, 512, profiles::Precision::kBf16, "adamw"};
// Options that pin the layout and the micro-batch.
SearchOptions pinned(int dp, int tp, int pp, int zero, std::int64_t micro_batch) {
  SearchOptions o;
  o.dp = dp;
  o.tp = tp;
  o.pp = pp;
  o.zero = zero;
  o.micro_batch = micro_batch;
  return o;
}
}  // namespace

TEST_CASE("a fully pinned search evaluates exactly that strategy", "[planner]") {
  costmodel::CostModel cost = bert_on_dgx();
  SearchOptions o;
  o.tp = 8;
  o.pp = 2;
  o.zero = 1;
  o.micro_batch = 4;
  o.schedule = costmodel::Schedule::kGpipe;
  o.recompute = costmodel::Recompute::kSelective;
  o.sequence_parallel = false;
  SearchResult r = search(cost, kJob, o);
  CHECK(r.searched == 1);
  REQUIRE(r.plans.size() == 1);
  const Plan& p = r.plans[0];
  CHECK(p.strategy.dp == 2);
  CHECK(p.strategy.num_micro_batches == 64);
  CHECK(p.stages.size() == 2);
  CHECK(p.stages[0] == costmodel::StageRange{0, 12});
  CHECK(p.stages[1] == costmodel::StageRange{13, 25});
  REQUIRE(p.ranks.size() == 32);
  // Megatron order: tp fastest, then dp, then pp.
  CHECK(p.ranks[9] == RankPlacement{9, "node1/gpu1", 1, 1, 0});
  CHECK(p.ranks[17] == RankPlacement{17, "node2/gpu1", 0, 1, 1});
  nlohmann::json j = plan_to_json(p);
  CHECK(j["format"] == "loom-plan/1");
  CHECK(j["strategy"]["schedule"] == "gpipe");
  CHECK(j["predicted"]["source"] == "simulation");
  o.simulate = false;
  CHECK(plan_to_json(search(cost, kJob, o).plans.at(0))["predicted"]["source"] == "analytical");
  CHECK(j["predicted"]["memory_bytes_by_stage"].size() == 2);
}

TEST_CASE("the search ranks feasible plans by step time, deterministically", "[planner]") {
  costmodel::CostModel cost = bert_on_dgx();
  SearchOptions o;
  o.top = 10;
  SearchResult a = search(cost, kJob, o);
  SearchResult b = search(cost, kJob, o);
  CHECK(a.searched > 1000);
  CHECK(a.feasible <= a.searched);
  REQUIRE(a.plans.size() == 10);
  for (std::size_t i = 0; i < a.plans.size(); ++i) {
    CHECK(a.plans[i].strategy == b.plans[i].strategy);
    if (i > 0) {
      CHECK(a.plans[i].predicted.step_time_s >= a.plans[i - 1].predicted.step_time_s);
    }
    CHECK(a.plans[i].predicted.peak_memory_bytes <= 0.9 * 80.0 * (1 << 30));
  }
  CHECK_FALSE(a.plans[0].why.empty());
}

TEST_CASE("the search respects pinned dimensions and the device limit", "[planner]") {
  costmodel::CostModel cost = bert_on_dgx();
  SearchOptions o;
  o.tp = 2;
  o.recompute = costmodel::Recompute::kFull;
  SearchResult r = search(cost, kJob, o);
  REQUIRE_FALSE(r.plans.empty());
  for (const Plan& p : r.plans) {
    CHECK(p.strategy.tp == 2);
    CHECK(p.strategy.recompute == costmodel::Recompute::kFull);
    CHECK(p.strategy.world_size() == 32);
  }
}

TEST_CASE("nothing fits: the reason names the smallest need and the device", "[planner]") {
  costmodel::CostModel cost(profiles::load_model("gpt3-175b"), profiles::load_cluster("h100-x1"));
  SearchResult r = search(cost, costmodel::Job{8, 2048, profiles::Precision::kBf16, "adamw"}, {});
  CHECK(r.plans.empty());
  CHECK(r.feasible == 0);
  CHECK(r.searched > 0);
  CHECK_THAT(r.infeasible_reason, Catch::Contains("does not fit") && Catch::Contains("80.0 GiB") &&
                                      Catch::Contains("zero=0"));
}

TEST_CASE("on one CPU node the search also tries fewer ranks with more threads each", "[planner]") {
  const costmodel::CostModel cost(profiles::load_model("tiny-bert"),
                                  profiles::load_cluster("local-cpu"));
  const costmodel::Job job{16, 64, profiles::Precision::kFp32, "adamw"};
  SearchOptions o;
  o.top = 1000;
  o.simulate = false;
  std::set<int> worlds;
  for (const Plan& p : search(cost, job, o).plans) worlds.insert(p.strategy.world_size());
  CHECK(worlds == std::set<int>{1, 2});
  o.fewer_cpu_ranks = false;
  worlds.clear();
  for (const Plan& p : search(cost, job, o).plans) worlds.insert(p.strategy.world_size());
  CHECK(worlds == std::set<int>{2});
  // GPU clusters always use every device.
  const costmodel::CostModel gpu(profiles::load_model("bert-large"),
                                 profiles::load_cluster("dgx-a100-80g"));
  o.fewer_cpu_ranks = true;
  const auto devices = static_cast<int>(gpu.cluster().device_count());
  for (const Plan& p : search(gpu, kJob, o).plans) CHECK(p.strategy.world_size() == devices);
}

TEST_CASE("a CPU's thread serial share decides between threads and ranks", "[planner]") {
  // tiny-bert at global batch 16, seq 64 on two cores: one rank of two threads (dp=1) or two
  // ranks of one (dp=2, which also all-reduces its gradients). With perfect thread scaling dp=1
  // is ahead; with the serial share loom profile --threads 1 2 measured on a 2-core machine (a
  // second thread speeds tiny-bert's layer 1.08x: 0.85) dp=2 is.
  profiles::Cluster cluster = profiles::load_cluster("local-cpu");
  REQUIRE_FALSE(cluster.device.thread_serial_fraction.has_value());
  const costmodel::Job job{16, 64, profiles::Precision::kFp32, "adamw"};
  auto best_step_s = [&](int dp) {
    const costmodel::CostModel cost(profiles::load_model("tiny-bert"), cluster);
    SearchOptions o;
    o.top = 1000;
    o.simulate = false;
    double best = 1e9;
    for (const Plan& p : search(cost, job, o).plans) {
      if (p.strategy.dp == dp && p.strategy.tp == 1 && p.strategy.pp == 1) {
        best = std::min(best, p.predicted.step_time_s);
      }
    }
    return best;
  };
  CHECK(best_step_s(1) < best_step_s(2));
  cluster.device.thread_serial_fraction = 0.85;
  CHECK(best_step_s(2) < best_step_s(1));
}

TEST_CASE("the search turns sequence parallelism on when only that fits", "[planner]") {
  // GPT-3 175B on 8 x 8 A100-80GB under Megatron-LM (bf16 activations throughout, as in the
  // paper) at tp = 8, pp = 8, micro-batch 1, selective recomputation, 1F1B: stage 0 keeps 8
  // micro-batches of its 12 layers. Per layer and micro-batch (Korthikanti et al. 2022, Table 2, s
  // = 2048, b = 1, h = 12288, t = 8): sbh (10 + 24/t) = 327,155,712 bytes without sequence
  // parallelism, 34 sbh / t = 106,954,752 bytes with it; x 96: 29.25 GiB against 9.56 GiB of
  // activations, beside about 43 GiB of model states and buffers. Under a 0.75 margin (60 GiB) only
  // the sequence-parallel plan fits.
  costmodel::CostModel cost(
      profiles::load_model("gpt3-175b"),
      profiles::with_nodes(profiles::load_cluster("dgx-a100-80g"), 8, "test"));
  costmodel::Job job{64, 2048, profiles::Precision::kBf16, "adamw"};
  job.runtime = costmodel::Runtime::kMegatron;
  SearchOptions o;
  o.tp = 8;
  o.pp = 8;
  o.zero = 0;
  o.micro_batch = 1;
  o.schedule = costmodel::Schedule::k1F1B;
  o.recompute = costmodel::Recompute::kSelective;
  o.memory_margin = 0.75;
  o.simulate = false;
  const SearchResult r = search(cost, job, o);
  CHECK(r.searched == 2);  // sequence parallelism off and on
  CHECK(r.feasible == 1);
  REQUIRE(r.plans.size() == 1);
  CHECK(r.plans[0].strategy.sequence_parallel);
  CHECK(r.plans[0].predicted.memory_by_stage.at(0).activation_bytes / (1 << 30) ==
        Approx(9.586).epsilon(1e-3));
  // Off, it does not fit: the search says by how much.
  o.sequence_parallel = false;
  const SearchResult off = search(cost, job, o);
  CHECK(off.plans.empty());
  CHECK_THAT(off.infeasible_reason, Catch::Contains("does not fit: the smallest memory need is ") &&
                                        Catch::Contains("recompute=selective attention=flash"));
}

TEST_CASE("CPU plans keep sequence parallelism off unless pinned", "[planner]") {
  costmodel::CostModel cost(profiles::load_model("tiny-bert"), profiles::load_cluster("local-cpu"));
  const costmodel::Job job{16, 64, profiles::Precision::kFp32, "adamw"};
  SearchOptions o = pinned(1, 2, 1, 0, 16);
  o.recompute = costmodel::Recompute::kNone;
  o.simulate = false;
  const SearchResult off = search(cost, job, o);
  CHECK(off.searched == 1);
  REQUIRE(off.plans.size() == 1);
  CHECK_FALSE(off.plans[0].strategy.sequence_parallel);
  CHECK(off.plans[0].strategy.attention == costmodel::Attention::kMath);
  o.sequence_parallel = true;
  const SearchResult on = search(cost, job, o);
  REQUIRE(on.plans.size() == 1);
  CHECK(on.plans[0].strategy.sequence_parallel);
}

TEST_CASE("an LM head whose vocabulary is not padded gets the padded plan's time",
          "[planner][alignment]") {
  // GPT-2's 50 257 rows are not whole 16-byte vectors in bf16: the LM head's products run slower.
  // The same plan with 50 304 rows (128 x 393, Megatron-LM's padding at tp 1) is faster, and the
  // plan says by how much, from the two analytical estimates.
  const profiles::ModelSpec gpt2 = profiles::load_model("gpt2");
  const costmodel::CostModel cost(gpt2, profiles::load_cluster("dgx-a100-80g"));
  const costmodel::Job job{64, 1024, profiles::Precision::kBf16, "adamw"};
  SearchOptions o = pinned(8, 1, 1, 0, 8);
  auto note_of = [](const Plan& p) {
    for (const std::string& w : p.why) {
      if (w.rfind("vocabulary ", 0) == 0) return w;
    }
    return std::string();
  };
  const Plan plan = search(cost, job, o).plans.at(0);
  const std::string note = note_of(plan);
  CHECK_THAT(note, Catch::Matchers::StartsWith("vocabulary 50257 padded to 50304 "));
  profiles::ModelSpec padded = gpt2;
  padded.vocab = 50304;
  const double now = cost.estimate(job, plan.strategy, plan.stages).step_time_s;
  const double then = cost.with_model(padded).estimate(job, plan.strategy, plan.stages).step_time_s;
  CHECK(then < 0.95 * now);
  char change[32];
  std::snprintf(change, sizeof change, "(%+.1f %%)", 100.0 * (then / now - 1));
  CHECK_THAT(note, Catch::Matchers::Contains(change));
  // Padded already: no note. Under tp 2 the multiple is 256: 50 432.
  CHECK(note_of(search(costmodel::CostModel(padded, profiles::load_cluster("dgx-a100-80g")), job, o)
                    .plans.at(0))
            .empty());
  o.dp = 4;
  o.tp = 2;
  CHECK_THAT(note_of(search(cost, job, o).plans.at(0)),
             Catch::Matchers::StartsWith("vocabulary 50257 padded to 50432 "));
  // A classifier only looks its vocabulary up: padding changes no product, so no note.
  const costmodel::CostModel bert(profiles::load_model("bert-base"),
                                  profiles::load_cluster("dgx-a100-80g"));
  o.dp = 8;
  o.tp = 1;
  const costmodel::Job fine_tune{64, 512, profiles::Precision::kBf16, "adamw"};
  CHECK(note_of(search(bert, fine_tune, o).plans.at(0)).empty());
}

TEST_CASE("where only full recomputation fits, the search recomputes the fewest layers",
          "[planner]") {
  // BERT-large at 192 sequences of 512 per A100 80GB, flash attention (so selective
  // recomputation keeps as much as none): recomputing every layer fits, none does not.
  const costmodel::CostModel cost = bert_on_dgx();
  const costmodel::Job job{1536, 512, profiles::Precision::kBf16, "adamw"};
  SearchOptions o = pinned(8, 1, 1, 0, 192);
  o.attention = costmodel::Attention::kFlash;
  o.top = 1;
  const SearchResult r = search(cost, job, o);
  REQUIRE(r.plans.size() == 1);
  const costmodel::Strategy& s = r.plans[0].strategy;
  CHECK(s.recompute == costmodel::Recompute::kFull);
  REQUIRE(s.recompute_layers > 1);  // 9 of 24 with the shipped cluster
  REQUIRE(s.recompute_layers < 24);
  CHECK(r.plans[0].why.back() == "full recomputation of the first " +
                                     std::to_string(s.recompute_layers) +
                                     " of each chunk's 24 layers: the fewest that fit");
  // N of the 24 layers fit under 0.9 of the 80 GiB, N - 1 do not, and all 24 are slower.
  const double limit = 0.9 * static_cast<double>(cost.cluster().device.memory_bytes);
  const auto stages = costmodel::even_partition(cost.model(), 1);
  costmodel::Strategy x = s;
  CHECK(cost.estimate(job, x, stages).peak_memory_bytes <= limit);
  x.recompute_layers = s.recompute_layers - 1;
  CHECK(cost.estimate(job, x, stages).peak_memory_bytes > limit);
  x.recompute_layers = 0;
  CHECK(cost.estimate(job, x, stages).step_time_s > cost.estimate(job, s, stages).step_time_s);
  // Pinned to full, every layer recomputes, and the reasons point to the lighter plan.
  o.recompute = costmodel::Recompute::kFull;
  const SearchResult all = search(cost, job, o);
  CHECK(all.plans.at(0).strategy.recompute_layers == 0);
  const std::string hint =
      "--recompute-layers " + std::to_string(s.recompute_layers) + " would also fit (";
  CHECK(std::any_of(all.plans[0].why.begin(), all.plans[0].why.end(),
                    [&](const std::string& w) { return w.rfind(hint, 0) == 0; }));
  // Where no recomputation fits as well, that is the hint.
  const costmodel::Job small{512, 512, profiles::Precision::kBf16, "adamw"};
  o.micro_batch = 64;
  const SearchResult fits = search(cost, small, o);
  CHECK(std::any_of(fits.plans[0].why.begin(), fits.plans[0].why.end(), [](const std::string& w) {
    return w.rfind("--recompute none would also fit (", 0) == 0;
  }));
}

namespace {
// Whether `b` is `a` with only `dimension` changed (the derived dp and micro-batch count follow):
// the test's own reading of "one dimension apart", independent of the planner's.
bool only_differs_in(const std::string& dimension, const costmodel::Strategy& a,
                     const costmodel::Strategy& b) {
  auto same = [&](const std::string& name, bool equal) { return name == dimension || equal; };
  const bool pipelined = a.pp > 1 && b.pp > 1;
  const bool sharded = a.tp > 1 && b.tp > 1;
  // dp on its own changes the world size; any other change keeps it, dp following.
  const bool devices = dimension == "dp" ? a.dp != b.dp : a.world_size() == b.world_size();
  return devices && same("tp", a.tp == b.tp) && same("pp", a.pp == b.pp) &&
         same("zero", a.zero == b.zero) && same("micro-batch", a.micro_batch == b.micro_batch) &&
         same("schedule", !pipelined || a.schedule == b.schedule) &&
         same("recompute", a.recompute == b.recompute) &&
         same("sequence-parallel", !sharded || a.sequence_parallel == b.sequence_parallel) &&
         (!pipelined || a.virtual_stages == b.virtual_stages) &&
         a.recompute_layers == b.recompute_layers && a.attention == b.attention;
}
}  // namespace

TEST_CASE("each why line changes one dimension and quotes a plan the search found",
          "[planner][why]") {
  struct Case {
    const char* model;
    const char* cluster;
    costmodel::Job job;
    int gpus;
  };
  const std::vector<Case> cases = {
      {"bert-base", "dgx-a100-80g", {32, 512, profiles::Precision::kFp16, "adamw"}, 2},
      {"bert-large", "dgx-a100-80g", {512, 512, profiles::Precision::kBf16, "adamw"}, 8},
      {"gpt2", "dgx-a100-80g", {64, 1024, profiles::Precision::kBf16, "adamw"}, 4},
      // On a CPU node the world size is searched too (fewer ranks, more threads each).
      {"tiny-bert", "local-cpu", {16, 64, profiles::Precision::kFp32, "adamw"}, 0},
  };
  const std::regex line(
      R"(^([a-z-]+)=(\S+) chosen over ([a-z-]+)=(\S+): (\S+ \S+) vs (\S+ \S+) per step)");
  for (const Case& c : cases) {
    INFO(c.model << " on " << c.gpus << " GPUs");
    const profiles::Cluster cluster =
        c.gpus > 0 ? profiles::with_devices(profiles::load_cluster(c.cluster), c.gpus, "--gpus")
                   : profiles::load_cluster(c.cluster);
    const costmodel::CostModel cost(profiles::load_model(c.model), cluster);
    SearchOptions o;
    o.simulate = false;
    o.top = 100000;
    const SearchResult r = search(cost, c.job, o);
    REQUIRE(r.plans.size() > 1);
    const Plan& best = r.plans.front();
    const profiles::Unit unit = profiles::time_unit(best.predicted.step_time_s);
    int checked = 0;
    for (const std::string& why : best.why) {
      std::smatch m;
      if (!std::regex_search(why, m, line)) continue;
      INFO(why);
      const std::string dimension = m[1];
      CHECK(m[3] == dimension);
      CHECK(m[5] == profiles::unit_text(best.predicted.step_time_s, unit, 3));
      const Plan* other = nullptr;
      for (const Plan& p : r.plans) {
        if (&p != &best && only_differs_in(dimension, best.strategy, p.strategy) &&
            profiles::unit_text(p.predicted.step_time_s, unit, 3) == m[6].str()) {
          other = &p;
        }
      }
      CHECK(other != nullptr);
      ++checked;
    }
    CHECK(checked > 0);
  }
}
