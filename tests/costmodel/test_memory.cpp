#include <catch2/catch.hpp>

#include "costmodel/memory.hpp"

using namespace loom::costmodel;

TEST_CASE("ZeRO Table 1: model states of a 7.5B model with dp = 64", "[memory][zero]") {
  // Rajbhandari et al. 2020, Table 1 (K = 12, Psi = 7.5B, Nd = 64), in GB (1e9 bytes).
  const double psi = 7.5e9;
  auto gb = [&](int dp, int zero) {
    return model_state_bytes(psi, dp, zero, Precision::kBf16).total() / 1e9;
  };
  CHECK(gb(1, 0) == Approx(120).epsilon(0.01));
  CHECK(gb(64, 0) == Approx(120).epsilon(0.01));
  CHECK(gb(64, 1) == Approx(31.4).epsilon(0.01));
  CHECK(gb(64, 2) == Approx(16.6).epsilon(0.01));
  CHECK(gb(64, 3) == Approx(1.88).epsilon(0.01));
}

TEST_CASE("model states by kind under each ZeRO stage", "[memory][zero]") {
  ModelStateBytes z0 = model_state_bytes(1e9, 8, 0, Precision::kFp16);
  CHECK(z0.parameter_bytes == 2e9);
  CHECK(z0.gradient_bytes == 2e9);
  CHECK(z0.optimizer_bytes == 12e9);
  ModelStateBytes z3 = model_state_bytes(1e9, 8, 3, Precision::kFp16);
  CHECK(z3.parameter_bytes == 2e9 / 8);
  CHECK(z3.gradient_bytes == 2e9 / 8);
  CHECK(z3.optimizer_bytes == 12e9 / 8);
  // fp32 Adam keeps no master copy: 4 + 4 + 8 bytes.
  CHECK(model_state_bytes(1e9, 1, 0, Precision::kFp32).total() == 16e9);
}

TEST_CASE("micro-batches in flight per schedule", "[memory][pipeline]") {
  CHECK(activation_micro_batches_in_flight(Schedule::kGpipe, 4, 0, 16, 1) == 16);
  CHECK(activation_micro_batches_in_flight(Schedule::kGpipe, 4, 3, 16, 1) == 16);
  CHECK(activation_micro_batches_in_flight(Schedule::k1F1B, 4, 0, 16, 1) == 4);
  CHECK(activation_micro_batches_in_flight(Schedule::k1F1B, 4, 3, 16, 1) == 1);
  CHECK(activation_micro_batches_in_flight(Schedule::k1F1B, 4, 0, 2, 1) == 2);
  // Korthikanti et al. section 4.2.3: the first stage of an interleaved schedule holds
  // p (1 + (p - 1)/(p v)) micro-batches' worth of activations.
  for (int p : {2, 4, 8}) {
    for (int v : {2, 3, 4}) {
      double expected = p * (1 + (p - 1.0) / (p * v));
      CHECK(activation_micro_batches_in_flight(Schedule::kInterleaved, p, 0, 64, v) ==
            Approx(expected).epsilon(1e-12));
    }
  }
}
