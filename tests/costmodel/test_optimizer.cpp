// The optimizer step as the job's kernels issue it (costmodel/optimizer.hpp): fused, PyTorch's
// multi-tensor path and its per-tensor loop, in the estimate and the simulator alike, and the
// runtimes that take each.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "costmodel/estimate.hpp"
#include "costmodel/layers.hpp"
#include "costmodel/optimizer.hpp"
#include "costmodel/runtime.hpp"
#include "costmodel/simulator.hpp"
#include "profiles/errors.hpp"
#include "profiles/loader.hpp"

using namespace loom;
using namespace loom::costmodel;

namespace {

// BERT-large with its 2-label classifier, one micro-batch of 32 x 384 on one GPU.
Prediction one_gpu(const CostModel& cost, OptimizerKernels kernels, Prediction* simulated) {
  Job job{32, 384, Precision::kBf16, "adamw"};
  job.optimizer_kernels = kernels;
  Strategy s;
  s.micro_batch = 32;
  const auto stages = even_partition(cost.model(), 1);
  if (simulated != nullptr) *simulated = simulate(cost, job, s, stages).prediction;
  return cost.estimate(job, s, stages);
}

}  // namespace

TEST_CASE("AdamW's bytes and host operations by kernels", "[optimizer]") {
  // Fused: read weight, gradient and both moments, write weight and both moments (7 x 4 bytes).
  // PyTorch's eight operations: 8 + 12 + 8 + 12 + 8 + 8 + 8 + 16 bytes.
  CHECK(optimizer_bytes_per_parameter(OptimizerKernels::kFused) == 28);
  CHECK(optimizer_bytes_per_parameter(OptimizerKernels::kForeach) == 80);
  CHECK(optimizer_bytes_per_parameter(OptimizerKernels::kPerTensor) == 80);
  CHECK(optimizer_host_ops_per_tensor(OptimizerKernels::kFused) == 0);
  CHECK(optimizer_host_ops_per_tensor(OptimizerKernels::kForeach) == 0);
  CHECK(optimizer_host_ops_per_tensor(OptimizerKernels::kPerTensor) == 9);
  // The per-tensor loop is the longer of its kernels and the host's issue.
  const OptimizerStepRates r{80 / 1e12, 9 * 10e-6};
  CHECK(optimizer_step_s(r, 1e9, 100) == Approx(0.08));  // 80 ms of kernels, 9 ms of issue
  CHECK(optimizer_step_s(r, 1e6, 100) == Approx(9e-3));  // 80 us of kernels
  CHECK(optimizer_step_s({28 / 1e12, 0}, 1e9, 1e6) == Approx(0.028));  // fused: no issue charged
  // Temporaries: none fused; foreach's roots of every second moment; the loop's root and
  // quotient of the largest tensor.
  CHECK(optimizer_temporary_bytes(OptimizerKernels::kFused, 1e9, 1e7) == 0);
  CHECK(optimizer_temporary_bytes(OptimizerKernels::kForeach, 1e9, 1e7) == 4e9);
  CHECK(optimizer_temporary_bytes(OptimizerKernels::kPerTensor, 1e9, 1e7) == 8e7);
}

TEST_CASE("the estimate and the simulator charge the job's optimizer kernels", "[optimizer]") {
  // h100-x1 on its datasheet: 3350 GB/s x 0.8 = 2680 GB/s; BERT-large (2 labels): 335,143,938
  // parameters in 5 + 24 x 16 + 4 = 393 tensors; 10.9 us per host operation.
  const CostModel cost(profiles::load_model("bert-large"),
                       profiles::datasheet_cluster(profiles::load_cluster("h100-x1")));
  const double parameters = static_cast<double>(count_parameters(cost.model()).total);
  CHECK(parameters == 335143938);
  const double bandwidth = 3350e9 * 0.8;
  Prediction sim_fused;
  Prediction sim_foreach;
  Prediction sim_loop;
  const Prediction fused = one_gpu(cost, OptimizerKernels::kFused, &sim_fused);
  const Prediction foreach = one_gpu(cost, OptimizerKernels::kForeach, &sim_foreach);
  const Prediction loop = one_gpu(cost, OptimizerKernels::kPerTensor, &sim_loop);
  CHECK(fused.optimizer_s == Approx(parameters * 28 / bandwidth));    // 3.502 ms
  CHECK(foreach.optimizer_s == Approx(parameters * 80 / bandwidth));  // 10.004 ms
  CHECK(loop.optimizer_s == Approx(393 * 9 * 10.9e-6));               // 38.553 ms, host-bound
  CHECK(sim_fused.optimizer_s == Approx(fused.optimizer_s));
  CHECK(sim_foreach.optimizer_s == Approx(foreach.optimizer_s));
  CHECK(sim_loop.optimizer_s == Approx(loop.optimizer_s));
  // Only the optimizer differs.
  CHECK(loop.step_time_s - fused.step_time_s ==
        Approx(loop.optimizer_s - fused.optimizer_s).epsilon(1e-9));
  // The step's temporaries (at most 4 bytes per parameter) stay under the activations the
  // backward pass freed: the peak is the same.
  CHECK(loop.peak_memory_bytes == fused.peak_memory_bytes);
  CHECK(foreach.peak_memory_bytes == fused.peak_memory_bytes);
}

TEST_CASE("a pipeline rank steps the tensors of its own stage", "[optimizer][pipeline]") {
  // GPT-2 (12 layers of 12 tensors, wte and wpe, ln_f's two, the LM head tied to wte) on two
  // H100s in a pipeline, the per-tensor loop host-bound at 9 x 10.9 us per tensor. The stage
  // holding the head also holds its copy of the word table: one tensor more.
  const CostModel cost(profiles::load_model("gpt2"),
                       profiles::datasheet_cluster(profiles::load_cluster("dgx-h100")));
  Job job{16, 1024, Precision::kBf16, "adamw"};
  job.optimizer_kernels = OptimizerKernels::kPerTensor;
  Strategy s;
  s.pp = 2;
  s.micro_batch = 1;
  s.num_micro_batches = 16;
  const std::vector<StageRange> head_alone = {{0, 12}, {13, 13}};     // 2 + 144 | 2 + 1
  const std::vector<StageRange> embedding_alone = {{0, 0}, {1, 13}};  // 2 | 144 + 2 + 1
  const Prediction a = cost.estimate(job, s, head_alone);
  const Prediction b = cost.estimate(job, s, embedding_alone);
  CHECK(a.optimizer_s == Approx(146 * 9 * 10.9e-6));
  CHECK(b.optimizer_s == Approx(147 * 9 * 10.9e-6));
  CHECK(simulate(cost, job, s, head_alone).prediction.optimizer_s == Approx(a.optimizer_s));
  CHECK(simulate(cost, job, s, embedding_alone).prediction.optimizer_s == Approx(b.optimizer_s));
}

TEST_CASE("optimizer kernels: the runtimes that take them, the JSON and the executor's job",
          "[optimizer][runtime]") {
  Job job{64, 512, Precision::kBf16, "adamw"};
  job.optimizer_kernels = OptimizerKernels::kForeach;
  Strategy s;
  s.dp = 8;
  s.micro_batch = 8;
  job.runtime = Runtime::kMegatron;
  CHECK(runtime_refusal(job, s) ==
        "runtime megatron runs its own fused Adam: optimizer_kernels foreach needs runtime loom or "
        "fsdp");
  job.runtime = Runtime::kDeepspeed;
  CHECK(runtime_refusal(job, s).has_value());
  job.runtime = Runtime::kLoom;
  CHECK_FALSE(runtime_refusal(job, s).has_value());  // plain data parallelism, as DDP's
  s.zero = 1;
  CHECK(runtime_refusal(job, s).value().find("zero 0") != std::string::npos);
  job.runtime = Runtime::kFsdp;
  s.zero = 3;
  CHECK_FALSE(runtime_refusal(job, s).has_value());

  // Written only when not fused; read back; a wrong value names the field.
  CHECK(job_to_json(job)["optimizer_kernels"] == "foreach");
  CHECK(job_from_json(job_to_json(job), "plan.json", "job").optimizer_kernels ==
        OptimizerKernels::kForeach);
  job.optimizer_kernels = OptimizerKernels::kFused;
  CHECK_FALSE(job_to_json(job).contains("optimizer_kernels"));
  nlohmann::json bad = job_to_json(job);
  bad["optimizer_kernels"] = "apex";
  CHECK_THROWS_WITH(job_from_json(bad, "plan.json", "job"),
                    Catch::Contains("plan.json") && Catch::Contains("job.optimizer_kernels") &&
                        Catch::Contains("per_tensor"));

  // Loom's executor steps with its fused kernel whatever the plan describes.
  job.optimizer_kernels = OptimizerKernels::kPerTensor;
  CHECK(executor_job(job).optimizer_kernels == OptimizerKernels::kFused);
}
