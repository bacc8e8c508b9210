// Elementwise kernels as each runtime launches them, autocast's traffic, the host floor, and
// torch.compile's fusions.
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

TEST_CASE("sequence parallelism divides LayerNorm, dropout and residual work by tp", "[gemm]") {
  const profiles::ModelSpec gpt = profiles::load_model("gpt3-175b");
  const DeviceRates r =
      device_rates(profiles::datasheet_cluster(profiles::load_cluster("dgx-a100-80g")).device,
                   Precision::kBf16, EfficiencyDefaults{});
  LayerShape x{1, 2048, 8, 2, Recompute::kNone};
  LayerShape sp = x;
  sp.sequence_parallel = true;
  // Two residual blocks of dropout ((2e + 1) n), add (3e n) and LayerNorm (2e n) bytes, 15 n
  // with e = 2, n = b s h = 25,165,824; at 2039 x 0.8 GB/s. With sp n is 1/8 as large (each
  // kernel still above the 5 us launch floor): forward saves 2 x 15 x n x 7/8 / 1631.2e9.
  const double saved = 2 * 15 * 25165824.0 * 7 / 8 / 1631.2e9;
  const double fwd = transformer_layer_time(gpt, x, r).forward_s;
  const double fwd_sp = transformer_layer_time(gpt, sp, r).forward_s;
  CHECK(fwd - fwd_sp == Approx(saved).epsilon(1e-9));
  CHECK(saved == Approx(404.95e-6).epsilon(1e-4));
}

TEST_CASE("Megatron's fusions launch fewer elementwise kernels", "[gemm]") {
  const profiles::ModelSpec bert = profiles::load_model("bert-large");
  const DeviceRates r =
      device_rates(profiles::datasheet_cluster(profiles::load_cluster("dgx-a100-80g")).device,
                   Precision::kBf16, EfficiencyDefaults{});
  LayerShape loom{8, 512, 1, 2, Recompute::kNone};
  LayerShape megatron = loom;
  megatron.fusions = KernelFusions::megatron();
  megatron.fusions.fused_qkv = false;  // the same products: only elementwise kernels differ
  // Scores: 16 x 8 x 512^2 = 33,554,432; eager scale, mask and softmax move 3 x 4 bytes each
  // where the fused kernel moves 4: 8 x 33,554,432 bytes less forward, at 1631.2 GB/s. The
  // residual blocks: dropout + add (5 n + 6 n) against bias-dropout-add (7 n), n = 4,194,304,
  // 2 x 4 n bytes less. Every kernel is above the 5 us launch floor.
  const double saved = (8 * 33554432.0 + 2 * 4 * 4194304.0) / 1631.2e9;
  const LayerTime a = transformer_layer_time(bert, loom, r);
  const LayerTime b = transformer_layer_time(bert, megatron, r);
  CHECK(a.forward_s - b.forward_s == Approx(saved).epsilon(1e-9));
  CHECK(saved == Approx(185.13e-6).epsilon(1e-4));
}

TEST_CASE("autocast's fp32 stream, softmax and casts are memory traffic", "[gemm][autocast]") {
  const profiles::ModelSpec bert = profiles::load_model("bert-large");
  const DeviceRates r =
      device_rates(profiles::datasheet_cluster(profiles::load_cluster("dgx-a100-80g")).device,
                   Precision::kBf16, EfficiencyDefaults{});
  LayerShape half{8, 512, 1, 2, Recompute::kNone};
  LayerShape autocast = half;
  autocast.autocast = true;
  // Per element, forward (e = 2, fp32 = 4): the layer's input and the MLP's input cast down
  // (6 n each, new); each residual block's add to the fp32 stream (2 + 8 against 6) and fp32
  // LayerNorm (8 against 4): 8 n more, twice; the scores' mask (5 against 4), cast up (6),
  // softmax in fp32 (8 against 4) and its dropout (9 against 5), cast down (6): 21 S more.
  // n = 8 x 512 x 1024 = 4,194,304, S = 16 x 8 x 512^2 = 33,554,432, at 1631.2 GB/s; every
  // kernel above the 5 us launch floor, backward moving twice each forward kernel's bytes.
  const double more = (28 * 4194304.0 + 21 * 33554432.0) / 1631.2e9;
  const LayerTime a = transformer_layer_time(bert, half, r);
  const LayerTime b = transformer_layer_time(bert, autocast, r);
  CHECK(b.forward_s - a.forward_s == Approx(more).epsilon(1e-9));
  CHECK(b.backward_s - a.backward_s == Approx(2 * more).epsilon(1e-9));
  CHECK(more == Approx(503.98e-6).epsilon(1e-4));
  // FlashAttention keeps the scores out: only the hidden-size terms remain.
  half.attention = autocast.attention = Attention::kFlash;
  CHECK(transformer_layer_time(bert, autocast, r).forward_s -
            transformer_layer_time(bert, half, r).forward_s ==
        Approx(28 * 4194304.0 / 1631.2e9).epsilon(1e-9));
}

TEST_CASE("Hugging Face's gelu_new runs as eight kernels eagerly and keeps three more tensors",
          "[gemm][activations]") {
  profiles::ModelSpec gpt2 = profiles::load_model("gpt2");
  REQUIRE(gpt2.activation == profiles::Activation::kGeluNew);
  profiles::ModelSpec one_kernel = gpt2;
  one_kernel.activation = profiles::Activation::kGelu;
  const DeviceRates r =
      device_rates(profiles::datasheet_cluster(profiles::load_cluster("dgx-a100-80g")).device,
                   Precision::kBf16, EfficiencyDefaults{});
  // n = b s f = 8 x 1024 x 3072 = 25,165,824 elements of 2 bytes. The chain moves 2, 2, 2, 3, 2,
  // 2, 2 and 3 tensors (18 x 2n bytes) where one GeLU moves 2 (4n): 32n = 805,306,368 bytes
  // more forward at 2039 x 0.8 GB/s, twice that backward. Its smallest kernel (100.7 MB) is far
  // above the 5 us launch floor.
  LayerShape x{8, 1024, 1, 2, Recompute::kNone};
  const double more = 32 * 25165824.0 / 1631.2e9;
  CHECK(more == Approx(493.69e-6).epsilon(1e-4));
  const LayerTime chain = transformer_layer_time(gpt2, x, r);
  const LayerTime one = transformer_layer_time(one_kernel, x, r);
  CHECK(chain.forward_s - one.forward_s == Approx(more).epsilon(1e-9));
  CHECK(chain.backward_s - one.backward_s == Approx(2 * more).epsilon(1e-9));
  // torch.compile and Megatron-LM fuse it into one kernel.
  for (const KernelFusions& f : {KernelFusions::compiled(), KernelFusions::megatron()}) {
    x.fusions = f;
    CHECK(transformer_layer_time(gpt2, x, r).forward_s ==
          transformer_layer_time(one_kernel, x, r).forward_s);
  }
  // Autograd keeps x, 0.5 x, tanh(.) and 1 + tanh(.) besides the output: 3 e s b f bytes more,
  // 3 x 2 x 1024 x 8 x 3072 = 150,994,944, as the estimate counts it for DeepSpeed's fp16 job.
  ActivationShape a{1024, 8, 768, 12, 3072, 2};
  ActivationShape a_chain = a;
  a_chain.activation_chain = true;
  CHECK(transformer_layer_activation_bytes(a_chain, 1, false, Recompute::kNone) -
            transformer_layer_activation_bytes(a, 1, false, Recompute::kNone) ==
        Approx(150994944.0).epsilon(1e-12));
  const profiles::Cluster cluster =
      profiles::datasheet_cluster(profiles::load_cluster("dgx-a100-80g"));
  Job job{64, 1024, Precision::kFp16, "adamw"};
  job.runtime = Runtime::kDeepspeed;
  Strategy s;
  s.dp = 8;
  s.micro_batch = 8;
  const double kept = CostModel(gpt2, cluster).step_terms(job, s).costs.layer.activation_bytes;
  CHECK(kept - CostModel(one_kernel, cluster).step_terms(job, s).costs.layer.activation_bytes ==
        Approx(150994944.0).epsilon(1e-12));
  job.compile = true;
  CHECK(CostModel(gpt2, cluster).step_terms(job, s).costs.layer.activation_bytes ==
        CostModel(one_kernel, cluster).step_terms(job, s).costs.layer.activation_bytes);
}

TEST_CASE("an eager runtime's passes take at least the host's issue of their kernels",
          "[gemm][host]") {
  // BERT-base, one sample of 8 tokens on an H100: every kernel is far shorter than its issue.
  const profiles::ModelSpec bert = profiles::load_model("bert-base");
  profiles::DeviceSpec device =
      profiles::datasheet_cluster(profiles::load_cluster("h100-x1")).device;
  device.host_launch_us = 10;
  device.host_pass_us = 1200;
  device.host_serial_fraction = 0;
  const DeviceRates r = device_rates(device, Precision::kBf16, EfficiencyDefaults{});
  LayerShape x{1, 8, 1, 2, Recompute::kFull};
  x.attention = Attention::kFlash;
  const LayerTime kernels = transformer_layer_time(bert, x, r);
  x.host_floor = true;
  x.stage_layers = 12;
  const LayerTime host = transformer_layer_time(bert, x, r);
  // 14 kernels forward (Q, K, V, attention, output, dropout, add, LayerNorm, up, GeLU, down,
  // dropout, add, LayerNorm) at 10 us, plus 1200 us / 12 layers: 240 us; backward 2.3 x 140 us
  // + 100 us = 422 us; full recomputation repeats the forward's 240 us.
  CHECK(kernels.forward_s < 100e-6);
  CHECK(host.forward_s == Approx(240e-6));
  CHECK(host.backward_s == Approx(422e-6));
  CHECK(host.recompute_s == Approx(240e-6));
  // The embedding (2 kernels) and the classifier head (4) carry no share of the pass.
  CHECK(embedding_time(bert, x, r).forward_s == Approx(20e-6));
  CHECK(embedding_time(bert, x, r).backward_s == Approx(46e-6));
  // Half of the shorter (the kernels) does not overlap the issue.
  device.host_serial_fraction = 0.5;
  const DeviceRates half = device_rates(device, Precision::kBf16, EfficiencyDefaults{});
  CHECK(transformer_layer_time(bert, x, half).forward_s ==
        Approx(240e-6 + 0.5 * kernels.forward_s));
  // A large micro-batch is bound by its kernels: the floor changes nothing.
  LayerShape big{64, 512, 1, 2, Recompute::kNone};
  big.attention = Attention::kFlash;
  const double kernels_s = transformer_layer_time(bert, big, r).forward_s;
  big.host_floor = true;
  big.stage_layers = 12;
  CHECK(transformer_layer_time(bert, big, r).forward_s == kernels_s);
  CHECK(transformer_layer_time(bert, big, half).forward_s ==
        Approx(kernels_s + 0.5 * (14 * 10e-6 + 100e-6)));
  // Without the shape model (no sm_count) the kernels are timed as fewer, but the host still
  // issues all 14.
  profiles::DeviceSpec roofline = device;
  roofline.sm_count = 0;
  roofline.host_serial_fraction = 0;
  const DeviceRates rr = device_rates(roofline, Precision::kBf16, EfficiencyDefaults{});
  CHECK(transformer_layer_time(bert, x, rr).forward_s == Approx(240e-6));
  // Loom's runtime has the floor; Megatron-LM's host is not modelled.
  CHECK(runtime_rules(Runtime::kLoom).host_floor);
  CHECK_FALSE(runtime_rules(Runtime::kMegatron).host_floor);
}

TEST_CASE("autocast keeps LayerNorm inputs and softmax outputs in fp32", "[gemm][activations]") {
  // BERT-base at s = 128, b = 8, bf16 under autocast: sbh (38 + 7as/h) = 786,432 x (38 + 7 x 12
  // x 128 / 768) = 786,432 x 52 = 40,894,464 bytes; without autocast Korthikanti's sbh (34 +
  // 5as/h) = 786,432 x 44 = 34,603,008; full recomputation keeps the fp32 input, 4 sbh.
  ActivationShape x{128, 8, 768, 12, 3072, 2};
  CHECK(transformer_layer_activation_bytes(x, 1, false, Recompute::kNone) == 34603008.0);
  x.autocast = true;
  CHECK(transformer_layer_activation_bytes(x, 1, false, Recompute::kNone) == 40894464.0);
  CHECK(transformer_layer_activation_bytes(x, 1, false, Recompute::kFull) == 4 * 786432.0);
  // Flash attention keeps no scores: 38 sbh.
  CHECK(transformer_layer_activation_bytes(x, 1, false, Recompute::kNone, false) == 38 * 786432.0);
}

TEST_CASE("torchtitan's per-operator selective policy keeps every other product's output",
          "[gemm][activations]") {
  // A Llama-3-8B layer (h 4096, f 14336, 32 heads, 8 key/value heads, gated MLP) at s = 8192,
  // b = 1, bf16, flash attention: the input, then of the products q, k, v, o, W1, W3, W2 the 1st,
  // 3rd, 5th and 7th outputs (q 4096, v 1024, W1 14336, W2 4096 wide), the attention kernel's
  // output and its fp32 log-sum-exp: 2 sb (4096 + 4096 + 1024 + 14336 + 4096 + 4096) +
  // 4 x 32 x 8192 = 521,142,272 bytes, 15.5 sbh against the attention-core policy's 36.
  ActivationShape x{8192, 1, 4096, 32, 14336, 2, 8, true};
  x.selective = SelectivePolicy::kOperators;
  CHECK(transformer_layer_activation_bytes(x, 1, false, Recompute::kSelective, false) ==
        521142272.0);
  x.selective = SelectivePolicy::kAttentionCore;
  CHECK(transformer_layer_activation_bytes(x, 1, false, Recompute::kSelective, false) ==
        36 * 8192 * 4096.0);
  // It recomputes the other products: GPT-2's k, o and MLP down, 2 b s (2 h^2 + f h) per layer,
  // 12 x 2 x 8 x 1024 x (2 x 768^2 + 3072 x 768) = 695,784,701,952 FLOPs per step of 8 samples.
  const profiles::ModelSpec gpt2 = profiles::load_model("gpt2");
  CHECK(hardware_flops_per_step(gpt2, 8, 1024, Recompute::kSelective, Attention::kFlash,
                                SelectivePolicy::kOperators) -
            hardware_flops_per_step(gpt2, 8, 1024, Recompute::kNone, Attention::kFlash) ==
        Approx(695784701952.0));
  CHECK(hardware_flops_per_step(gpt2, 8, 1024, Recompute::kSelective, Attention::kFlash) ==
        hardware_flops_per_step(gpt2, 8, 1024, Recompute::kNone, Attention::kFlash));
}

TEST_CASE("torch.compile fuses a Llama block's RMSNorm, rotary and SwiGLU chains",
          "[gemm][compile]") {
  // Llama-3-8B's layer (h 4096, 32 heads, 8 kv heads: k is 1024 wide; MLP 14336) at b = 1,
  // s = 4096 in bf16 on H100: T = 4096 tokens, n = T h = 16,777,216. The products are the same
  // eager and compiled; the elementwise bytes of the forward pass differ by
  //   two residual blocks: eager add 6n + RMSNorm (pow 8n, mean 4n, x * rsqrt 8n, * weight 4n,
  //     x.float() 6n, .type_as 6n) = 42n each, compiled 8n each: 68n = 1,140,850,688;
  //   rotary: eager 6 + 8 + 6 = 20 bytes per element of q (T h) and k (T x 1024), compiled 4:
  //     16 x 20,971,520 = 335,544,320;
  //   SwiGLU: eager SiLU 4 + product 6, compiled 6 bytes per element of T x 14336: 234,881,024;
  // 1,711,276,032 bytes in all; the backward pass moves twice as much.
  profiles::ModelSpec m = llama(32, 4096, 32, 8, 14336);
  const DeviceRates rates =
      device_rates(profiles::datasheet_cluster(profiles::load_cluster("dgx-h100")).device,
                   Precision::kBf16, EfficiencyDefaults{});
  LayerShape eager{1, 4096, 1, 2};
  eager.attention = Attention::kFlash;
  LayerShape compiled = eager;
  compiled.fusions = KernelFusions::compiled();
  const LayerTime slow = transformer_layer_time(m, eager, rates);
  const LayerTime fast = transformer_layer_time(m, compiled, rates);
  const double saved_s = 1711276032.0 / rates.memory_bytes_per_s;
  CHECK(slow.forward_s - fast.forward_s == Approx(saved_s).epsilon(1e-9));
  CHECK(slow.backward_s - fast.backward_s == Approx(2 * saved_s).epsilon(1e-9));
  // A model without a gated MLP (BERT, GPT-2) has neither chain: the norm and rotary fusions
  // leave its layer as it was.
  m.gated_mlp = false;
  m.kv_heads = 0;
  LayerShape fused = eager;
  fused.fusions = KernelFusions::megatron();
  fused.fusions.norm = false;
  fused.fusions.rotary = false;
  LayerShape all = eager;
  all.fusions = KernelFusions::megatron();
  CHECK(transformer_layer_time(m, fused, rates).forward_s ==
        transformer_layer_time(m, all, rates).forward_s);
}

TEST_CASE("the runtime's attention kernel picks the device's rate for it", "[kernels]") {
  const profiles::DeviceSpec h100 = profiles::load_cluster("dgx-h100").device;
  const profiles::DeviceSpec a100 = profiles::load_cluster("dgx-a100-80g").device;
  // Hopper: cuDNN's fused attention (0.89) natively, FlashAttention-2's own rate (0.52).
  CHECK(device_rates(h100, Precision::kBf16, {}).attention_efficiency == 0.89);
  CHECK(device_rates(h100, Precision::kBf16, {}, AttentionKernel::kFlashAttention2)
            .attention_efficiency == 0.52);
  // fp8 linear layers keep the attention in bf16, at the same kernel's rate.
  CHECK(device_rates(h100, Precision::kFp8, {}, AttentionKernel::kFlashAttention2)
            .attention_efficiency == 0.52);
  // Ampere: FlashAttention-2 is the device's own kernel.
  CHECK(device_rates(a100, Precision::kBf16, {}, AttentionKernel::kFlashAttention2)
            .attention_efficiency == 0.9);
  CHECK(runtime_rules(Runtime::kFsdp).attention_kernel == AttentionKernel::kFlashAttention2);
  CHECK(runtime_rules(Runtime::kDeepspeed).attention_kernel == AttentionKernel::kFlashAttention2);
  CHECK(runtime_rules(Runtime::kNemo).attention_kernel == AttentionKernel::kNative);
  CHECK(runtime_rules(Runtime::kLoom).attention_kernel == AttentionKernel::kNative);
  // A long causal sequence on one H100: the attention core's products take 0.89 / 0.52 as long
  // under FlashAttention-2; its exponential and per-block costs do not scale with the rate.
  LayerShape x{1, 16384, 1, 2, Recompute::kNone};
  x.attention = Attention::kFlash;
  const profiles::ModelSpec llama = profiles::load_model("llama2-7b");
  const double native = transformer_layer_time(llama, x, device_rates(h100, Precision::kBf16, {}))
                            .attention_forward_s;
  const double fa2 =
      transformer_layer_time(
          llama, x, device_rates(h100, Precision::kBf16, {}, AttentionKernel::kFlashAttention2))
          .attention_forward_s;
  CHECK(fa2 > 1.3 * native);
  CHECK(fa2 <= 0.89 / 0.52 * native * (1 + 1e-12));
}
