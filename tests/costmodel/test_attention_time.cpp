// Attention's time and kept bytes: the unfused math, fused (flash) kernels, causal decoders.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <nlohmann/json.hpp>
#include <vector>

#include "costmodel/compute.hpp"
#include "costmodel/estimate.hpp"
#include "costmodel/gemm.hpp"
#include "costmodel/layers.hpp"
#include "costmodel/runtime.hpp"
#include "profiles/cluster.hpp"
#include "profiles/errors.hpp"
#include "profiles/loader.hpp"
#include "tests/costmodel/compute_fixtures.hpp"

using namespace loom;
using namespace loom::costmodel;
using namespace loom::costmodel::test;

TEST_CASE("flash attention keeps no scores and recomputes them backward", "[gemm][attention]") {
  // Korthikanti's s^2 term: with e = 2 the kept scores are (2e + 1) a s^2 b / t = 5as/h x sbh/t.
  ActivationShape x{2048, 1, 12288, 96, 4 * 12288, 2};
  const double s = 2048, b = 1, a = 96, t = 8;
  const double math = transformer_layer_activation_bytes(x, 8, false, Recompute::kNone, true);
  const double flash = transformer_layer_activation_bytes(x, 8, false, Recompute::kNone, false);
  CHECK(math - flash == Approx(5 * a * s * s * b / t));
  // Forward FLOPs 4 b s^2 h; flash halves them for a causal decoder and charges 2.5x backward.
  const profiles::ModelSpec gpt = profiles::load_model("gpt3-175b");
  const double full = 4.0 * 1 * 2048 * 2048 * 12288;
  CHECK(attention_forward_flops(gpt, 1, 2048, Attention::kMath) == Approx(full));
  CHECK(attention_backward_flops(gpt, 1, 2048, Attention::kMath) == Approx(2 * full));
  CHECK(attention_forward_flops(gpt, 1, 2048, Attention::kFlash) == Approx(full / 2));
  CHECK(attention_backward_flops(gpt, 1, 2048, Attention::kFlash) == Approx(2.5 * full / 2));
  const profiles::ModelSpec bert = profiles::load_model("bert-large");
  const double enc = 4.0 * 8 * 512 * 512 * 1024;
  CHECK(attention_backward_flops(bert, 8, 512, Attention::kFlash) == Approx(2.5 * enc));
}

TEST_CASE("flash attention's time: waves of 128-query blocks at its efficiency",
          "[gemm][attention]") {
  const profiles::ModelSpec bert = profiles::load_model("bert-large");
  DeviceRates r =
      device_rates(profiles::datasheet_cluster(profiles::load_cluster("dgx-a100-80g")).device,
                   Precision::kBf16, EfficiencyDefaults{});
  LayerShape flash{8, 512, 1, 2, Recompute::kSelective};
  flash.attention = Attention::kFlash;
  LayerShape math = flash;
  math.attention = Attention::kMath;
  const LayerTime f = transformer_layer_time(bert, flash, r);
  const LayerTime m = transformer_layer_time(bert, math, r);
  // Selective recomputation repeats nothing with flash; math repeats the attention core.
  CHECK(f.recompute_s == 0);
  CHECK(m.recompute_s > 0);
  // The fused kernel alone: 8 x 16 heads x 4 blocks of 128 queries = 512 blocks, 5 waves on 108
  // SMs, each block walking 4 tiles of 128 x 128 scores: 3.3554e7 elements. Forward, per element
  // 4 FLOPs per head dimension over 64 + 43.6 (exp) + 175 (dropout) + 58.9 (mask) = 341.5, and
  // 139 per block per tile of scores: 4 x (3.3554e7 x 341.5 + 512 x 16384 x 139) = 5.0500e10,
  // at 0.65 x 312e12 over 512 blocks: 5 x (5.0500e10 / 512) / (202.8e12 / 108) = 262.63 us,
  // + 5.5 us fixed + 12.9 us (the mask's setup) + 2.3 us (the dropout's) = 283.33 us.
  const GemmDevice d = r.gemm;
  FusedAttentionWork w;
  w.flops = attention_forward_flops(bert, 8, 512, Attention::kFlash);
  w.blocks = 512;
  w.elements = 8 * 16 * 4 * 4 * 128 * 128;
  w.head_dim = 64;
  w.dropout = true;
  w.mask = true;
  CHECK(fused_attention_time_s(w, d, 0.65, kHand) == Approx(283.3287e-6).epsilon(1e-5));
  // Backward: 2.5 x 4 FLOPs per head dimension at 0.663 of forward's rate, over 64 + 5.3 + 26.5
  // + 40.5 = 136.3 per element and 367 per block, no setup: 605.74 us.
  w.backward = true;
  CHECK(fused_attention_time_s(w, d, 0.65, kHand) == Approx(605.7363e-6).epsilon(1e-5));
  // On a CPU (no SMs) the counted FLOPs at the rate: 4 x 8 x 512^2 x 1024 / 202.8e12.
  GemmDevice cpu = d;
  cpu.sm_count = 0;
  w.backward = false;
  CHECK(fused_attention_time_s(w, cpu, 0.65, kHand) == Approx(8589934592.0 / 202.8e12));
}

TEST_CASE("fused attention on an H200 against its measured kernel times", "[gemm][attention]") {
  // cuDNN's fused attention as Loom's executor calls it (bf16, dropout 0.1, a key-padding
  // mask), BERT-base shapes at 8192 tokens, measured on an H200 (bench/gpu_layers.py, device
  // time; bench/RESULTS.md "Fused attention kernels on an H200"): forward and backward in us.
  // The kernel's rate is the fit's 0.893 of the peak at the sustained clock.
  const DeviceRates r =
      device_rates(profiles::datasheet_cluster(profiles::load_cluster("h200-x1")).device,
                   Precision::kBf16, EfficiencyDefaults{});
  struct Point {
    double seq, forward_us, backward_us;
  };
  for (const Point& p :
       {Point{128, 48.7, 126.9}, Point{512, 117.1, 231.1}, Point{2048, 394.7, 659.9}}) {
    const double tiles = p.seq / 128;
    const double heads = 8192 / p.seq * 12;
    FusedAttentionWork w;
    w.blocks = heads * tiles;
    w.elements = heads * tiles * tiles * 128 * 128;
    w.head_dim = 64;
    w.dropout = true;
    w.mask = true;
    CAPTURE(p.seq);
    CHECK(fused_attention_time_s(w, r.gemm, 0.893) * 1e6 == Approx(p.forward_us).epsilon(0.1));
    w.backward = true;
    CHECK(fused_attention_time_s(w, r.gemm, 0.893) * 1e6 == Approx(p.backward_us).epsilon(0.1));
  }
}

TEST_CASE("a causal decoder's fused attention is timed over the whole score grid",
          "[gemm][attention]") {
  const profiles::ModelSpec gpt2 = profiles::load_model("gpt2");
  CHECK(causal_attention_time_scale(gpt2) == 2);
  CHECK(causal_attention_time_scale(profiles::load_model("bert-large")) == 1);
  const DeviceRates r =
      device_rates(profiles::datasheet_cluster(profiles::load_cluster("dgx-a100-80g")).device,
                   Precision::kBf16, EfficiencyDefaults{});
  REQUIRE(r.gpu);
  // GPT-2 at b = 8, s = 1024: the causal kernel counts 4 x 8 x 1024^2 x 768 / 2 = 1.2885e10
  // FLOPs forward, but its 8 x 12 heads x 8 blocks of 128 queries = 768 blocks (8 waves on 108
  // SMs) are timed walking all 64 tiles of each head: 96 x 64 x 16384 = 1.0066e8 elements, no
  // dropout, no mask. Forward 4 x (1.0066e8 x (64 + 43.6) + 768 x 16384 x 139) = 5.0321e10 at
  // 0.65 x 312e12: 8 x (5.0321e10 / 768) / (202.8e12 / 108) = 279.15 us, + 5.5 us = 284.65 us.
  const double causal_flops = attention_forward_flops(gpt2, 8, 1024, Attention::kFlash);
  CHECK(causal_flops == Approx(1.2885e10).epsilon(1e-4));
  FusedAttentionWork w;
  w.flops = causal_flops;
  w.blocks = 768;
  w.elements = 96 * 64 * 128 * 128;
  w.head_dim = 64;
  CHECK(fused_attention_time_s(w, r.gemm, 0.65, kHand) == Approx(284.6508e-6).epsilon(1e-5));
  // So the decoder's layer takes the encoder's time less the encoder's dropout (the same grid,
  // full-length sequences: no padding mask), forward and backward; on CPUs the causal half's
  // FLOPs.
  profiles::ModelSpec encoder = gpt2;
  encoder.family = profiles::Family::kEncoder;
  LayerShape x{8, 1024, 1, 2, Recompute::kNone};
  x.attention = Attention::kFlash;
  const LayerTime dec = transformer_layer_time(gpt2, x, r);
  const LayerTime enc = transformer_layer_time(encoder, x, r);
  GemmDevice d = r.gemm;
  FusedAttentionWork dropped = w;
  dropped.flops = 2 * causal_flops;
  dropped.dropout = true;
  CHECK(enc.forward_s - dec.forward_s ==
        Approx(fused_attention_time_s(dropped, d, r.attention_efficiency) -
               fused_attention_time_s(w, d, r.attention_efficiency))
            .epsilon(1e-9));
  dropped.backward = w.backward = true;
  CHECK(enc.backward_s - dec.backward_s ==
        Approx(fused_attention_time_s(dropped, d, r.attention_efficiency) -
               fused_attention_time_s(w, d, r.attention_efficiency))
            .epsilon(1e-9));
  const DeviceRates cpu = device_rates(profiles::load_cluster("local-cpu").device, Precision::kFp32,
                                       EfficiencyDefaults{});
  CHECK_FALSE(cpu.gpu);
  CHECK(transformer_layer_time(gpt2, x, cpu).forward_s <
        transformer_layer_time(encoder, x, cpu).forward_s);
}

TEST_CASE("the plan's attention kernel drives the kept scores", "[gemm][attention]") {
  const CostModel cost(profiles::load_model("bert-large"),
                       profiles::datasheet_cluster(profiles::load_cluster("dgx-a100-80g")));
  const Job job{64, 512, Precision::kBf16, "adamw"};
  Strategy math;
  math.dp = 8;
  math.micro_batch = 8;
  Strategy flash = math;
  flash.attention = Attention::kFlash;
  // Under Loom's autocast one layer keeps (4 + 1 + e) a s^2 b = 7 x 16 x 512^2 x 8 =
  // 234,881,024 bytes of scores with math attention (softmax's output in fp32, the dropout mask,
  // the dropout output cast back to bf16) and none with flash; Megatron-LM, all bf16, keeps
  // (2e + 1) a s^2 b = 167,772,160.
  const double kept = cost.step_terms(job, math).costs.layer.activation_bytes -
                      cost.step_terms(job, flash).costs.layer.activation_bytes;
  CHECK(kept == Approx(234881024.0));
  Job megatron = job;
  megatron.runtime = Runtime::kMegatron;
  CHECK(cost.step_terms(megatron, math).costs.layer.activation_bytes -
            cost.step_terms(megatron, flash).costs.layer.activation_bytes ==
        Approx(167772160.0));
  // The cost option that drops the scores still applies to math.
  CostOptions no_scores;
  no_scores.attention_scores = false;
  const CostModel fused(profiles::load_model("bert-large"),
                        profiles::datasheet_cluster(profiles::load_cluster("dgx-a100-80g")),
                        no_scores);
  CHECK(fused.step_terms(job, math).costs.layer.activation_bytes ==
        Approx(cost.step_terms(job, flash).costs.layer.activation_bytes));
}

TEST_CASE("hardware FLOPs count flash's recomputed scores", "[gemm][attention][flops]") {
  // GPT-3 175B, 8 samples of 2048: the attention core is 4 x 8 x 2048^2 x 12288 = 1.649e15
  // FLOPs per layer forward. Flash's backward adds half of it per layer (2.5x instead of 2x);
  // selective recomputation adds the whole core with math and nothing more with flash.
  const profiles::ModelSpec gpt = profiles::load_model("gpt3-175b");
  const double core = 4.0 * 8 * 2048 * 2048 * 12288;
  const double model = model_flops_per_step(gpt, 8, 2048);
  const double l = 96;
  CHECK(hardware_flops_per_step(gpt, 8, 2048, Recompute::kNone, Attention::kFlash) ==
        Approx(model + l * core / 2));
  CHECK(hardware_flops_per_step(gpt, 8, 2048, Recompute::kSelective, Attention::kMath) ==
        Approx(model + l * core));
  CHECK(hardware_flops_per_step(gpt, 8, 2048, Recompute::kSelective, Attention::kFlash) ==
        Approx(model + l * core / 2));
}
