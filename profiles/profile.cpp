#include "profiles/profile.hpp"

#include <cmath>
#include <nlohmann/json.hpp>

#include "profiles/errors.hpp"
#include "profiles/json_reader.hpp"
#include "profiles/loader.hpp"

namespace loom::profiles {

const char* to_string(LayerKind kind) {
  switch (kind) {
    case LayerKind::kEmbedding:
      return "embedding";
    case LayerKind::kEncoderLayer:
      return "encoder_layer";
    case LayerKind::kDecoderLayer:
      return "decoder_layer";
    case LayerKind::kHead:
      return "head";
  }
  return "encoder_layer";
}

namespace {

const std::vector<std::string> kLayerKinds = {"embedding", "encoder_layer", "decoder_layer",
                                              "head"};
const std::vector<std::string> kCollectives = {"allreduce", "reduce_scatter", "all_gather", "p2p",
                                               "p2p_loaded"};

LayerKind layer_kind(const std::string& text) {
  if (text == "embedding") return LayerKind::kEmbedding;
  if (text == "decoder_layer") return LayerKind::kDecoderLayer;
  if (text == "head") return LayerKind::kHead;
  return LayerKind::kEncoderLayer;
}

int small_int(ObjectReader& r, const std::string& key, int min_value, int fallback) {
  std::optional<std::int64_t> v = r.optional_integer(key, min_value);
  if (v && *v > 1'000'000) r.fail(key, "expected an integer <= 1000000");
  return v ? static_cast<int>(*v) : fallback;
}

LayerMeasurement read_layer(ObjectReader r) {
  LayerMeasurement l;
  l.kind = layer_kind(r.choice("kind", kLayerKinds));
  l.hidden = r.integer("hidden", 1);
  l.heads = r.integer("heads", 1);
  l.ffn_hidden = r.integer("ffn_hidden", 1);
  l.vocab = r.optional_integer("vocab", 1);
  l.seq_len = r.integer("seq_len", 1);
  l.micro_batch = r.integer("micro_batch", 1);
  l.tp = small_int(r, "tp", 1, 1);
  if (r.has("recompute")) l.recompute = r.choice("recompute", {"none", "selective", "full"});
  if (r.has("attention")) l.attention = r.choice("attention", {"math", "flash"});
  l.threads = small_int(r, "threads", 1, 1);
  l.forward_s = r.number("forward_s", 0, /*exclusive=*/true);
  l.backward_s = r.number("backward_s", 0, /*exclusive=*/true);
  l.activation_bytes = r.integer("activation_bytes", 0);
  l.parameter_bytes = r.integer("parameter_bytes", 0);
  l.peak_temporary_bytes = r.optional_integer("peak_temporary_bytes", 0);
  l.tp_communication = r.optional_boolean("tp_communication").value_or(false);
  l.chained_layers = small_int(r, "chained_layers", 1, 1);
  if (l.tp_communication && l.tp < 2) r.fail("tp_communication", "expected only with tp >= 2");
  if (l.hidden % l.heads != 0) r.fail("heads", "expected a divisor of hidden");
  r.finish();
  return l;
}

LinkMeasurement read_link(ObjectReader r) {
  LinkMeasurement l;
  l.collective = r.choice("collective", kCollectives);
  l.ranks = static_cast<int>(r.integer("ranks", 2, 1'000'000));
  l.bytes = r.number("bytes", 0, /*exclusive=*/true);
  l.time_s = r.number("time_s", 0, /*exclusive=*/true);
  l.scope = r.choice("scope", {"intra_node", "inter_node"});
  if ((l.collective == "p2p" || l.collective == "p2p_loaded") && l.ranks != 2) {
    r.fail("ranks", "expected 2 for " + l.collective);
  }
  r.finish();
  return l;
}

}  // namespace

Profile profile_from_json(const nlohmann::json& value, const std::string& source) {
  ObjectReader r(value, source);
  r.expect_format("loom-profile");
  Profile p;
  p.device = r.string("device");
  if (r.has("device_kind")) {
    p.device_kind =
        r.choice("device_kind", {"gpu", "cpu"}) == "cpu" ? DeviceKind::kCpu : DeviceKind::kGpu;
  }
  p.torch_version = r.optional_string("torch_version").value_or("");
  p.created = r.optional_string("created").value_or("");
  p.precision = *parse_precision(r.choice("precision", {"fp32", "tf32", "fp16", "bf16"}));
  if (r.has("layers")) {
    const nlohmann::json& layers = r.array("layers");
    for (std::size_t i = 0; i < layers.size(); ++i) {
      p.layers.push_back(read_layer(ObjectReader(layers[i], source, r.element_path("layers", i))));
    }
  }
  if (r.has("links")) {
    const nlohmann::json& links = r.array("links");
    for (std::size_t i = 0; i < links.size(); ++i) {
      p.links.push_back(read_link(ObjectReader(links[i], source, r.element_path("links", i))));
    }
  }
  if (r.has("optimizer")) {
    const nlohmann::json& list = r.array("optimizer");
    for (std::size_t i = 0; i < list.size(); ++i) {
      ObjectReader o(list[i], source, r.element_path("optimizer", i));
      OptimizerMeasurement m;
      m.parameters = o.integer("parameters", 1);
      m.threads = small_int(o, "threads", 1, 1);
      m.time_s = o.number("time_s", 0, /*exclusive=*/true);
      m.flat = o.optional_boolean("flat").value_or(false);
      o.finish();
      p.optimizer.push_back(m);
    }
  }
  if (p.layers.empty() && p.links.empty()) {
    r.fail("layers", "expected at least one layer or link measurement");
  }
  r.finish();
  return p;
}

nlohmann::json profile_to_json(const Profile& p) {
  nlohmann::json layers = nlohmann::json::array();
  for (const LayerMeasurement& l : p.layers) {
    nlohmann::json j = {{"kind", to_string(l.kind)},
                        {"hidden", l.hidden},
                        {"heads", l.heads},
                        {"ffn_hidden", l.ffn_hidden},
                        {"seq_len", l.seq_len},
                        {"micro_batch", l.micro_batch},
                        {"tp", l.tp},
                        {"recompute", l.recompute},
                        {"threads", l.threads},
                        {"forward_s", l.forward_s},
                        {"backward_s", l.backward_s},
                        {"activation_bytes", l.activation_bytes},
                        {"parameter_bytes", l.parameter_bytes}};
    if (l.vocab) j["vocab"] = *l.vocab;
    if (l.peak_temporary_bytes) j["peak_temporary_bytes"] = *l.peak_temporary_bytes;
    if (l.tp_communication) j["tp_communication"] = true;
    if (l.chained_layers > 1) j["chained_layers"] = l.chained_layers;
    if (l.attention != "math") j["attention"] = l.attention;
    layers.push_back(std::move(j));
  }
  nlohmann::json links = nlohmann::json::array();
  for (const LinkMeasurement& l : p.links) {
    links.push_back({{"collective", l.collective},
                     {"ranks", l.ranks},
                     // Whole bytes are written as integers (as the spec's example).
                     {"bytes", l.bytes == std::floor(l.bytes) && l.bytes < 9e18
                                   ? nlohmann::json(static_cast<std::int64_t>(l.bytes))
                                   : nlohmann::json(l.bytes)},
                     {"time_s", l.time_s},
                     {"scope", l.scope}});
  }
  nlohmann::json optimizer = nlohmann::json::array();
  for (const OptimizerMeasurement& m : p.optimizer) {
    nlohmann::json entry = {
        {"parameters", m.parameters}, {"threads", m.threads}, {"time_s", m.time_s}};
    if (m.flat) entry["flat"] = true;
    optimizer.push_back(entry);
  }
  return {{"format", "loom-profile/1"},
          {"device", p.device},
          {"device_kind", p.device_kind == DeviceKind::kCpu ? "cpu" : "gpu"},
          {"torch_version", p.torch_version},
          {"created", p.created},
          {"precision", to_string(p.precision)},
          {"layers", layers},
          {"links", links},
          {"optimizer", optimizer}};
}

Profile load_profile(const std::string& path) {
  return profile_from_json(parse_json_text(read_text_file(path), path), path);
}

Profile merge_profiles(const std::vector<Profile>& profiles,
                       const std::vector<std::string>& sources) {
  if (profiles.empty()) throw InputError("--profile", "", "expected at least one profile");
  Profile out = profiles.front();
  for (std::size_t i = 1; i < profiles.size(); ++i) {
    const Profile& p = profiles[i];
    const std::string& source = i < sources.size() ? sources[i] : std::string("--profile");
    if (p.precision != out.precision) {
      throw InputError(source, "$.precision",
                       std::string("expected \"") + to_string(out.precision) +
                           "\" as the other profiles, found \"" + to_string(p.precision) + "\"");
    }
    if (p.device != out.device) {
      throw InputError(
          source, "$.device",
          "expected \"" + out.device + "\" as the other profiles, found \"" + p.device + "\"");
    }
    out.layers.insert(out.layers.end(), p.layers.begin(), p.layers.end());
    out.links.insert(out.links.end(), p.links.begin(), p.links.end());
    out.optimizer.insert(out.optimizer.end(), p.optimizer.begin(), p.optimizer.end());
  }
  return out;
}

void check_profile_for(const Profile& p, const ModelSpec& model, Precision precision,
                       const std::string& source) {
  if (p.precision != precision) {
    throw InputError(source, "$.precision",
                     std::string("expected \"") + to_string(precision) +
                         "\" (the job's precision), found \"" + to_string(p.precision) +
                         "\": measure again with --precision " + to_string(precision));
  }
  if (p.layers.empty()) return;
  for (const LayerMeasurement& l : p.layers) {
    if ((l.kind == LayerKind::kEncoderLayer || l.kind == LayerKind::kDecoderLayer) &&
        l.hidden == model.hidden && l.heads == model.heads && l.ffn_hidden == model.ffn_hidden) {
      return;
    }
  }
  const LayerMeasurement& first = p.layers.front();
  throw InputError(source, "$.layers",
                   "expected measurements of model " + model.name + " (hidden " +
                       std::to_string(model.hidden) + ", heads " + std::to_string(model.heads) +
                       ", ffn_hidden " + std::to_string(model.ffn_hidden) +
                       "); this profile measured hidden " + std::to_string(first.hidden) +
                       ", heads " + std::to_string(first.heads) + ", ffn_hidden " +
                       std::to_string(first.ffn_hidden) + ": another model");
}

}  // namespace loom::profiles
