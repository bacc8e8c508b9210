#include "planner/coverage.hpp"

#include <algorithm>

#include "costmodel/comm.hpp"
#include "costmodel/lowering.hpp"
#include "costmodel/runtime.hpp"
#include "costmodel/zero.hpp"

namespace loom::planner {

namespace {

using costmodel::Collective;
using costmodel::LinkQuery;

// intra_node when every group of `size` ranks at `stride` lies on one node, else inter_node.
std::string group_scope(const Plan& plan, const std::vector<int>& devices, int size, int stride) {
  const int world = plan.strategy.world_size();
  const auto per_node = std::max<std::int64_t>(1, plan.cluster.devices_per_node);
  for (const std::vector<int>& group : costmodel::rank_groups(world, size, stride)) {
    for (int r : group) {
      if (devices[static_cast<std::size_t>(r)] / per_node !=
          devices[static_cast<std::size_t>(group.front())] / per_node) {
        return "inter_node";
      }
    }
  }
  return "intra_node";
}

// Adds `q` to `links`, joining its group to an equal message's.
void add_link(std::vector<LinkQuery>& links, LinkQuery q) {
  if (q.bytes <= 0 || q.ranks < 2) return;
  for (LinkQuery& l : links) {
    if (l.collective == q.collective && l.ranks == q.ranks && l.bytes == q.bytes &&
        l.scope == q.scope) {
      if (("+" + l.group + "+").find("+" + q.group + "+") == std::string::npos) {
        l.group += "+" + q.group;
      }
      return;
    }
  }
  links.push_back(std::move(q));
}

// WIRE: the collectives the merged cost model charges (runtime_loom.cpp, estimate.cpp).
// The step's collectives, as the cost model charges them: the dp group's gradient buckets (and
// the whole gradient), ZeRO's gathers of the updated parameters, the tp group's collectives of
// every entry kind, the pipeline's transfers, and the scalar all-reduces after the optimizer.
std::vector<LinkQuery> link_points(const Plan& plan, const costmodel::StepTerms& terms) {
  const costmodel::Strategy& s = plan.strategy;
  const int world = s.world_size();
  std::vector<LinkQuery> links;
  if (world < 2) return links;
  const std::vector<int> devices = device_of_rank(plan);
  const std::string dp_scope = group_scope(plan, devices, s.dp, s.tp);
  const std::string tp_scope = group_scope(plan, devices, s.tp, 1);
  const std::string pp_scope = group_scope(plan, devices, s.pp, s.tp * s.dp);
  const std::string world_scope = group_scope(plan, devices, world, 1);
  if (s.dp > 1) {
    double parameters = 0;
    const auto loads =
        costmodel::stage_loads(costmodel::lower_chunks(plan.model, s, terms, plan.stages), s.pp);
    for (const costmodel::StageLoad& l : loads) parameters = std::max(parameters, l.num_parameters);
    const double grads =
        parameters *
        costmodel::runtime_rules(plan.job.runtime).reduce_bytes_per_parameter(plan.job);
    const double bucket = std::min(plan.cost_options.dp_bucket_bytes, grads);
    add_link(links, {"dp", Collective::kAllReduce, s.dp, bucket, dp_scope});
    add_link(links, {"dp", Collective::kAllReduce, s.dp, grads, dp_scope});
    const costmodel::ZeroPolicy zero = costmodel::zero_policy(s.zero);
    if (zero.gathers_after_step || zero.gathers_before_forward) {
      add_link(links, {"dp", Collective::kAllGather, s.dp, grads, dp_scope});
    }
  }
  if (s.tp > 1) {
    for (const costmodel::EntryTerms* e : {&terms.embedding, &terms.layer, &terms.head}) {
      for (const auto* pass : {&e->forward_tp, &e->backward_tp}) {
        for (const costmodel::TensorParallelCollective& c : *pass) {
          add_link(links, {"tp", c.collective, s.tp, c.bytes, tp_scope});
        }
      }
    }
  }
  if (s.pp > 1) {
    add_link(links, {"pp", Collective::kP2p, 2, terms.p2p_bytes, pp_scope});
    add_link(links, {"tp", Collective::kAllGather, s.tp, terms.p2p_all_gather_bytes, tp_scope});
  }
  // loom train's scalars: the gradient norm over dp (with a sharded gradient), tp and pp, then
  // the loss and stop vote over the world.
  if (costmodel::zero_policy(s.zero).reduces_norm_over_dp) {
    add_link(links, {"dp", Collective::kAllReduce, s.dp, 8, dp_scope});
  }
  add_link(links, {"tp", Collective::kAllReduce, s.tp, 8, tp_scope});
  add_link(links, {"pp", Collective::kAllReduce, s.pp, 8, pp_scope});
  add_link(links,
           {"world", Collective::kAllReduce, world, costmodel::kStepStatsBytes, world_scope});
  return links;
}

// Scalars (the gradient norm, the step's statistics) rather than activations or gradients.
bool scalar(const LinkQuery& q) { return q.bytes <= costmodel::kStepStatsBytes; }

}  // namespace

PlanPoints plan_points(const Plan& plan) {
  const costmodel::Strategy& s = plan.strategy;
  PlanPoints out;
  const int world = s.world_size();
  out.threads = costmodel::threads_per_rank(plan.cluster, world);
  out.flat = world > 1;
  // The points the cost model's compute terms ask for (costmodel/terms.hpp).
  costmodel::StepTerms terms = cost_model_of(plan).step_terms(plan.job, s);
  for (costmodel::ProfileQuery& p : terms.profile_queries) {
    out.layers.emplace_back(std::move(p.what), std::move(p.query));
  }
  out.links = link_points(plan, terms);
  return out;
}

std::vector<costmodel::Extrapolation> extrapolated_points(const Plan& plan) {
  std::vector<costmodel::Extrapolation> out;
  if (!plan.profile) return out;
  const costmodel::MeasuredProfile measured(*plan.profile, plan.model);
  const PlanPoints points = plan_points(plan);
  bool tp_measured = false;
  for (const auto& [what, query] : points.layers) {
    if (auto e = measured.describe_layer(query, what)) out.push_back(*e);
    const costmodel::LayerAnswer a = measured.layer(query);
    if (query.kind != profiles::LayerKind::kEmbedding && query.kind != profiles::LayerKind::kHead) {
      tp_measured = a.tp_communication && (a.how == costmodel::Provenance::kMeasured ||
                                           a.how == costmodel::Provenance::kInterpolated);
    }
  }
  if (auto e = measured.describe_optimizer(points.threads, points.flat)) out.push_back(*e);
  for (const LinkQuery& q : points.links) {
    if (tp_measured && q.group == "tp" && !scalar(q)) continue;
    if (auto e = measured.describe_link(q)) out.push_back(*e);
  }
  return out;
}

}  // namespace loom::planner
