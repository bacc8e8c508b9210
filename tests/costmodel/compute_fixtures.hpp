// Devices and models the compute-time tests share: an H100 at its boost clock, the GEMM fit's
// constants the hand computations use, a device of identical SMs, and a Llama of any size.
#pragma once

#include <cstdint>

#include "costmodel/gemm.hpp"
#include "profiles/cluster.hpp"
#include "profiles/loader.hpp"
#include "profiles/model_spec.hpp"

namespace loom::costmodel::test {

// dgx-h100's device on its datasheet values at the boost clock: the short benchmarks behind the
// GEMM fit and the measured ceilings ran there, before the power limit lowers the clock (the
// file's sustained_clock_fraction, which a long training run holds).
inline profiles::DeviceSpec h100_at_boost() {
  profiles::DeviceSpec d = profiles::datasheet_cluster(profiles::load_cluster("dgx-h100")).device;
  d.sustained_clock_fraction.reset();
  return d;
}

// The constants the hand computations below are written with (fixed 5.5 us, prologue 160 steps
// of k, an SM at 0.89 of its share of the peak, small tiles at 0.8, unaligned products at 0.35):
// those tests check the mechanism whatever the fitted values (GemmFit{}) are.
inline const GemmFit kHand{5.5e-6, 160, 0.89, 0.8, 0.35};

// A device whose SMs each run at 1.78e12 FLOP/s (peak x 0.89 / sm_count = 2e12 x 0.89), with a
// ceiling (0.85 of the peak, under the SMs' 0.89) and a memory bandwidth that never bind.
inline GemmDevice per_sm_device(int sms) {
  GemmDevice d;
  d.sm_count = sms;
  d.peak_flops_per_s = sms * 2e12;
  d.ceiling_flops_per_s = 0.85 * d.peak_flops_per_s;
  d.memory_bytes_per_s = 1e15;
  d.element_bytes = 2;
  return d;
}

inline profiles::ModelSpec llama(std::int64_t layers, std::int64_t hidden, std::int64_t heads,
                                 std::int64_t kv_heads, std::int64_t ffn) {
  profiles::ModelSpec m;
  m.name = "llama";
  m.family = profiles::Family::kDecoder;
  m.model_type = profiles::ModelType::kGpt2;
  m.layers = layers;
  m.hidden = hidden;
  m.heads = heads;
  m.kv_heads = kv_heads;
  m.ffn_hidden = ffn;
  m.vocab = 32000;
  m.max_positions = 4096;
  m.tied_embeddings = false;
  m.gated_mlp = true;
  return m;
}

}  // namespace loom::costmodel::test
