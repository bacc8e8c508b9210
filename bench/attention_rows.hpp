// Fused-attention kernel times measured by bench/gpu_layers.py (groups "attention" and
// "encoder" of its JSON), in the cost model's terms, and a least-squares fit of the kernel's
// constants (costmodel::FusedAttentionFit) to them. bench_attention prints the check and the fit;
// tests/lab/test_attention_rows.cpp holds the model to the measured rows. Both time a row
// with costmodel::fused_attention_time_s, so the formula has one home.
//
// A row's kernel runs one thread block per 128 queries of each (sample, head), each walking the
// 128 x 128 score tiles its queries see: all of them, or those on and under the diagonal for a
// causal kernel (what the measured kernels do; the estimate of a causal decoder charges the
// whole grid, costmodel/compute.hpp).
#pragma once

#include <array>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "costmodel/gemm.hpp"
#include "lab/published_rows.hpp"

namespace loom::bench {

struct AttentionRow {
  std::string backend;  // SDPA's: default, cudnn, flash, efficient
  double heads = 0;     // samples x heads
  double seq = 0;
  double head_dim = 0;
  bool causal = false;
  bool dropout = false;
  bool mask = false;
  std::array<double, 2> time_s = {0, 0};  // forward, backward (device time)
};

// The rows of one bench/gpu_layers.py output that timed an attention kernel; rows that failed
// (an "error" key, a backend that refused the shape) are left out. Throws std::runtime_error
// naming the file when it cannot be read.
inline std::vector<AttentionRow> read_attention_rows(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": cannot open");
  const nlohmann::json doc = nlohmann::json::parse(in, nullptr, false);
  if (doc.is_discarded() || !doc.contains("rows")) {
    throw std::runtime_error(path + ": expected bench/gpu_layers.py's JSON with a \"rows\" array");
  }
  std::vector<AttentionRow> rows;
  for (const nlohmann::json& r : doc["rows"]) {
    const std::string group = r.value("group", "");
    if ((group != "attention" && group != "encoder") || r.contains("error")) continue;
    AttentionRow a;
    a.backend = r.at("backend").get<std::string>();
    a.heads = r.at("batch").get<double>() * r.at("heads").get<double>();
    a.seq = r.at("seq").get<double>();
    a.head_dim = r.at("head_dim").get<double>();
    a.causal = r.value("causal", false);
    a.dropout = r.value("dropout", 0.0) > 0;
    a.mask = r.value("mask", false);
    a.time_s = {r.at("forward_s").get<double>(), r.at("backward_s").get<double>()};
    rows.push_back(a);
  }
  return rows;
}

// The work of one pass of a row's kernel.
inline costmodel::FusedAttentionWork attention_work(const AttentionRow& r, bool backward) {
  const double tiles = std::ceil(r.seq / 128);
  const double walked = r.causal ? tiles * (tiles + 1) / 2 : tiles * tiles;
  costmodel::FusedAttentionWork w;
  w.blocks = r.heads * tiles;
  w.elements = r.heads * walked * 128 * 128;
  w.head_dim = r.head_dim;
  w.backward = backward;
  w.dropout = r.dropout;
  w.mask = r.mask;
  return w;
}

// The rate of one pass's products and its FusedAttentionFit constants, as fitted.
struct PassFit {
  double efficiency = 0;  // of `device.peak_flops_per_s`; backward: already times backward_rate
  double exp_head_dims = 0, dropout_head_dims = 0, mask_head_dims = 0, block_tile_head_dims = 0;
  double mask_setup_s = 0, dropout_setup_s = 0;  // forward only
};

// The pass's time of `w`, fixed_s aside, as a linear function of the fit's unknowns (u =
// 1 / efficiency, u x the exponential's, dropout's, mask's and per-block head dimensions, the
// mask's and dropout's setup times): each coefficient is what one unit of that unknown adds to
// fused_attention_time_s itself, so the fit reads the formula from its one home.
inline std::array<double, 7> attention_design_row(const costmodel::FusedAttentionWork& w,
                                                  const costmodel::GemmDevice& device) {
  const int pass = w.backward ? 1 : 0;
  costmodel::FusedAttentionFit none;
  none.exp_head_dims = none.dropout_head_dims = none.mask_head_dims = {0, 0};
  none.block_tile_head_dims = {0, 0};
  none.backward_rate = 1;
  none.mask_setup_s = none.dropout_setup_s = 0;
  auto time_s = [&](const costmodel::FusedAttentionFit& k) {
    return costmodel::fused_attention_time_s(w, device, 1.0, {}, k);
  };
  const double base_s = time_s(none);
  auto unit = [&](auto set) {
    costmodel::FusedAttentionFit k = none;
    set(k);
    return time_s(k) - base_s;
  };
  return {base_s - costmodel::GemmFit{}.fixed_s,
          unit([&](auto& k) { k.exp_head_dims[pass] = 1; }),
          unit([&](auto& k) { k.dropout_head_dims[pass] = 1; }),
          unit([&](auto& k) { k.mask_head_dims[pass] = 1; }),
          unit([&](auto& k) { k.block_tile_head_dims[pass] = 1; }),
          unit([](auto& k) { k.mask_setup_s = 1; }),
          unit([](auto& k) { k.dropout_setup_s = 1; })};
}

// Least squares on relative error of one pass over `rows` (attention_design_row: the normal
// equations give every unknown at once). Unknowns no row informs (no dropout, no mask) come out
// 0.
inline PassFit fit_attention_pass(const std::vector<AttentionRow>& rows, bool backward,
                                  const costmodel::GemmDevice& device) {
  constexpr int kUnknowns = 7;
  std::array<std::array<double, kUnknowns + 1>, kUnknowns> normal{};
  for (const AttentionRow& r : rows) {
    std::array<double, kUnknowns> a = attention_design_row(attention_work(r, backward), device);
    const double t = r.time_s[backward ? 1 : 0];
    // Relative error: each equation a x = t - fixed_s divided by t.
    for (double& v : a) v /= t;
    const double y = (t - costmodel::GemmFit{}.fixed_s) / t;
    for (int i = 0; i < kUnknowns; ++i) {
      for (int j = 0; j < kUnknowns; ++j) normal[i][j] += a[i] * a[j];
      normal[i][kUnknowns] += a[i] * y;
    }
  }
  // Gauss-Jordan elimination in the unknowns' order. An unknown the rows do not inform, alone
  // (no dropout rows) or apart from the ones before it (every row of one head dimension leaves
  // the exponential's cost inseparable from the rate), is pinned to 0.
  std::array<double, kUnknowns> scale{};
  for (int i = 0; i < kUnknowns; ++i) scale[i] = normal[i][i];
  for (int col = 0; col < kUnknowns; ++col) {
    if (!(std::abs(normal[col][col]) > 1e-9 * scale[col])) {
      for (int j = 0; j <= kUnknowns; ++j) normal[col][j] = 0;
      for (int i = 0; i < kUnknowns; ++i) normal[i][col] = 0;
      normal[col][col] = 1;
      continue;
    }
    for (int i = 0; i < kUnknowns; ++i) {
      if (i == col) continue;
      const double f = normal[i][col] / normal[col][col];
      for (int j = col; j <= kUnknowns; ++j) normal[i][j] -= f * normal[col][j];
    }
  }
  std::array<double, kUnknowns> x{};
  for (int i = 0; i < kUnknowns; ++i) x[i] = normal[i][kUnknowns] / normal[i][i];
  PassFit f;
  f.efficiency = 1 / x[0];
  f.exp_head_dims = x[1] / x[0];
  f.dropout_head_dims = x[2] / x[0];
  f.mask_head_dims = x[3] / x[0];
  f.block_tile_head_dims = x[4] / x[0];
  f.mask_setup_s = x[5];
  f.dropout_setup_s = x[6];
  return f;
}

// The kernel constants of a forward and a backward PassFit: the forward's rate is the kernel's
// efficiency, the backward's over it is backward_rate.
inline costmodel::FusedAttentionFit kernel_fit(const PassFit& forward, const PassFit& backward) {
  costmodel::FusedAttentionFit k;
  k.exp_head_dims = {forward.exp_head_dims, backward.exp_head_dims};
  k.dropout_head_dims = {forward.dropout_head_dims, backward.dropout_head_dims};
  k.mask_head_dims = {forward.mask_head_dims, backward.mask_head_dims};
  k.block_tile_head_dims = {forward.block_tile_head_dims, backward.block_tile_head_dims};
  k.backward_rate = backward.efficiency / forward.efficiency;
  k.mask_setup_s = forward.mask_setup_s;
  k.dropout_setup_s = forward.dropout_setup_s;
  return k;
}

// The median of |model / measured - 1| of one pass over `rows` (0 without rows).
inline double median_abs_error(const std::vector<AttentionRow>& rows, bool backward,
                               const costmodel::GemmDevice& device, double efficiency,
                               const costmodel::FusedAttentionFit& kernel = {}) {
  std::vector<double> e;
  for (const AttentionRow& r : rows) {
    const double t = costmodel::fused_attention_time_s(attention_work(r, backward), device,
                                                       efficiency, {}, kernel);
    e.push_back(std::abs(t / r.time_s[backward ? 1 : 0] - 1));
  }
  return published::median(e).value_or(0);
}

}  // namespace loom::bench
