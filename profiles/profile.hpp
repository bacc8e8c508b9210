// Measured profiles: `loom-profile/1` (docs/formats.md), written by `loom profile` and read by the
// planner, the simulator and `loom validate` (`--profile`).
//
// A profile holds measurements, not a model: per layer kind and shape, the forward and backward
// time of one micro-batch and the bytes it keeps; per collective, the time of one message size
// over one group. How the cost model uses them (interpolation, link fitting, fallbacks) lives in
// costmodel/measured_profile.hpp.
//
// Extensions to the spec's example (all optional when reading, always written): "optimizer", a
// list of {"parameters", "threads", "time_s"} (one AdamW step over that many fp32 parameters); per
// layer
// "recompute" ("none" | "selective" | "full", default "none"), "threads" (CPU threads the
// measuring rank used, default 1), "vocab" (embedding and head), "peak_temporary_bytes"
// (bytes allocated above the kept activations during forward plus backward), "chained_layers"
// (LayerMeasurement::chained_layers), and at the top
// "device_kind" ("gpu" | "cpu", default "gpu").
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "profiles/cluster.hpp"
#include "profiles/model_spec.hpp"

namespace loom::profiles {

// "embedding" | "encoder_layer" | "decoder_layer" | "head".
enum class LayerKind { kEmbedding, kEncoderLayer, kDecoderLayer, kHead };
const char* to_string(LayerKind kind);

struct LayerMeasurement {
  LayerKind kind = LayerKind::kEncoderLayer;
  std::int64_t hidden = 0;
  std::int64_t heads = 0;
  std::int64_t ffn_hidden = 0;
  std::optional<std::int64_t> vocab;  // embedding and head
  std::int64_t seq_len = 0;
  std::int64_t micro_batch = 0;
  int tp = 1;
  std::string recompute = "none";
  // The attention core the transformer layer ran: "math" (unfused, the s x s scores kept) or
  // "flash" (scaled_dot_product_attention). JSON "attention", absent = "math"; embeddings and
  // heads keep "math" (they have no attention).
  std::string attention = "math";
  int threads = 1;
  double forward_s = 0;               // one micro-batch, median of repeats
  double backward_s = 0;              // without recomputation
  std::int64_t activation_bytes = 0;  // kept from forward for backward
  std::int64_t parameter_bytes = 0;
  std::optional<std::int64_t> peak_temporary_bytes;
  // The times include the shard's tensor-parallel all-reduces (measured by tp ranks together).
  bool tp_communication = false;
  // Transformer layers run as one chain to time this point (GPUs, and CPU tp ranks measured
  // together); its times and bytes are 1/n of the chain's. JSON "chained_layers", default 1
  // (written when > 1).
  int chained_layers = 1;
  bool operator==(const LayerMeasurement&) const = default;
};

// "allreduce" | "reduce_scatter" | "all_gather" | "p2p"; "intra_node" | "inter_node".
struct LinkMeasurement {
  // allreduce | reduce_scatter | all_gather | p2p (idle ping-pong) | p2p_loaded (CPU: what a
  // message each way adds to a round of compute on both ranks, as in a pipeline's steady state)
  std::string collective;
  int ranks = 2;
  double bytes = 0;  // the whole buffer (as costmodel/comm.hpp counts it)
  double time_s = 0;
  std::string scope = "intra_node";
  bool operator==(const LinkMeasurement&) const = default;
};

struct OptimizerMeasurement {
  std::int64_t parameters = 0;
  int threads = 1;
  double time_s = 0;  // the optimizer part of one step, median of repeats
  // true: the multi-rank loop's step over flat buffers (executor/flat_adamw.hpp); false: the
  // one-rank loop's (torch::optim::AdamW over the parameters, per-tensor norms and clipping).
  bool flat = false;
  bool operator==(const OptimizerMeasurement&) const = default;
};

struct Profile {
  std::string device;
  DeviceKind device_kind = DeviceKind::kGpu;
  std::string torch_version;
  std::string created;  // ISO 8601 UTC
  Precision precision = Precision::kBf16;
  std::vector<LayerMeasurement> layers;
  std::vector<LinkMeasurement> links;
  std::vector<OptimizerMeasurement> optimizer;
  bool operator==(const Profile&) const = default;
};

// Strict reading (unknown keys, wrong types, non-positive sizes and times are InputErrors naming
// `source` and the JSON path); at least one layer or link measurement is required.
Profile profile_from_json(const nlohmann::json& value, const std::string& source);
nlohmann::json profile_to_json(const Profile& profile);
// Reads and checks a file.
Profile load_profile(const std::string& path);

// The union of several profiles of one device and precision (layers, then links, in order).
// InputError naming the second file when devices or precisions differ.
Profile merge_profiles(const std::vector<Profile>& profiles,
                       const std::vector<std::string>& sources);

// A profile is for `model` when it measured a transformer layer of the model's shape (hidden,
// heads, ffn_hidden), or, holding only links, for any model. Otherwise an InputError naming
// `source`, the first layer's shape and the model's: predictions would use another model's times.
// A profile of another precision than `precision` is refused too.
void check_profile_for(const Profile& profile, const ModelSpec& model, Precision precision,
                       const std::string& source);

}  // namespace loom::profiles
