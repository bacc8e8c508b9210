// MeasuredProfile: what a measured profile (profiles/profile.hpp) changes in the cost model.
//
// Layers: for each kind (embedding, transformer layer, head) the cost model asks for one
// micro-batch's forward and backward time and activation bytes at a shape (micro-batch, sequence
// length, tp, recomputation, CPU threads). The answer is, in order of preference:
//   measured      a point of exactly that shape;
//   interpolated  points of that shape but other micro-batch sizes: piecewise linear in the
//                 micro-batch (time and activations of a layer are affine in it), extrapolated
//                 from the two nearest points at the ends, proportional with a single point;
//   scaled        the roofline of the wanted shape times measured / roofline at the nearest
//                 measured shape (nearest: same tp, then same threads, then sequence length,
//                 then micro-batch), times point threads / wanted threads for CPU ranks;
//   roofline      no measurement of that kind at all.
// Recomputation: points measured with the wanted recomputation are used as they are; otherwise the
// cost model derives it from the "none" point (full: the forward again; selective: the roofline's
// share scaled like the forward).
//
// Links: collective times are fitted per scope to the ring formulas of comm.hpp,
//   t = a(collective, n) * latency + c(collective, n) * bytes / bandwidth,
// by least squares on relative error, and replace the cluster's link classes. What one collective
// costs beyond that shared fit (Gloo's reduce-scatter is an all-reduce and a slice, so it moves
// twice the ring's bytes) is kept as a factor per collective: the median of measured / fitted
// time over its measurements of 64 KiB and more.
//
// Optimizer: AdamW's step time per parameter from the profile's optimizer measurements (same
// thread count, else the nearest scaled by threads), instead of the memory-bandwidth roofline.
//
// Coverage: describe_layer(), describe_optimizer() and describe_link() say, for one point a plan
// needs, whether the profile measured it and otherwise from what the figure is derived (an
// Extrapolation), without changing any figure: what `loom plan`, `simulate` and `validate` print
// for the points a profile lacks, and what `loom profile --for` measures so that none are left.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "costmodel/comm.hpp"
#include "profiles/cluster.hpp"
#include "profiles/model_spec.hpp"
#include "profiles/profile.hpp"

namespace loom::costmodel {

enum class Provenance { kMeasured, kInterpolated, kScaled, kRoofline };
const char* to_string(Provenance how);

struct LayerQuery {
  profiles::LayerKind kind = profiles::LayerKind::kEncoderLayer;
  std::int64_t micro_batch = 1;
  std::int64_t seq_len = 1;
  int tp = 1;
  std::string recompute = "none";
  int threads = 1;
  // The attention core of a transformer layer ("math" | "flash"); embeddings and heads "math".
  // A point of the other core is never the query's own: it scales by the rooflines' ratio.
  std::string attention = "math";
};

struct LayerAnswer {
  Provenance how = Provenance::kRoofline;
  double forward_s = 0;
  double backward_s = 0;  // with the point's recomputation
  double activation_bytes = 0;
  // The times include the tensor-parallel all-reduces of a layer of the query's tp (points
  // measured with tp_communication; preferred over points of the same shape without).
  bool tp_communication = false;
  // The shape the figures belong to: the query for measured and interpolated answers, the
  // nearest measured shape for scaled ones (the caller scales by its roofline there).
  LayerQuery at;
  // The micro-batches of the measured points an interpolated answer comes from (one or two).
  std::vector<std::int64_t> from_micro_batches;
};

// How the optimizer step's time per parameter is found for a rank (optimizer_s_per_parameter()).
struct OptimizerAnswer {
  Provenance how = Provenance::kRoofline;  // measured, scaled (other threads or loop) or roofline
  int threads = 0;                         // of the measurement used
  bool flat = false;                       // its loop: the multi-rank (flat buffers) one
};

// One point a plan needs that its profile did not measure: which point (`what` at `wanted`) and
// from what the cost model derives it (`how`, `from`). JSON: {"what", "wanted", "how", "from"}.
struct Extrapolation {
  std::string what;    // "encoder layer", "embedding", "head", "optimizer", "allreduce over dp"
  std::string wanted;  // the point: "b=8 s=64 tp=1 recompute=none threads=1", "2 ranks, 4 MiB"
  std::string how;     // "interpolated" | "scaled" | "threads scaled" | "roofline" (layers and
                       // optimizer); "fitted" | "extrapolated" | "cluster link" (links)
  std::string from;    // "micro-batches 4 and 16", "b=8 s=64 tp=1 recompute=none threads=2", ...
  // "encoder layer b=8 ... threads=1: scaled from b=8 ... threads=2"
  std::string text() const;
  bool operator==(const Extrapolation&) const = default;
};

// A collective a plan's step runs over one of its groups (what describe_link() checks).
struct LinkQuery {
  std::string group;  // "dp", "tp", "pp", "world", or several joined by "+"
  Collective collective = Collective::kAllReduce;
  int ranks = 2;
  double bytes = 0;
  std::string scope = "intra_node";
  bool operator==(const LinkQuery&) const = default;
};

// The name of a collective in loom-profile/1's links ("allreduce", "reduce_scatter",
// "all_gather", "p2p").
const char* profile_name(Collective collective);

class MeasuredProfile {
 public:
  // Keeps the layer measurements of `model`'s shape (hidden, heads, ffn_hidden; embedding and
  // head also by vocab when recorded); transformer layers of both kinds count as one.
  MeasuredProfile(const profiles::Profile& profile, const profiles::ModelSpec& model);

  const profiles::Profile& profile() const { return profile_; }
  LayerAnswer layer(const LayerQuery& query) const;
  bool empty() const { return points_.empty(); }
  // Measured / fitted time of `collective` (1 without link measurements of it); p2p's from the
  // p2p_loaded measurements when the profile has them.
  double collective_factor(Collective collective) const;
  // Seconds per parameter of the optimizer part of a step with `threads` CPU threads, of the
  // multi-rank loop (`flat`) or the one-rank loop, preferring measurements of that loop; nullopt
  // when the profile has no optimizer measurement.
  std::optional<double> optimizer_s_per_parameter(int threads, bool flat) const;
  // Which measurement optimizer_s_per_parameter() uses.
  OptimizerAnswer optimizer(int threads, bool flat) const;

  // Coverage of one point (nullopt: measured). `what` names the layer kind in the line.
  std::optional<Extrapolation> describe_layer(const LayerQuery& query,
                                              const std::string& what) const;
  std::optional<Extrapolation> describe_optimizer(int threads, bool flat) const;
  // Measured: a link measurement of the same collective, rank count and scope whose message size
  // is the query's within 1 % (or 4 bytes per rank, the rounding of loom profile --links);
  // otherwise fitted (inside the measured sizes of that scope and rank count), extrapolated by
  // the fit, or the cluster's link (no measurement of that scope).
  std::optional<Extrapolation> describe_link(const LinkQuery& query) const;

 private:
  // A GPU profile's times do not depend on the host's CPU threads per rank: its points and
  // optimizer measurements serve a query of any thread count (both held as 0).
  int threads_key(int threads) const { return gpu_ ? 0 : threads; }

  bool gpu_ = false;
  profiles::Profile profile_;
  std::vector<profiles::LayerMeasurement> points_;
  double factors_[4] = {1, 1, 1, 1};  // by Collective
};

// `profile`'s collective_factor(), or 1 without a measured profile: the one rule the estimate's
// terms and CostModel::collective_factor() share.
inline double collective_factor(const MeasuredProfile* profile, Collective collective) {
  return profile != nullptr ? profile->collective_factor(collective) : 1.0;
}

struct LinkFit {
  std::string scope;          // "intra_node" | "inter_node"
  double latency_us = 0;      // per hop
  double bandwidth_gbps = 0;  // per direction, as loom-cluster/1 counts it
  int points = 0;
  double rms_relative_error = 0;  // of the fitted times against the measured ones
};

// One fit per scope present (intra_node first). Needs two message sizes per scope for a latency;
// with one, the latency is 0 and the bandwidth carries the whole time.
std::vector<LinkFit> fit_links(const std::vector<profiles::LinkMeasurement>& links);

// The cluster with its link classes replaced by the fits (shorthand clusters; a cluster with
// explicit links keeps them and the returned note says so). Notes describe what changed.
profiles::Cluster cluster_with_profile_links(const profiles::Cluster& cluster,
                                             const std::vector<LinkFit>& fits,
                                             std::vector<std::string>* notes);

}  // namespace loom::costmodel
