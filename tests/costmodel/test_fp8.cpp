// fp8 jobs (TransformerEngine's recipe): the linear layers' products at the device's fp8 rates
// with their casts, everything else at bf16's, and the runtimes that run it.
#include <algorithm>
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>

#include "costmodel/compute.hpp"
#include "costmodel/estimate.hpp"
#include "costmodel/layers.hpp"
#include "costmodel/runtime.hpp"
#include "costmodel/strategy.hpp"
#include "profiles/cluster.hpp"
#include "profiles/loader.hpp"

using namespace loom;
using namespace loom::costmodel;

namespace {

profiles::DeviceSpec h100() {
  return profiles::datasheet_cluster(profiles::load_cluster("dgx-h100")).device;
}

}  // namespace

TEST_CASE("fp8 runs the linear layers' products at fp8's rates and the rest at bf16's",
          "[fp8][gemm]") {
  // dgx-h100 on its datasheet values: fp8 1979 TFLOP/s dense, 1402.6 measured; bf16 989.5 and
  // 794.5; both at the sustained clock 0.905. One-byte operands read in 16-byte vectors.
  const profiles::DeviceSpec d = h100();
  const DeviceRates fp8 = device_rates(d, Precision::kFp8, EfficiencyDefaults{});
  CHECK(fp8.gemm.peak_flops_per_s == Approx(1979e12 * 0.905));
  CHECK(fp8.gemm.ceiling_flops_per_s == Approx(1402.6e12 * 0.905));
  CHECK(fp8.gemm.element_bytes == 1);
  CHECK(fp8.gemm.alignment_elements == 16);
  CHECK(fp8.gemm.prologue_scale == 1);  // twice bf16's rate at half its bytes
  CHECK(fp8.fp8_casts);
  CHECK(fp8.core_gemm.peak_flops_per_s == Approx(989.5e12 * 0.905));
  CHECK(fp8.core_gemm.ceiling_flops_per_s == Approx(794.5e12 * 0.905));
  CHECK(fp8.core_gemm.element_bytes == 2);
  const DeviceRates bf16 = device_rates(d, Precision::kBf16, EfficiencyDefaults{});
  CHECK_FALSE(bf16.fp8_casts);
  CHECK(bf16.core_gemm.peak_flops_per_s == bf16.gemm.peak_flops_per_s);
  CHECK(bf16.core_gemm.ceiling_flops_per_s == bf16.gemm.ceiling_flops_per_s);
  CHECK(bf16.core_matrix_flops_per_s == bf16.matrix_flops_per_s);
  // Activations, weights and gradients stay 16-bit.
  CHECK(element_bytes(Precision::kFp8) == 2);
  // A device without an fp8 rate refuses it, naming what it runs.
  const profiles::DeviceSpec a100 =
      profiles::datasheet_cluster(profiles::load_cluster("dgx-a100-80g")).device;
  CHECK(profiles::precision_refusal(a100, Precision::kFp8) ==
        "the A100-SXM4-80GB has no fp8 rate in its peak_tflops: use --precision bf16 (the best it "
        "runs)");
}

TEST_CASE("fp8's casts: each linear product writes its transposes and casts its weight", "[fp8]") {
  // BERT-large's layer at 64 x 512 tokens (m = 32768) on the H100 datasheet: memory at
  // 3350 x 0.8 = 2680 GB/s, every kernel at least 5 us. Against the same rates without the casts,
  // each of the six linear products (Q, K, V and the output h x h, the MLP's h x 4h and 4h x h)
  // adds forward the transpose of its input (1 byte per element, m x k) and its weight's cast and
  // transpose (4 bytes per weight), backward the transpose of its output's gradient (m x n):
  //   forward:  inputs 5 x 33.55 MB + 134.2 MB = 112.683 us; weights 4 x 4.19 MB (1.57 us, so
  //             the 5 us floor) + 2 x 16.78 MB = 20 + 12.520 us; in all 145.203 us
  //   backward: outputs 4 x 33.55 MB + 134.2 MB + 33.55 MB = 112.683 us.
  // The attention core's products are not cast.
  const profiles::ModelSpec bert = profiles::load_model("bert-large");
  const DeviceRates with = device_rates(h100(), Precision::kFp8, EfficiencyDefaults{});
  DeviceRates without = with;
  without.fp8_casts = false;
  LayerShape x;
  x.micro_batch = 64;
  x.seq_len = 512;
  x.element_bytes = 2;
  const LayerTime a = transformer_layer_time(bert, x, with);
  const LayerTime b = transformer_layer_time(bert, x, without);
  const double rate = 3350e9 * 0.8;
  auto kernel = [rate](double bytes) { return std::max(bytes / rate, 5e-6); };
  const double m = 32768;
  const double h = 1024;
  const double f = 4096;
  const double forward =
      5 * kernel(m * h) + kernel(m * f) + 4 * kernel(4 * h * h) + 2 * kernel(4 * h * f);
  const double backward = 5 * kernel(m * h) + kernel(m * f);
  CHECK(forward == Approx(145.203e-6).epsilon(1e-5));
  CHECK(backward == Approx(112.683e-6).epsilon(1e-5));
  CHECK(a.forward_s - b.forward_s == Approx(forward).epsilon(1e-9));
  CHECK(a.backward_s - b.backward_s == Approx(backward).epsilon(1e-9));
}

TEST_CASE("fp8 trains under Megatron-LM and FSDP (TransformerEngine), not Loom or DeepSpeed",
          "[fp8][runtime]") {
  const profiles::ModelSpec model = profiles::load_model("gpt2");
  Strategy s;
  s.dp = 8;
  s.micro_batch = 1;
  s.num_micro_batches = 1;
  Job job{8, 1024, Precision::kFp8, "adamw"};
  CHECK(check_strategy(model, 8, job, s) ==
        "runtime loom: Loom's executor has no fp8 products (use bf16, or runtime megatron or "
        "fsdp, which run TransformerEngine's fp8)");
  job.runtime = Runtime::kDeepspeed;
  CHECK(check_strategy(model, 8, job, s) ==
        "runtime deepspeed: DeepSpeed's engine has no fp8 training of its own (use bf16, or "
        "runtime megatron or fsdp, which run TransformerEngine's fp8)");
  job.runtime = Runtime::kMegatron;
  CHECK_FALSE(check_strategy(model, 8, job, s).has_value());
  s.zero = 3;
  job.runtime = Runtime::kFsdp;
  CHECK_FALSE(check_strategy(model, 8, job, s).has_value());
}

TEST_CASE("a device with fp8 rates needs bf16's, which fp8 jobs run the rest at", "[fp8]") {
  const nlohmann::json h100 = profiles::cluster_to_json(profiles::load_cluster("dgx-h100"));
  nlohmann::json j = h100;
  j["device"]["achievable_tflops"].erase("bf16");
  CHECK_THROWS_WITH(profiles::cluster_from_json(j, "c.json"),
                    Catch::Contains("c.json") && Catch::Contains("achievable_tflops.bf16") &&
                        Catch::Contains("required with achievable_tflops.fp8"));
  j = h100;
  j["device"]["peak_tflops"].erase("bf16");
  j["device"]["achievable_tflops"].erase("bf16");
  CHECK_THROWS_WITH(profiles::cluster_from_json(j, "c.json"), Catch::Contains("peak_tflops.bf16"));
  CHECK_NOTHROW(profiles::cluster_from_json(h100, "c.json"));
}

TEST_CASE("TransformerEngine's weight casts are paid once a step where the engine caches them",
          "[fp8]") {
  // GPT-3 175B at tp 8 on an H100, Megatron's fusions: the fused QKV (h x 3h / 8), the
  // attention output (h / 8 x h), the MLP's up (h x f / 8) and down (f / 8 x h) weights,
  // 2.265e8 elements, each cast (read 2 bytes) with its transpose (write 1 + 1): 4 bytes an
  // element at the memory rate, far above the launch floor.
  const profiles::ModelSpec gpt3 = profiles::load_model("gpt3-175b");
  const DeviceRates r = device_rates(h100(), Precision::kFp8, EfficiencyDefaults{});
  LayerShape x{1, 2048, 8, 2, Recompute::kNone};
  x.attention = Attention::kFlash;
  x.sequence_parallel = true;
  x.fusions = KernelFusions::megatron();
  const LayerTime every = transformer_layer_time(gpt3, x, r);
  x.fp8_weight_cast_share = 1.0 / 8;  // 8 micro-batches, cast on the first
  const LayerTime cached = transformer_layer_time(gpt3, x, r);
  const double h = 12288;
  const double weights = (4 * h * h + 2 * h * 4 * h) / 8;
  CHECK(weights == Approx(2.265e8).epsilon(1e-3));
  CHECK(every.forward_s - cached.forward_s ==
        Approx(7.0 / 8 * 4 * weights / r.memory_bytes_per_s).epsilon(1e-9));
  CHECK(every.backward_s == cached.backward_s);
  // Megatron-LM and NeMo cache them (TE's is_first_microbatch); the others do not run fp8.
  CHECK(runtime_rules(Runtime::kMegatron).caches_fp8_weights);
  CHECK(runtime_rules(Runtime::kNemo).caches_fp8_weights);
  CHECK_FALSE(runtime_rules(Runtime::kFsdp).caches_fp8_weights);
}

TEST_CASE("an fp8 plan under Megatron-LM holds the weights' fp8 copies and fp8 linear inputs",
          "[fp8][memory]") {
  // GPT-2 (12 layers, h 768) on one DGX H100, dp 8, no pipeline: the fp8 plan's weights are the
  // bf16 plan's plus 1 + 1 B for each of 12 x 12 h^2 linear weights.
  const profiles::ModelSpec gpt2 = profiles::load_model("gpt2");
  const CostModel cost(gpt2, profiles::load_cluster("dgx-h100"));
  Strategy s;
  s.dp = 8;
  s.zero = 1;
  s.micro_batch = 4;
  s.num_micro_batches = 2;
  Job bf16{64, 1024, Precision::kBf16, "adamw"};
  bf16.runtime = Runtime::kMegatron;
  Job fp8 = bf16;
  fp8.precision = Precision::kFp8;
  const MemoryBreakdown a = cost.estimate(fp8, s, even_partition(gpt2, 1)).memory_by_stage.at(0);
  const MemoryBreakdown b = cost.estimate(bf16, s, even_partition(gpt2, 1)).memory_by_stage.at(0);
  CHECK(layer_linear_weight_parameters(gpt2) == 12LL * 768 * 768);
  CHECK(a.parameter_bytes - b.parameter_bytes == 2.0 * 12 * 12 * 768 * 768);
  // Per layer and sample (s 1024, h 768, no tp): QKV's and FC1's inputs 1 B instead of 2, FC2's
  // 1 B instead of 2 over 4h, the projection's 1 B more: (-1 - 1 - 4 + 1) sbh.
  CHECK(b.activation_bytes - a.activation_bytes == Approx(5.0 * 12 * 4 * 1024 * 768));
}
