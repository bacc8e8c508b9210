// What Megatron-Core and NeMo keep beside the model states Megatron-LM's table gives:
// TransformerEngine's fp8 weight copies, and Apex DistributedFusedAdam's optimizer dtype, with
// bytes computed by hand for one GPT layer (h = 4096).
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "costmodel/runtime.hpp"

using namespace loom::costmodel;

namespace {

constexpr double kLayer = 201379840;          // 12 h^2 + 13 h parameters
constexpr double kLinearWeights = 201326592;  // 12 h^2: Q, K, V, the projection, the MLP's two

Strategy data_parallel(int dp, int zero) {
  Strategy s;
  s.dp = dp;
  s.zero = zero;
  return s;
}

Job job_of(Runtime runtime, Precision precision) {
  Job job{8, 2048, precision, "adamw"};
  job.runtime = runtime;
  job.reduce_precision = Precision::kBf16;
  return job;
}

RankMemoryInput one_layer() {
  RankMemoryInput in;
  in.num_parameters = kLayer;
  in.num_layers = 1;
  in.layer_num_parameters = kLayer;
  in.linear_weight_parameters = kLinearWeights;
  return in;
}

}  // namespace

TEST_CASE("fp8 jobs keep TransformerEngine's fp8 weights and transposes for the step",
          "[runtime][memory][fp8]") {
  // Megatron-LM, distributed optimizer over 8 ranks: bf16 weights (2 B) plus the fp8 weight and
  // its transpose for the linear layers (1 + 1 B of 201,326,592): 805,412,864 + 402,653,184.
  const RuntimeRules megatron = megatron_runtime_rules();
  const RuntimeMemory fp8 = megatron.memory(job_of(Runtime::kMegatron, Precision::kFp8),
                                            data_parallel(8, 1), one_layer());
  CHECK(fp8.states.parameter_bytes == 2 * kLayer + 2 * kLinearWeights);
  const RuntimeMemory bf16 = megatron.memory(job_of(Runtime::kMegatron, Precision::kBf16),
                                             data_parallel(8, 1), one_layer());
  CHECK(bf16.states.parameter_bytes == 2 * kLayer);
  CHECK(fp8.states.gradient_bytes == bf16.states.gradient_bytes);
  // NeMo's DistributedFusedAdam keeps them alike.
  const RuntimeMemory nemo = nemo_runtime_rules().memory(job_of(Runtime::kNemo, Precision::kFp8),
                                                         data_parallel(8, 2), one_layer());
  CHECK(nemo.states.parameter_bytes == 2 * kLayer + 2 * kLinearWeights);
}

TEST_CASE("NeMo's optim.dtype bf16 keeps bf16 moments and no master weights", "[runtime][memory]") {
  Job job = job_of(Runtime::kNemo, Precision::kBf16);
  const RuntimeRules nemo = nemo_runtime_rules();
  // fp32: the remainders (2 B) and two fp32 moments (8 B) over dp 8: 10 / 8 B per parameter.
  CHECK(nemo.memory(job, data_parallel(8, 2), one_layer()).states.optimizer_bytes ==
        10 * kLayer / 8);
  // bf16: two bf16 moments over dp 8: 4 / 8 B; weights and gradients as before (2 + 2 + 2/8).
  job.optimizer_precision = Precision::kBf16;
  const RuntimeMemory half = nemo.memory(job, data_parallel(8, 2), one_layer());
  CHECK(half.states.optimizer_bytes == 4 * kLayer / 8);
  CHECK(half.states.total() == Approx((2 + 2 + 2.0 / 8 + 4.0 / 8) * kLayer));
  CHECK_FALSE(runtime_refusal(job, data_parallel(8, 2)));
  // Only Apex's optimizer has the dtype: NeMo at zero 1 and the other runtimes refuse it.
  CHECK_THAT(*runtime_refusal(job, data_parallel(8, 1)), Catch::Contains("needs zero=2"));
  for (const Runtime other : {Runtime::kMegatron, Runtime::kDeepspeed, Runtime::kFsdp}) {
    Job elsewhere = job;
    elsewhere.runtime = other;
    elsewhere.reduce_precision.reset();
    CHECK_THAT(*runtime_refusal(elsewhere, data_parallel(8, 1)),
               Catch::Contains("optimizer_dtype bf16 needs runtime nemo"));
  }
  // fp32 is everyone's.
  Job fp32 = job_of(Runtime::kDeepspeed, Precision::kBf16);
  fp32.reduce_precision.reset();
  fp32.optimizer_precision = Precision::kFp32;
  CHECK_FALSE(runtime_refusal(fp32, data_parallel(8, 1)));
  // The plan's job carries it as "optimizer_dtype", absent when unset.
  const nlohmann::json j = job_to_json(job);
  CHECK(j.at("optimizer_dtype") == "bf16");
  CHECK(job_from_json(j, "plan.json", "$.job") == job);
  CHECK_FALSE(job_to_json(job_of(Runtime::kNemo, Precision::kBf16)).contains("optimizer_dtype"));
  nlohmann::json bad = j;
  bad["optimizer_dtype"] = "fp16";
  CHECK_THROWS_WITH(job_from_json(bad, "plan.json", "$.job"),
                    Catch::Contains("$.job.optimizer_dtype"));
}
