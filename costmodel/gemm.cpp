#include "costmodel/gemm.hpp"

#include <algorithm>
#include <cmath>

namespace loom::costmodel {

bool operands_aligned(double n, double k, int alignment_elements) {
  if (alignment_elements <= 0) return true;
  auto whole_vectors = [alignment_elements](double v) {
    return v == std::round(v) && std::fmod(v, alignment_elements) == 0;
  };
  return whole_vectors(n) && whole_vectors(k);
}

GemmTime gemm_time(const GemmShape& x, const GemmDevice& d, const GemmFit& fit) {
  const double sms = d.sm_count;
  const double rate = x.unaligned && d.alignment_elements > 0 ? fit.unaligned_rate_fraction : 1.0;
  // An SM's share of the rate, or of the device's achievable ceiling where that is higher: the
  // ceiling is the best product measured, so the SMs must be able to reach it.
  const double sm_rate =
      std::max(d.peak_flops_per_s * fit.sm_rate_fraction, d.ceiling_flops_per_s) * rate / sms;
  GemmTime best;
  double best_compute_s = -1;
  for (const TileShape& tile : kTileShapes) {
    const double tiles = x.batch * std::ceil(x.m / tile.m) * std::ceil(x.n / tile.n);
    const double waves = std::ceil(tiles / sms);
    const double efficiency = tile.m * tile.n >= 128 * 128 ? 1.0 : fit.small_tile_efficiency;
    const double tile_s =
        2.0 * tile.m * tile.n * (x.k + fit.prologue_k * d.prologue_scale) / (sm_rate * efficiency);
    const double compute_s = waves * tile_s;
    if (best_compute_s < 0 || compute_s < best_compute_s) {
      best_compute_s = compute_s;
      best.tile = tile;
      best.tiles = static_cast<std::int64_t>(tiles);
      best.waves = static_cast<std::int64_t>(waves);
    }
  }
  const double compute_s = std::max(best_compute_s, x.flops() / (d.ceiling_flops_per_s * rate));
  const double memory_s = x.bytes(d.element_bytes) / d.memory_bytes_per_s;
  best.memory_bound = memory_s > compute_s;
  best.time_s = fit.fixed_s + std::max(compute_s, memory_s);
  return best;
}

double gemm_efficiency(const GemmShape& x, const GemmDevice& d, const GemmFit& fit) {
  return x.flops() / gemm_time(x, d, fit).time_s / d.peak_flops_per_s;
}

double fused_attention_time_s(const FusedAttentionWork& w, const GemmDevice& d, double efficiency,
                              const GemmFit& fit, const FusedAttentionFit& kernel) {
  const double rate = d.peak_flops_per_s * efficiency;
  if (d.sm_count <= 0 || w.blocks <= 0) return w.flops / rate;
  const int pass = w.backward ? 1 : 0;
  // FLOPs per score element per head dimension: 4 forward (two products of 2 each), 2.5 times
  // that backward at its own rate.
  const double per_dim = w.backward ? 4 * 2.5 / kernel.backward_rate : 4;
  const double dims = w.head_dim + kernel.exp_head_dims[pass] +
                      (w.dropout ? kernel.dropout_head_dims[pass] : 0) +
                      (w.mask ? kernel.mask_head_dims[pass] : 0);
  const double work =
      per_dim * (w.elements * dims + w.blocks * 128 * 128 * kernel.block_tile_head_dims[pass]);
  const double sms = d.sm_count;
  const double waves = std::ceil(w.blocks / sms);
  // Each block does work / blocks at one SM's share of the rate; a partial last wave costs a
  // whole one.
  const double setup_s =
      w.backward ? 0
                 : (w.mask ? kernel.mask_setup_s : 0) + (w.dropout ? kernel.dropout_setup_s : 0);
  return fit.fixed_s + setup_s + waves * (work / w.blocks) / (rate / sms);
}

}  // namespace loom::costmodel
