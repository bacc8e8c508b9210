// Coverage: for one point a plan needs, the calibration says whether its profile measured it and
// otherwise from what the figure is derived, without changing the figure.
#include <catch2/catch.hpp>

#include "costmodel/measured_profile.hpp"
#include "profiles/loader.hpp"

using namespace loom;
using namespace loom::costmodel;
using profiles::LayerKind;
using profiles::LayerMeasurement;

namespace {

LayerMeasurement point(const profiles::ModelSpec& m, LayerKind kind, std::int64_t b, int threads,
                       const std::string& recompute = "none") {
  LayerMeasurement p;
  p.kind = kind;
  p.hidden = m.hidden;
  p.heads = m.heads;
  p.ffn_hidden = m.ffn_hidden;
  p.seq_len = 64;
  p.micro_batch = b;
  p.threads = threads;
  p.recompute = recompute;
  p.forward_s = 0.001 * static_cast<double>(b);
  p.backward_s = 0.002 * static_cast<double>(b);
  p.activation_bytes = 1000 * b;
  return p;
}

LayerQuery query(std::int64_t b, int threads, const std::string& recompute = "none") {
  return {LayerKind::kEncoderLayer, b, 64, 1, recompute, threads};
}

}  // namespace

TEST_CASE("a point measured as asked needs no line", "[calibration][coverage]") {
  const profiles::ModelSpec model = profiles::load_model("tiny-bert");
  profiles::Profile prof;
  prof.device_kind = profiles::DeviceKind::kCpu;
  prof.layers = {point(model, LayerKind::kEncoderLayer, 8, 1),
                 point(model, LayerKind::kEmbedding, 8, 1)};
  prof.optimizer = {{1'000'000, 1, 0.004, true}};
  const MeasuredProfile cal(prof, model);
  CHECK_FALSE(cal.describe_layer(query(8, 1), "encoder layer"));
  CHECK_FALSE(cal.describe_optimizer(1, true));
  // The embedding is measured without recomputation only: that is its point under any.
  LayerQuery embedding = query(8, 1, "full");
  embedding.kind = LayerKind::kEmbedding;
  CHECK_FALSE(cal.describe_layer(embedding, "embedding"));
}

TEST_CASE("a plan's threads the profile lacks are said, with the point they are scaled from",
          "[calibration][coverage]") {
  const profiles::ModelSpec model = profiles::load_model("tiny-bert");
  profiles::Profile prof;
  prof.device_kind = profiles::DeviceKind::kCpu;
  prof.layers = {point(model, LayerKind::kEncoderLayer, 8, 2)};
  prof.optimizer = {{1'000'000, 2, 0.004, false}};
  const MeasuredProfile cal(prof, model);
  const auto layer = cal.describe_layer(query(8, 1), "encoder layer");
  REQUIRE(layer);
  CHECK(layer->how == "threads scaled");
  CHECK(layer->wanted == "b=8 s=64 tp=1 recompute=none threads=1");
  CHECK(layer->text() ==
        "encoder layer b=8 s=64 tp=1 recompute=none threads=1: threads scaled from b=8 s=64 tp=1 "
        "recompute=none threads=2 (times roofline here / roofline there)");
  // Another micro-batch and threads: scaled from the nearest shape.
  CHECK(cal.describe_layer(query(4, 1), "encoder layer")->how == "scaled");
  // The flat loop at 1 thread from the per-tensor loop at 2.
  const auto optimizer = cal.describe_optimizer(1, true);
  REQUIRE(optimizer);
  CHECK(optimizer->text() ==
        "optimizer threads=1 flat loop: scaled from threads=2 per-tensor loop (times 2/1)");
  CHECK(cal.describe_optimizer(4, false)->how == "threads scaled");
  // The figures themselves are those of layer() and optimizer_s_per_parameter().
  CHECK(cal.layer(query(8, 1)).how == Provenance::kScaled);
  CHECK(*cal.optimizer_s_per_parameter(1, true) == Approx(0.004 / 1e6 * 2));
}

TEST_CASE("a GPU profile serves a plan of any CPU threads per rank as measured",
          "[calibration][coverage]") {
  // The host's threads do not set a GPU's kernel times: a profile measured with 16 threads is
  // the point of a plan that gives its rank 1, and its optimizer time is not multiplied by 16.
  const profiles::ModelSpec model = profiles::load_model("tiny-bert");
  profiles::Profile prof;
  prof.device_kind = profiles::DeviceKind::kGpu;
  prof.layers = {point(model, LayerKind::kEncoderLayer, 8, 16)};
  prof.optimizer = {{1'000'000, 16, 0.004, false}, {1'000'000, 16, 0.003, true}};
  const MeasuredProfile cal(prof, model);
  CHECK_FALSE(cal.describe_layer(query(8, 1), "encoder layer"));
  CHECK(cal.layer(query(8, 1)).how == Provenance::kMeasured);
  CHECK(cal.layer(query(8, 1)).forward_s == Approx(0.008));
  CHECK_FALSE(cal.describe_optimizer(1, false));
  CHECK(*cal.optimizer_s_per_parameter(1, false) == Approx(0.004 / 1e6));
  CHECK(*cal.optimizer_s_per_parameter(1, true) == Approx(0.003 / 1e6));
  // The profile itself keeps what was measured (a plan embeds it, and threads >= 1 there).
  CHECK(cal.profile().optimizer[0].threads == 16);
  // Another micro-batch is still interpolated, and its line names no threads.
  const auto other = cal.describe_layer(query(4, 1), "encoder layer");
  REQUIRE(other);
  CHECK(other->wanted == "b=4 s=64 tp=1 recompute=none");
}

TEST_CASE("interpolated micro-batches name the points they come from", "[calibration][coverage]") {
  const profiles::ModelSpec model = profiles::load_model("tiny-bert");
  profiles::Profile prof;
  prof.device_kind = profiles::DeviceKind::kCpu;
  prof.layers = {point(model, LayerKind::kEncoderLayer, 4, 1),
                 point(model, LayerKind::kEncoderLayer, 16, 1)};
  const MeasuredProfile cal(prof, model);
  CHECK(cal.describe_layer(query(8, 1), "encoder layer")->text() ==
        "encoder layer b=8 s=64 tp=1 recompute=none threads=1: interpolated from micro-batches 4 "
        "and 16");
  CHECK(cal.describe_layer(query(32, 1), "encoder layer")->from ==
        "micro-batches 4 and 16 (the line beyond them)");
  LayerQuery head = query(8, 1);
  head.kind = LayerKind::kHead;
  CHECK(cal.describe_layer(head, "head")->text() ==
        "head b=8 s=64 tp=1 recompute=none threads=1: roofline from the device's rates (the "
        "profile has no head of this model)");
  CHECK(cal.describe_optimizer(1, false)->how == "roofline");
}

TEST_CASE("links: measured sizes need no line, others are fitted, extrapolated or the cluster's",
          "[calibration][coverage]") {
  const profiles::ModelSpec model = profiles::load_model("tiny-bert");
  profiles::Profile prof;
  prof.device_kind = profiles::DeviceKind::kCpu;
  for (double bytes : {4096.0, 1048576.0}) {
    prof.links.push_back({"allreduce", 2, bytes, 1e-4 + bytes / 1e9, "intra_node"});
  }
  const MeasuredProfile cal(prof, model);
  // loom profile --links rounds a message to whole floats per rank: within 4 bytes per rank.
  CHECK_FALSE(cal.describe_link({"dp", Collective::kAllReduce, 2, 1048574, "intra_node"}));
  const auto inside = cal.describe_link({"dp", Collective::kAllReduce, 2, 65536, "intra_node"});
  REQUIRE(inside);
  CHECK(inside->text() ==
        "allreduce over dp 2 ranks 64 KiB intra_node: fitted from the intra_node fit of 2 link "
        "measurements (4 KiB to 1 MiB over 2 ranks)");
  CHECK(cal.describe_link({"dp", Collective::kAllReduce, 2, 4e6, "intra_node"})->how ==
        "extrapolated");
  CHECK(cal.describe_link({"pp", Collective::kP2p, 2, 65536, "intra_node"})->how ==
        "extrapolated");  // no p2p measured
  CHECK(cal.describe_link({"dp", Collective::kAllReduce, 4, 65536, "intra_node"})->how ==
        "extrapolated");  // no 4-rank measurement
  CHECK(cal.describe_link({"dp", Collective::kAllReduce, 2, 65536, "inter_node"})->how ==
        "cluster link");
}

TEST_CASE("a transformer layer measured with another attention core is scaled, and said",
          "[calibration][coverage]") {
  // A profile of the unfused core serves a flash plan only through the rooflines' ratio (the
  // score matrix it kept and computed is not the fused kernel's); a flash point is the flash
  // plan's own, and embeddings and heads have no attention core to differ in.
  const profiles::ModelSpec model = profiles::load_model("tiny-bert");
  profiles::Profile prof;
  prof.device_kind = profiles::DeviceKind::kGpu;
  prof.layers = {point(model, LayerKind::kEncoderLayer, 8, 1),
                 point(model, LayerKind::kEmbedding, 8, 1)};
  const MeasuredProfile cal(prof, model);
  LayerQuery flash = query(8, 1);
  flash.attention = "flash";
  CHECK(cal.layer(query(8, 1)).how == Provenance::kMeasured);
  CHECK(cal.layer(flash).how == Provenance::kScaled);
  CHECK(cal.layer(flash).at.attention == "math");
  const auto line = cal.describe_layer(flash, "encoder layer");
  REQUIRE(line);
  CHECK(line->text() ==
        "encoder layer b=8 s=64 tp=1 recompute=none attention=flash: scaled from b=8 s=64 tp=1 "
        "recompute=none (times roofline here / roofline there)");
  LayerQuery embedding = flash;
  embedding.kind = LayerKind::kEmbedding;
  embedding.attention = "math";
  CHECK(cal.layer(embedding).how == Provenance::kMeasured);
  prof.layers[0].attention = "flash";
  const MeasuredProfile fused(prof, model);
  CHECK(fused.layer(flash).how == Provenance::kMeasured);
  CHECK(fused.layer(query(8, 1)).how == Provenance::kScaled);
}
