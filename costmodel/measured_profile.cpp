#include "costmodel/measured_profile.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <tuple>

#include "profiles/units.hpp"

namespace loom::costmodel {

using profiles::LayerKind;
using profiles::LayerMeasurement;

const char* to_string(Provenance how) {
  switch (how) {
    case Provenance::kMeasured:
      return "measured";
    case Provenance::kInterpolated:
      return "interpolated";
    case Provenance::kScaled:
      return "scaled";
    case Provenance::kRoofline:
      return "roofline";
  }
  return "roofline";
}

namespace {

bool is_layer(LayerKind k) {
  return k == LayerKind::kEncoderLayer || k == LayerKind::kDecoderLayer;
}

bool same_kind(LayerKind a, LayerKind b) { return a == b || (is_layer(a) && is_layer(b)); }

// Embeddings and heads have no attention core: any point serves any query's.
bool same_attention(const LayerMeasurement& p, const LayerQuery& q) {
  return !is_layer(p.kind) || p.attention == q.attention;
}

LayerQuery shape_of(const LayerMeasurement& p) {
  return {p.kind,
          p.micro_batch,
          p.seq_len,
          p.tp,
          p.recompute,
          p.threads,
          is_layer(p.kind) ? p.attention : "math"};
}

Collective collective_of(const std::string& name) {
  if (name == "allreduce") return Collective::kAllReduce;
  if (name == "reduce_scatter") return Collective::kReduceScatter;
  if (name == "all_gather") return Collective::kAllGather;
  return Collective::kP2p;
}

// Value at x on the line through (x0, y0) and (x1, y1).
double line(double x, double x0, double y0, double x1, double y1) {
  if (x1 == x0) return y0;
  return y0 + (y1 - y0) * (x - x0) / (x1 - x0);
}

}  // namespace

MeasuredProfile::MeasuredProfile(const profiles::Profile& profile, const profiles::ModelSpec& model)
    : gpu_(profile.device_kind == profiles::DeviceKind::kGpu), profile_(profile) {
  for (const LayerMeasurement& p : profile.layers) {
    if (p.hidden != model.hidden || p.heads != model.heads || p.ffn_hidden != model.ffn_hidden) {
      continue;
    }
    if (!is_layer(p.kind) && p.vocab && *p.vocab != model.vocab) continue;
    points_.push_back(p);
    points_.back().threads = threads_key(p.threads);
  }
  const std::vector<LinkFit> fits = fit_links(profile.links);
  // Messages measured between computing ranks (p2p_loaded) describe a pipeline better than the
  // idle ping-pong, so they set p2p's factor when the profile has them.
  const bool loaded = std::any_of(profile.links.begin(), profile.links.end(),
                                  [](const auto& l) { return l.collective == "p2p_loaded"; });
  for (Collective c : {Collective::kAllReduce, Collective::kReduceScatter, Collective::kAllGather,
                       Collective::kP2p}) {
    std::vector<double> ratios;
    for (const profiles::LinkMeasurement& l : profile.links) {
      if (collective_of(l.collective) != c || l.bytes < 65536) continue;
      if (c == Collective::kP2p && loaded != (l.collective == "p2p_loaded")) continue;
      for (const LinkFit& f : fits) {
        if (f.scope != l.scope) continue;
        const double modelled =
            collective_time_s(c, l.bytes, l.ranks,
                              profiles::PathMetrics{f.bandwidth_gbps, f.latency_us, std::nullopt});
        if (modelled > 0) ratios.push_back(l.time_s / modelled);
      }
    }
    if (ratios.empty()) continue;
    std::sort(ratios.begin(), ratios.end());
    const std::size_t n = ratios.size();
    factors_[static_cast<int>(c)] =
        n % 2 == 1 ? ratios[n / 2] : (ratios[n / 2 - 1] + ratios[n / 2]) / 2;
  }
}

double MeasuredProfile::collective_factor(Collective collective) const {
  return factors_[static_cast<int>(collective)];
}

namespace {

// The optimizer measurement that serves `threads` and the loop `flat`: the same loop first, then
// the nearest thread count (any on a GPU), then the most parameters.
const profiles::OptimizerMeasurement* nearest_optimizer(const profiles::Profile& profile,
                                                        int threads, bool flat) {
  const bool gpu = profile.device_kind == profiles::DeviceKind::kGpu;
  const profiles::OptimizerMeasurement* best = nullptr;
  auto key = [&](const profiles::OptimizerMeasurement& m) {
    return std::make_tuple(m.flat != flat, gpu ? 0 : std::abs(m.threads - threads), -m.parameters);
  };
  for (const profiles::OptimizerMeasurement& m : profile.optimizer) {
    if (best == nullptr || key(m) < key(*best)) best = &m;
  }
  return best;
}

}  // namespace

std::optional<double> MeasuredProfile::optimizer_s_per_parameter(int threads, bool flat) const {
  threads = threads_key(threads);
  const profiles::OptimizerMeasurement* best = nearest_optimizer(profile_, threads, flat);
  if (best == nullptr) return std::nullopt;
  const double per_parameter = best->time_s / static_cast<double>(best->parameters);
  return gpu_ ? per_parameter : per_parameter * best->threads / threads;
}

OptimizerAnswer MeasuredProfile::optimizer(int threads, bool flat) const {
  threads = threads_key(threads);
  const profiles::OptimizerMeasurement* best = nearest_optimizer(profile_, threads, flat);
  if (best == nullptr) return {};
  const bool same = threads_key(best->threads) == threads && best->flat == flat;
  return {same ? Provenance::kMeasured : Provenance::kScaled, best->threads, best->flat};
}

LayerAnswer MeasuredProfile::layer(const LayerQuery& query) const {
  LayerQuery q = query;
  q.threads = threads_key(query.threads);
  // Recomputation changes transformer layers only: an embedding or head measured without it is
  // the same point for a plan that recomputes.
  if (!is_layer(q.kind)) q.recompute = "none";
  LayerAnswer out;
  out.at = query;
  // Points of exactly the wanted shape apart from the micro-batch, sorted by it.
  std::vector<const LayerMeasurement*> row;
  for (const LayerMeasurement& p : points_) {
    if (same_kind(p.kind, q.kind) && p.seq_len == q.seq_len && p.tp == q.tp &&
        p.recompute == q.recompute && p.threads == q.threads && same_attention(p, q)) {
      row.push_back(&p);
    }
  }
  // Points that include the tensor-parallel all-reduces are preferred to those that skip them.
  if (std::any_of(row.begin(), row.end(), [](const auto* p) { return p->tp_communication; })) {
    std::erase_if(row, [](const LayerMeasurement* p) { return !p->tp_communication; });
    out.tp_communication = true;
  }
  std::sort(row.begin(), row.end(), [](const LayerMeasurement* a, const LayerMeasurement* b) {
    return a->micro_batch < b->micro_batch;
  });
  if (!row.empty()) {
    for (const LayerMeasurement* p : row) {
      if (p->micro_batch == q.micro_batch) {
        out.how = Provenance::kMeasured;
        out.forward_s = p->forward_s;
        out.backward_s = p->backward_s;
        out.activation_bytes = static_cast<double>(p->activation_bytes);
        return out;
      }
    }
    out.how = Provenance::kInterpolated;
    const double x = static_cast<double>(q.micro_batch);
    if (row.size() == 1) {
      out.from_micro_batches = {row[0]->micro_batch};
      const double k = x / static_cast<double>(row[0]->micro_batch);
      out.forward_s = row[0]->forward_s * k;
      out.backward_s = row[0]->backward_s * k;
      out.activation_bytes = static_cast<double>(row[0]->activation_bytes) * k;
      return out;
    }
    // The segment around x, or the nearest end segment.
    std::size_t i = 1;
    while (i + 1 < row.size() && row[i]->micro_batch < q.micro_batch) ++i;
    const LayerMeasurement& a = *row[i - 1];
    const LayerMeasurement& b = *row[i];
    const double xa = static_cast<double>(a.micro_batch);
    const double xb = static_cast<double>(b.micro_batch);
    out.from_micro_batches = {a.micro_batch, b.micro_batch};
    // Extrapolating below the smallest point never goes under a proportional share of it.
    auto value = [&](double ya, double yb) {
      double v = line(x, xa, ya, xb, yb);
      return std::max(v, std::min(ya, yb) * std::min(1.0, x / xa) * 0.5);
    };
    out.forward_s = value(a.forward_s, b.forward_s);
    out.backward_s = value(a.backward_s, b.backward_s);
    out.activation_bytes =
        value(static_cast<double>(a.activation_bytes), static_cast<double>(b.activation_bytes));
    return out;
  }
  // The nearest measured shape: same attention core and recomputation if any, same tp, same
  // threads, then the closest sequence length and micro-batch (by ratio).
  const LayerMeasurement* best = nullptr;
  auto distance = [&](const LayerMeasurement& p) {
    auto ratio = [](double a, double b) { return std::abs(std::log(a / b)); };
    return std::make_tuple(
        // Of two points alike, the one measured with its tp all-reduces (as the exact row).
        !same_attention(p, q), p.recompute != q.recompute, p.tp != q.tp, p.threads != q.threads,
        !p.tp_communication, ratio(static_cast<double>(p.seq_len), static_cast<double>(q.seq_len)),
        ratio(static_cast<double>(p.micro_batch), static_cast<double>(q.micro_batch)));
  };
  for (const LayerMeasurement& p : points_) {
    if (!same_kind(p.kind, q.kind)) continue;
    // A point with recomputation only serves queries with the same recomputation.
    if (p.recompute != "none" && p.recompute != q.recompute) continue;
    if (best == nullptr || distance(p) < distance(*best)) best = &p;
  }
  if (best == nullptr) return out;  // roofline
  out.how = Provenance::kScaled;
  out.forward_s = best->forward_s;
  out.backward_s = best->backward_s;
  out.activation_bytes = static_cast<double>(best->activation_bytes);
  out.at = shape_of(*best);
  if (gpu_) out.at.threads = query.threads;  // the roofline's ratio at the query's threads
  out.tp_communication = best->tp_communication && best->tp == q.tp;
  return out;
}

namespace {

// Coefficients of latency and of bytes / bandwidth in the ring formulas of comm.hpp.
std::pair<double, double> ring_coefficients(const std::string& collective, int ranks) {
  const double n = ranks;
  if (collective == "allreduce") return {2 * (n - 1), 2 * (n - 1) / n};
  if (collective == "p2p") return {1, 1};
  return {n - 1, (n - 1) / n};  // reduce_scatter, all_gather
}

}  // namespace

std::vector<LinkFit> fit_links(const std::vector<profiles::LinkMeasurement>& links) {
  std::vector<LinkFit> fits;
  for (const char* scope : {"intra_node", "inter_node"}) {
    // Weighted least squares: minimise sum ((a L + c B x - t) / t)^2 over L (latency) and
    // x = 1 / bandwidth, a 2 x 2 linear system.
    double saa = 0, sab = 0, sbb = 0, sat = 0, sbt = 0;
    std::vector<std::tuple<double, double, double>> rows;  // a, c * bytes, t
    std::vector<double> sizes;
    for (const profiles::LinkMeasurement& l : links) {
      if (l.scope != scope || l.collective == "p2p_loaded") continue;  // not the link alone
      auto [a, c] = ring_coefficients(l.collective, l.ranks);
      const double bx = c * l.bytes;
      const double w = 1 / (l.time_s * l.time_s);
      saa += w * a * a;
      sab += w * a * bx;
      sbb += w * bx * bx;
      sat += w * a * l.time_s;
      sbt += w * bx * l.time_s;
      rows.emplace_back(a, bx, l.time_s);
      if (std::find(sizes.begin(), sizes.end(), l.bytes) == sizes.end()) sizes.push_back(l.bytes);
    }
    if (rows.empty()) continue;
    double latency = 0;
    double inverse_bw = 0;
    const double det = saa * sbb - sab * sab;
    if (sizes.size() >= 2 && det > 0) {
      latency = (sat * sbb - sab * sbt) / det;
      inverse_bw = (saa * sbt - sab * sat) / det;
    }
    if (sizes.size() < 2 || det <= 0 || latency < 0 || inverse_bw <= 0) {
      latency = 0;  // bandwidth only
      inverse_bw = sbt / sbb;
    }
    LinkFit f;
    f.scope = scope;
    f.latency_us = latency * 1e6;
    f.bandwidth_gbps = 1 / inverse_bw / 1e9;
    f.points = static_cast<int>(rows.size());
    double sq = 0;
    for (const auto& [a, bx, t] : rows) {
      const double e = (a * latency + bx * inverse_bw - t) / t;
      sq += e * e;
    }
    f.rms_relative_error = std::sqrt(sq / static_cast<double>(rows.size()));
    fits.push_back(f);
  }
  return fits;
}

profiles::Cluster cluster_with_profile_links(const profiles::Cluster& cluster,
                                             const std::vector<LinkFit>& fits,
                                             std::vector<std::string>* notes) {
  profiles::Cluster out = cluster;
  auto describe = [](const LinkFit& f) {
    char text[160];
    std::snprintf(text, sizeof text,
                  "%.3g GB/s, %.3g µs per hop (fitted to %d measurements, rms %.1f %%)",
                  f.bandwidth_gbps, f.latency_us, f.points, 100 * f.rms_relative_error);
    return std::string(text);
  };
  for (const LinkFit& f : fits) {
    if (f.scope == "intra_node") {
      if (!cluster.links.empty()) {
        if (notes) notes->push_back("intra-node links kept from the cluster's explicit links");
        continue;
      }
      out.intra_node.bandwidth_gbps = f.bandwidth_gbps;
      out.intra_node.latency_us = f.latency_us;
      if (notes) notes->push_back("intra-node link from the profile: " + describe(f));
    } else if (out.inter_node) {
      out.inter_node->bandwidth_gbps = f.bandwidth_gbps;
      out.inter_node->latency_us = f.latency_us;
      if (notes) notes->push_back("inter-node link from the profile: " + describe(f));
    }
  }
  if (!fits.empty()) {
    out.source = cluster.source.empty() ? "links measured by loom profile"
                                        : cluster.source + "; links measured by loom profile";
  }
  return out;
}

std::string Extrapolation::text() const {
  return what + " " + wanted + ": " + how + (from.empty() ? "" : " from " + from);
}

const char* profile_name(Collective collective) {
  switch (collective) {
    case Collective::kAllReduce:
      return "allreduce";
    case Collective::kReduceScatter:
      return "reduce_scatter";
    case Collective::kAllGather:
      return "all_gather";
    case Collective::kP2p:
      return "p2p";
  }
  return "allreduce";
}

namespace {

std::string shape_text(const LayerQuery& q) {
  return "b=" + std::to_string(q.micro_batch) + " s=" + std::to_string(q.seq_len) +
         " tp=" + std::to_string(q.tp) + " recompute=" + q.recompute +
         (q.attention != "math" ? " attention=" + q.attention : "") +
         (q.threads > 0 ? " threads=" + std::to_string(q.threads) : "");
}

std::string loop_text(bool flat) { return flat ? "flat loop" : "per-tensor loop"; }

}  // namespace

std::optional<Extrapolation> MeasuredProfile::describe_layer(const LayerQuery& query,
                                                             const std::string& what) const {
  LayerQuery q = query;
  q.threads = threads_key(query.threads);
  LayerAnswer a = layer(q);
  a.at.threads = threads_key(a.at.threads);
  Extrapolation e{what, shape_text(q), to_string(a.how), ""};
  switch (a.how) {
    case Provenance::kMeasured:
      return std::nullopt;
    case Provenance::kInterpolated: {
      const std::vector<std::int64_t>& mb = a.from_micro_batches;
      if (mb.size() == 1) {
        e.from = "micro-batch " + std::to_string(mb[0]) + " (in proportion)";
      } else {
        const bool beyond = q.micro_batch < mb.front() || q.micro_batch > mb.back();
        e.from = "micro-batches " + std::to_string(mb.front()) + " and " +
                 std::to_string(mb.back()) + (beyond ? " (the line beyond them)" : "");
      }
      break;
    }
    case Provenance::kScaled: {
      // Recomputation changes transformer layers only: the embedding or head measured without
      // it is the point itself (the roofline ratio is 1).
      LayerQuery none = q;
      none.recompute = a.at.recompute;
      if (!is_layer(q.kind) && shape_text(none) == shape_text(a.at)) return std::nullopt;
      LayerQuery other_threads = q;
      other_threads.threads = a.at.threads;
      const bool threads_only = shape_text(other_threads) == shape_text(a.at);
      if (threads_only) e.how = "threads scaled";
      e.from = shape_text(a.at) + " (times roofline here / roofline there)";
      break;
    }
    case Provenance::kRoofline:
      e.from = "the device's rates (the profile has no " + what + " of this model)";
      break;
  }
  return e;
}

std::optional<Extrapolation> MeasuredProfile::describe_optimizer(int threads, bool flat) const {
  const OptimizerAnswer a = optimizer(threads, flat);
  const std::string threads_text = gpu_ ? "" : "threads=" + std::to_string(threads) + " ";
  Extrapolation e{"optimizer", threads_text + loop_text(flat), to_string(a.how), ""};
  switch (a.how) {
    case Provenance::kMeasured:
      return std::nullopt;
    case Provenance::kScaled:
      if (gpu_) {  // only the loop differs
        e.from = loop_text(a.flat);
        break;
      }
      if (a.flat == flat) e.how = "threads scaled";
      e.from = "threads=" + std::to_string(a.threads) + " " + loop_text(a.flat) + " (times " +
               std::to_string(a.threads) + "/" + std::to_string(threads) + ")";
      break;
    default:
      e.how = "roofline";
      e.from = "the device's memory bandwidth (the profile has no optimizer measurement)";
      break;
  }
  return e;
}

std::optional<Extrapolation> MeasuredProfile::describe_link(const LinkQuery& q) const {
  const std::string name = profile_name(q.collective);
  Extrapolation e{
      name + " over " + q.group,
      std::to_string(q.ranks) + " ranks " + profiles::bytes_text(q.bytes) + " " + q.scope, "", ""};
  const double tolerance = std::max(0.01 * q.bytes, 4.0 * q.ranks);
  int in_scope = 0;
  double smallest = 0;
  double largest = 0;
  bool collective_seen = false;
  for (const profiles::LinkMeasurement& l : profile_.links) {
    if (l.scope != q.scope || l.collective == "p2p_loaded") continue;
    if (l.collective == name && l.ranks == q.ranks && std::abs(l.bytes - q.bytes) <= tolerance) {
      return std::nullopt;
    }
    ++in_scope;
    if (l.ranks != q.ranks) continue;
    collective_seen = collective_seen || l.collective == name;
    smallest = smallest == 0 ? l.bytes : std::min(smallest, l.bytes);
    largest = std::max(largest, l.bytes);
  }
  if (in_scope == 0) {
    e.how = "cluster link";
    e.from = "the cluster's " + q.scope + " link (the profile has no link measured there)";
    return e;
  }
  const bool inside = smallest > 0 && q.bytes >= smallest && q.bytes <= largest;
  e.how = inside && collective_seen ? "fitted" : "extrapolated";
  e.from = "the " + q.scope + " fit of " + std::to_string(in_scope) + " link measurements";
  if (smallest > 0) {
    e.from += " (" + profiles::bytes_text(smallest) + " to " + profiles::bytes_text(largest) +
              " over " + std::to_string(q.ranks) + " ranks" +
              (collective_seen ? "" : ", no " + name) + ")";
  } else {
    e.from += " (none over " + std::to_string(q.ranks) + " ranks)";
  }
  return e;
}

}  // namespace loom::costmodel
