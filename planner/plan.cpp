#include "planner/plan.hpp"

#include <cmath>
#include <nlohmann/json.hpp>
#include <numeric>

#include "profiles/errors.hpp"
#include "profiles/json_reader.hpp"
#include "profiles/profile.hpp"

#ifndef LOOM_VERSION
#define LOOM_VERSION "0.0.0"
#endif

namespace loom::planner {

const char* loom_version() { return LOOM_VERSION; }

std::vector<RankPlacement> megatron_placement(const costmodel::Strategy& s,
                                              const profiles::Cluster& cluster) {
  std::vector<int> identity(static_cast<std::size_t>(s.world_size()));
  std::iota(identity.begin(), identity.end(), 0);
  return placement(s, cluster, identity);
}

std::vector<RankPlacement> placement(const costmodel::Strategy& s, const profiles::Cluster& cluster,
                                     const std::vector<int>& device_of_rank) {
  std::vector<RankPlacement> out;
  for (int rank = 0; rank < s.world_size(); ++rank) {
    RankPlacement p;
    p.rank = rank;
    p.device = profiles::device_name(cluster, device_of_rank.at(static_cast<std::size_t>(rank)));
    // tp fastest, then cp, then dp, then pp (strategy.hpp, gradient_view).
    p.tp = rank % s.tp;
    p.cp = (rank / s.tp) % s.cp;
    p.dp = (rank / (s.tp * s.cp)) % s.dp;
    p.pp = rank / (s.tp * s.cp * s.dp);
    out.push_back(p);
  }
  return out;
}

nlohmann::json extrapolated_to_json(const Plan& plan) {
  nlohmann::json out = nlohmann::json::array();
  for (const costmodel::Extrapolation& e : plan.extrapolated) {
    out.push_back({{"what", e.what}, {"wanted", e.wanted}, {"how", e.how}, {"from", e.from}});
  }
  return out;
}

nlohmann::json plan_to_json(const Plan& plan) {
  nlohmann::json j;
  j["format"] = "loom-plan/1";
  j["loom_version"] = plan.loom_version;
  j["model"] = profiles::model_to_json(plan.model);
  j["cluster"] = profiles::cluster_to_json(plan.cluster);
  j["job"] = costmodel::job_to_json(plan.job);
  j["strategy"] = costmodel::strategy_to_json(plan.strategy);
  nlohmann::json stages = nlohmann::json::array();
  for (std::size_t i = 0; i < plan.stages.size(); ++i) {
    stages.push_back({{"stage", i},
                      {"first_layer", plan.stages[i].first_layer},
                      {"last_layer", plan.stages[i].last_layer}});
  }
  j["stages"] = stages;
  nlohmann::json ranks = nlohmann::json::array();
  for (const RankPlacement& r : plan.ranks) {
    nlohmann::json rank = {
        {"rank", r.rank}, {"device", r.device}, {"dp", r.dp}, {"tp", r.tp}, {"pp", r.pp}};
    if (plan.strategy.cp > 1) rank["cp"] = r.cp;
    ranks.push_back(rank);
  }
  j["ranks"] = ranks;
  j["predicted"] = costmodel::prediction_to_json(plan.predicted);
  j["why"] = plan.why;
  j["cost_model"] = costmodel::cost_options_to_json(plan.cost_options);
  if (!plan.calibration.empty()) j["calibration"] = plan.calibration;
  if (plan.profile) {
    j["profile"] = profiles::profile_to_json(*plan.profile);
    j["extrapolated"] = extrapolated_to_json(plan);
  }
  return j;
}

Plan evaluate_strategy(const costmodel::CostModel& cost, const costmodel::Job& job,
                       const costmodel::Strategy& strategy,
                       std::vector<costmodel::StageRange> stages) {
  if (auto why =
          costmodel::check_strategy(cost.model(), cost.cluster().device_count(), job, strategy)) {
    throw InputError("strategy", "", *why);
  }
  if (stages.empty()) {
    stages = costmodel::even_partition(cost.model(), strategy.pp * strategy.virtual_stages);
  }
  if (auto why = costmodel::check_partition(cost.model(), strategy, stages)) {
    throw InputError("stages", "", *why);
  }
  Plan plan;
  plan.loom_version = loom_version();
  plan.model = cost.model();
  plan.cluster = cost.cluster();
  plan.job = job;
  plan.strategy = strategy;
  plan.stages = std::move(stages);
  plan.ranks = placement(strategy, cost.cluster(), cost.device_of_rank());
  plan.predicted = cost.estimate(job, strategy, plan.stages);
  plan.cost_options = cost.options();
  if (cost.measured_profile() != nullptr) {
    plan.profile = std::make_shared<const profiles::Profile>(cost.measured_profile()->profile());
  }
  return plan;
}

namespace {

// Rethrows an error from a nested reader with the nested object's path in front.
template <typename F>
auto nested(const std::string& source, const std::string& path, F&& read) {
  try {
    return read();
  } catch (const InputError& e) {
    std::string inner = e.path();
    if (inner.rfind('$', 0) == 0) inner = inner.substr(1);
    throw InputError(source, path + inner, e.expectation());
  }
}

// Versions compare numerically part by part ("0.10.0" > "0.9.1").
bool newer_version(const std::string& a, const std::string& b) {
  auto parts = [](const std::string& v) {
    std::vector<long> out;
    std::size_t pos = 0;
    while (pos < v.size()) {
      std::size_t end = v.find('.', pos);
      if (end == std::string::npos) end = v.size();
      out.push_back(std::strtol(v.substr(pos, end - pos).c_str(), nullptr, 10));
      pos = end + 1;
    }
    return out;
  };
  return parts(a) > parts(b);
}

costmodel::Prediction prediction_from_json(profiles::ObjectReader r) {
  costmodel::Prediction p;
  p.step_time_s = r.number("step_time_s", 0, true);
  p.samples_per_s = r.number("samples_per_s", 0, false);
  p.tokens_per_s = r.number("tokens_per_s", 0, false);
  p.model_tflops_per_gpu = r.number("model_tflops_per_gpu", 0, false);
  p.hardware_tflops_per_gpu = r.number("hardware_tflops_per_gpu", 0, false);
  p.mfu = r.number("mfu", 0, false);
  p.peak_memory_bytes = r.number("peak_memory_bytes", 0, false);
  const nlohmann::json& stages = r.array("memory_bytes_by_stage");
  for (std::size_t i = 0; i < stages.size(); ++i) {
    profiles::ObjectReader m(stages[i], r.source(), r.element_path("memory_bytes_by_stage", i));
    costmodel::MemoryBreakdown b;
    b.parameter_bytes = m.number("parameters", 0, false);
    b.gradient_bytes = m.number("gradients", 0, false);
    b.optimizer_bytes = m.number("optimizer", 0, false);
    b.activation_bytes = m.number("activations", 0, false);
    b.buffer_bytes = m.number("buffers", 0, false);
    b.cuda_context_bytes = m.number("cuda_context", 0, false);
    b.workspace_bytes = m.number("workspaces", 0, false);
    b.nccl_buffer_bytes = m.number("nccl_buffers", 0, false);
    b.fragmentation_bytes = m.number("fragmentation", 0, false);
    // The sum of the others (as written), within rounding.
    const double total = m.number("total", 0, false);
    if (std::abs(total - b.total()) > 1e-9 * b.total() + 8) {
      m.fail("total",
             "the sum of parameters, gradients, optimizer, activations, buffers and the "
             "process lines (" +
                 std::to_string(b.total()) + ")");
    }
    m.finish();
    p.memory_by_stage.push_back(b);
  }
  p.bubble_fraction = r.number("bubble_fraction", 0, false);
  profiles::ObjectReader e = r.object("exposed_communication_s");
  p.exposed_communication_s.dp = e.number("dp", 0, false);
  p.exposed_communication_s.tp = e.number("tp", 0, false);
  p.exposed_communication_s.pp = e.number("pp", 0, false);
  p.exposed_communication_s.zero = e.number("zero", 0, false);
  e.finish();
  p.optimizer_s = r.optional_number("optimizer_s", 0, false).value_or(0);
  p.source = r.choice("source", {"analytical", "simulation"});
  r.finish();
  return p;
}

costmodel::CostOptions cost_options_from_json(profiles::ObjectReader r) {
  costmodel::CostOptions o;
  o.efficiency.gpu_matrix = r.number("gpu_matrix_efficiency", 0, true);
  o.efficiency.gpu_memory = r.number("gpu_memory_efficiency", 0, true);
  o.efficiency.cpu_matrix = r.number("cpu_matrix_efficiency", 0, true);
  o.efficiency.cpu_memory = r.number("cpu_memory_efficiency", 0, true);
  o.efficiency.gpu_kernel_launch_s = r.number("gpu_kernel_launch_s", 0, false);
  o.dp_bucket_bytes = r.number("dp_bucket_bytes", 0, true);
  o.attention_scores = r.boolean("attention_scores");
  r.finish();
  return o;
}

}  // namespace

Plan plan_from_json(const nlohmann::json& value, const std::string& source) {
  profiles::ObjectReader r(value, source);
  r.expect_format("loom-plan");
  constexpr std::int64_t kIntMax = profiles::ObjectReader::kIntMax;  // layers and ranks are ints
  Plan plan;
  plan.loom_version = r.string("loom_version");
  if (newer_version(plan.loom_version, loom_version())) {
    r.fail("loom_version", std::string("a plan from loom ") + loom_version() +
                               " or older (this plan was written by loom " + plan.loom_version +
                               "; upgrade loom)");
  }
  r.object("model");  // presence and type
  plan.model = nested(source, "$.model",
                      [&] { return profiles::model_from_json(value.at("model"), source); });
  r.object("cluster");
  plan.cluster = nested(source, "$.cluster",
                        [&] { return profiles::cluster_from_json(value.at("cluster"), source); });
  r.object("job");
  plan.job = costmodel::job_from_json(value.at("job"), source, "$.job");
  r.object("strategy");
  plan.strategy = costmodel::strategy_from_json(value.at("strategy"), source, "$.strategy");
  const costmodel::Strategy& s = plan.strategy;
  if (auto why = costmodel::check_strategy(plan.model, plan.cluster.device_count(), plan.job, s)) {
    r.fail("strategy", "a strategy that can run this job on this cluster: " + *why);
  }

  const nlohmann::json& stages = r.array("stages");
  for (std::size_t i = 0; i < stages.size(); ++i) {
    profiles::ObjectReader st(stages[i], source, r.element_path("stages", i));
    if (st.integer("stage", 0) != static_cast<std::int64_t>(i)) {
      st.fail("stage", "stages listed in order, this one numbered " + std::to_string(i));
    }
    costmodel::StageRange range;
    range.first_layer = static_cast<int>(st.integer("first_layer", 0, kIntMax));
    range.last_layer = static_cast<int>(st.integer("last_layer", 0, kIntMax));
    st.finish();
    plan.stages.push_back(range);
  }
  if (auto why = costmodel::check_partition(plan.model, s, plan.stages)) {
    r.fail("stages", "a partition of the layer sequence: " + *why);
  }

  const nlohmann::json& ranks = r.array("ranks");
  if (static_cast<std::int64_t>(ranks.size()) != s.world_size()) {
    r.fail("ranks", std::string(s.cp > 1 ? "one entry per rank: dp*tp*pp*cp = "
                                         : "one entry per rank: dp*tp*pp = ") +
                        std::to_string(s.world_size()) + ", found " + std::to_string(ranks.size()));
  }
  const profiles::Topology topology(plan.cluster);
  std::vector<bool> used(static_cast<std::size_t>(plan.cluster.device_count()), false);
  const std::vector<RankPlacement> expected = megatron_placement(s, plan.cluster);
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    profiles::ObjectReader rr(ranks[i], source, r.element_path("ranks", i));
    RankPlacement p;
    p.rank = static_cast<int>(rr.integer("rank", 0, kIntMax));
    p.device = rr.string("device");
    p.dp = static_cast<int>(rr.integer("dp", 0, kIntMax));
    p.tp = static_cast<int>(rr.integer("tp", 0, kIntMax));
    p.pp = static_cast<int>(rr.integer("pp", 0, kIntMax));
    p.cp = static_cast<int>(rr.optional_integer("cp", 0, kIntMax).value_or(0));
    rr.finish();
    const RankPlacement& want = expected[i];
    if (p.rank != want.rank || p.dp != want.dp || p.tp != want.tp || p.pp != want.pp ||
        p.cp != want.cp) {
      rr.fail("rank", std::string("ranks in order with Megatron coordinates (tp fastest, then ") +
                          (s.cp > 1 ? "cp, then " : "") + "dp, then pp): rank " +
                          std::to_string(want.rank) + " is dp " + std::to_string(want.dp) + " tp " +
                          std::to_string(want.tp) + " pp " + std::to_string(want.pp) +
                          (s.cp > 1 ? " cp " + std::to_string(want.cp) : std::string()));
    }
    std::optional<int> device = topology.find_device(p.device);
    if (!device) rr.fail("device", "a device of the plan's cluster, such as \"node0/gpu0\"");
    if (used[static_cast<std::size_t>(*device)]) {
      rr.fail("device", "each device used by one rank only; " + p.device + " appears twice");
    }
    used[static_cast<std::size_t>(*device)] = true;
    plan.ranks.push_back(p);
  }
  if (r.has("predicted")) plan.predicted = prediction_from_json(r.object("predicted"));
  if (r.has("why")) {
    const nlohmann::json& why = r.array("why");
    for (std::size_t i = 0; i < why.size(); ++i) {
      if (!why[i].is_string()) {
        throw InputError(source, r.element_path("why", i), "a string");
      }
      plan.why.push_back(why[i].get<std::string>());
    }
  }
  if (r.has("tuned")) r.object("tuned");  // loom tune's record (lab/tune.hpp); not run
  if (r.has("cost_model")) plan.cost_options = cost_options_from_json(r.object("cost_model"));
  plan.calibration = r.optional_string("calibration").value_or("");
  if (r.has("profile")) {
    r.object("profile");
    plan.profile = nested(source, "$.profile", [&] {
      return std::make_shared<const profiles::Profile>(
          profiles::profile_from_json(value.at("profile"), source));
    });
  }
  if (r.has("extrapolated")) {
    const nlohmann::json& list = r.array("extrapolated");
    for (std::size_t i = 0; i < list.size(); ++i) {
      profiles::ObjectReader e(list[i], source, r.element_path("extrapolated", i));
      plan.extrapolated.push_back(
          {e.string("what"), e.string("wanted"), e.string("how"), e.string("from")});
      e.finish();
    }
  }
  r.finish();
  return plan;
}

std::vector<int> device_of_rank(const Plan& plan) {
  const profiles::Topology topology(plan.cluster);
  std::vector<int> out;
  for (const RankPlacement& p : plan.ranks) out.push_back(topology.find_device(p.device).value());
  return out;
}

costmodel::CostModel cost_model_of(const Plan& plan) {
  costmodel::CostModel cost(plan.model, plan.cluster, plan.cost_options, device_of_rank(plan));
  if (plan.profile) {
    cost = cost.with_profile(
        std::make_shared<const costmodel::MeasuredProfile>(*plan.profile, plan.model));
  }
  return cost;
}

profiles::Profile read_profiles(const std::vector<std::string>& paths,
                                const profiles::ModelSpec& model, profiles::Precision precision) {
  std::vector<profiles::Profile> all;
  for (const std::string& path : paths) {
    all.push_back(profiles::load_profile(path));
    profiles::check_profile_for(all.back(), model, precision, path);
  }
  return profiles::merge_profiles(all, paths);
}

void apply_profiles(Plan* plan, const std::vector<std::string>& paths) {
  auto profile = std::make_shared<const profiles::Profile>(
      read_profiles(paths, plan->model, plan->job.precision));
  plan->cluster = costmodel::cluster_with_profile_links(
      plan->cluster, costmodel::fit_links(profile->links), nullptr);
  plan->profile = std::move(profile);
}

costmodel::CostModel calibrated_cost_model(const profiles::ModelSpec& model,
                                           const profiles::Cluster& cluster,
                                           const std::shared_ptr<const profiles::Profile>& profile,
                                           std::vector<std::string>* notes) {
  if (!profile) return costmodel::CostModel(model, cluster);
  const profiles::Cluster calibrated =
      costmodel::cluster_with_profile_links(cluster, costmodel::fit_links(profile->links), notes);
  const costmodel::CostModel base(model, calibrated);
  return base.with_profile(std::make_shared<const costmodel::MeasuredProfile>(*profile, model));
}

}  // namespace loom::planner
