// The fused-attention kernel model (costmodel::fused_attention_time_s, FusedAttentionFit) against
// the kernels measured on an H200 (bench/gpu-runs/h200-attention/layers-*.json, from
// bench/gpu_layers.py): the shipped constants are the least-squares fit to cuDNN's rows, and
// FlashAttention-2's rows fit the same form at the rates docs/cost-model.md states.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "bench/attention_rows.hpp"
#include "costmodel/compute.hpp"
#include "profiles/cluster.hpp"
#include "profiles/loader.hpp"

using namespace loom;

namespace {

std::vector<bench::AttentionRow> measured_rows(const std::string& backend) {
  std::vector<bench::AttentionRow> out;
  for (const char* name : {"layers-long.json", "layers-encoder.json"}) {
    const std::string path =
        std::string(LOOM_SOURCE_DIR) + "/bench/gpu-runs/h200-attention/" + name;
    for (const bench::AttentionRow& r : bench::read_attention_rows(path)) {
      if (r.backend == backend) out.push_back(r);
    }
  }
  return out;
}

costmodel::GemmDevice h200_bf16() {
  return costmodel::device_rates(
             profiles::datasheet_cluster(profiles::load_cluster("h200-x1")).device,
             costmodel::Precision::kBf16, costmodel::EfficiencyDefaults{})
      .gemm;
}

}  // namespace

TEST_CASE("the fused attention model times cuDNN's measured kernels", "[gemm][attention]") {
  const std::vector<bench::AttentionRow> rows = measured_rows("cudnn");
  REQUIRE(rows.size() == 90);
  const costmodel::GemmDevice d = h200_bf16();
  // At the kernel's fitted product rate: 2.0 % forward, 3.2 % backward.
  CHECK(bench::median_abs_error(rows, false, d, 0.893) < 0.025);
  CHECK(bench::median_abs_error(rows, true, d, 0.893) < 0.035);
  // One rate for every shape would miss by far more: the per-block and exponential costs matter.
  CHECK(bench::median_abs_error(rows, false, d, 0.893, {{0, 0}, {0, 0}, {0, 0}, {0, 0}}) > 0.2);
}

TEST_CASE("FusedAttentionFit's constants are the least-squares fit to cuDNN's rows",
          "[gemm][attention]") {
  const std::vector<bench::AttentionRow> rows = measured_rows("cudnn");
  const costmodel::GemmDevice d = h200_bf16();
  const bench::PassFit f = bench::fit_attention_pass(rows, false, d);
  const bench::PassFit b = bench::fit_attention_pass(rows, true, d);
  const costmodel::FusedAttentionFit fit = bench::kernel_fit(f, b);
  const costmodel::FusedAttentionFit shipped;
  CHECK(f.efficiency == Approx(0.893).epsilon(0.01));
  CHECK(fit.backward_rate == Approx(shipped.backward_rate).epsilon(0.01));
  for (int pass = 0; pass < 2; ++pass) {
    CAPTURE(pass);
    CHECK(fit.exp_head_dims[pass] == Approx(shipped.exp_head_dims[pass]).margin(1.0));
    CHECK(fit.dropout_head_dims[pass] == Approx(shipped.dropout_head_dims[pass]).margin(1.0));
    CHECK(fit.mask_head_dims[pass] == Approx(shipped.mask_head_dims[pass]).margin(1.0));
    CHECK(fit.block_tile_head_dims[pass] == Approx(shipped.block_tile_head_dims[pass]).margin(3.0));
  }
  CHECK(fit.mask_setup_s == Approx(shipped.mask_setup_s).epsilon(0.02));
  CHECK(fit.dropout_setup_s == Approx(shipped.dropout_setup_s).epsilon(0.05));
}

TEST_CASE("FlashAttention-2's measured kernels fit the same form at a lower rate",
          "[gemm][attention]") {
  const std::vector<bench::AttentionRow> rows = measured_rows("flash");
  REQUIRE(rows.size() == 66);
  const costmodel::GemmDevice d = h200_bf16();
  const bench::PassFit f = bench::fit_attention_pass(rows, false, d);
  const bench::PassFit b = bench::fit_attention_pass(rows, true, d);
  // docs/cost-model.md: 0.43 forward, 0.34 backward; exponential 13.5, dropout 24.7 head
  // dimensions forward.
  CHECK(f.efficiency == Approx(0.43).margin(0.005));
  CHECK(b.efficiency == Approx(0.34).margin(0.005));
  CHECK(f.exp_head_dims == Approx(13.5).margin(0.5));
  CHECK(f.dropout_head_dims == Approx(24.7).margin(0.5));
  const costmodel::FusedAttentionFit fit = bench::kernel_fit(f, b);
  CHECK(bench::median_abs_error(rows, false, d, f.efficiency, fit) < 0.03);
  CHECK(bench::median_abs_error(rows, true, d, f.efficiency, fit) < 0.035);
}
