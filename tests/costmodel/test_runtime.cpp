// Each runtime's memory terms, its data-parallel exposure, what it refuses, and the process lines
// of the memory breakdown (runtime.hpp, process_memory.hpp), with figures computed by hand.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <vector>

#include "costmodel/estimate.hpp"
#include "costmodel/layers.hpp"
#include "costmodel/process_memory.hpp"
#include "costmodel/runtime.hpp"
#include "profiles/loader.hpp"

using namespace loom::costmodel;
using loom::profiles::load_cluster;
using loom::profiles::load_model;

namespace {

// One GPT layer with h = 4096: 12 h^2 + 13 h = 201,326,592 + 53,248 parameters.
constexpr double kLayer = 201379840;

Strategy dp8(int zero) {
  Strategy s;
  s.dp = 8;
  s.zero = zero;
  s.micro_batch = 1;
  s.num_micro_batches = 1;
  return s;
}

Job bf16_job(Runtime runtime) {
  Job job{8, 2048, Precision::kBf16, "adamw"};
  job.runtime = runtime;
  return job;
}

// `layers` GPT layers on one rank, nothing else (no embedding, no activations, no recompute).
RankMemoryInput layers_on_rank(double layers) {
  RankMemoryInput in;
  in.num_parameters = layers * kLayer;
  in.num_layers = layers;
  in.layer_num_parameters = kLayer;
  in.largest_block_num_parameters = kLayer;
  in.largest_tensor_num_parameters = 4 * 4096.0 * 4096;
  in.bucket_bytes = 25.0 * 1024 * 1024;
  return in;
}

RuntimeMemory memory_of(Runtime runtime, const Strategy& s, const RankMemoryInput& in) {
  return runtime_rules(runtime).memory(bf16_job(runtime), s, in);
}

// Collectives at 1 GB/s with no latency: the time in seconds is bytes / 1e9.
DataParallelInput linear_links(double parameters, double layer, std::int64_t micro_batches) {
  DataParallelInput in;
  in.time_s = [](Collective, double bytes) { return bytes / 1e9; };
  in.num_parameters = parameters;
  in.layer_num_parameters = layer;
  in.forward_window_s = 1;
  in.backward_window_s = 2;
  in.num_micro_batches = micro_batches;
  in.element_bytes = 2;
  return in;
}

}  // namespace

TEST_CASE("megatron: fp32 main grads, and the distributed optimizer shards 12 bytes",
          "[runtime][memory]") {
  // distrib_optimizer.md: bf16 weights 2 B, fp32 main grads 4 B, fp32 main weights and Adam
  // moments 12 B per parameter, the 12 over dp with the distributed optimizer (6 + 12/d).
  const RuntimeMemory z0 = memory_of(Runtime::kMegatron, dp8(0), layers_on_rank(1));
  CHECK(z0.states.parameter_bytes == 2 * kLayer);  // 402,759,680
  CHECK(z0.states.gradient_bytes == 4 * kLayer);   // 805,519,360
  CHECK(z0.states.optimizer_bytes == 12 * kLayer);
  const RuntimeMemory z1 = memory_of(Runtime::kMegatron, dp8(1), layers_on_rank(1));
  CHECK(z1.states.gradient_bytes == 805519360);
  CHECK(z1.states.optimizer_bytes == 302069760);  // 12 * 201,379,840 / 8
  CHECK(z1.buffer_bytes == 0);                    // buckets are views of the main-grad buffer
  // --grad-reduce-in-bf16 (reduce_dtype bf16): a bf16 gradient buffer, 2 B, reduced so; the
  // fp32 main weights and moments stay: 4 + 12 / 8 = 5.5 B per parameter.
  Job bf16_reduce = bf16_job(Runtime::kMegatron);
  bf16_reduce.reduce_precision = Precision::kBf16;
  const RuntimeRules megatron = megatron_runtime_rules();
  const RuntimeMemory half = megatron.memory(bf16_reduce, dp8(1), layers_on_rank(1));
  CHECK(half.states.gradient_bytes == 402759680);  // 2 * 201,379,840
  CHECK(half.states.total() == Approx(5.5 * kLayer));
  CHECK(megatron.reduce_bytes_per_parameter(bf16_reduce) == 2);
  CHECK(megatron.reduce_bytes_per_parameter(bf16_job(Runtime::kMegatron)) == 4);
  // Its reduce-scatter of N = 1e9 bf16 gradients at 1 GB/s (2 s) hides under the last 2 s
  // backward but for the last 40M-element bucket (0.08 s); fp32's 4 s leave 2 s.
  const DataParallelInput in = linear_links(1e9, 1e8, 2);
  CHECK(megatron.exposure(bf16_reduce, dp8(1), in).gradient_s == Approx(0.08));
  CHECK(megatron.exposure(bf16_job(Runtime::kMegatron), dp8(1), in).gradient_s == Approx(2));
  CHECK_FALSE(runtime_refusal(bf16_reduce, dp8(1)));
  // fp16 gradients, or bf16 ones for an fp32 job, have no Megatron-LM flag.
  Job fp16_reduce = bf16_reduce;
  fp16_reduce.reduce_precision = Precision::kFp16;
  CHECK_THAT(*runtime_refusal(fp16_reduce, dp8(1)), Catch::Contains("--grad-reduce-in-bf16"));
  Job fp32_job = bf16_reduce;
  fp32_job.precision = Precision::kFp32;
  CHECK(runtime_refusal(fp32_job, dp8(1)).has_value());
}

TEST_CASE("nemo: the gradients in grad_sync_dtype, and DistributedFusedAdam shards them too",
          "[runtime][memory]") {
  // Zero 1, Megatron-Core's distributed optimizer, gradients in fp32 (NeMo's default
  // grad_sync_dtype): bf16 weights 2 B, the gradient buffer 4 B, fp32 main weights and moments
  // 12 B over dp, as Megatron-LM's.
  const RuntimeMemory z1 = memory_of(Runtime::kNemo, dp8(1), layers_on_rank(1));
  CHECK(z1.states.parameter_bytes == 402759680);  // 2 * 201,379,840
  CHECK(z1.states.gradient_bytes == 805519360);   // 4 * 201,379,840
  CHECK(z1.states.optimizer_bytes == 302069760);  // 12 * 201,379,840 / 8
  // Zero 2, Apex's DistributedFusedAdam: the bf16 weights and the contiguous fp32 gradient
  // buffer on every rank (2 + 4 B); over dp = 8, the fp32 reduced-gradient shard (4 B), the
  // 16-bit remainders of the fp32 master weights (2 B) and the two fp32 moments (8 B):
  // 6 + 14 / 8 = 7.75 B per parameter.
  const RuntimeMemory z2 = memory_of(Runtime::kNemo, dp8(2), layers_on_rank(1));
  CHECK(z2.states.parameter_bytes == 402759680);
  CHECK(z2.states.gradient_bytes == 805519360 + 100689920);  // (4 + 4 / 8) * 201,379,840
  CHECK(z2.states.optimizer_bytes == 251724800);             // 10 * 201,379,840 / 8
  CHECK(z2.states.total() == Approx(7.75 * kLayer));
  // grad_sync_dtype bf16 (reduce_dtype): a bf16 buffer and shard, 4 + 12 / 8 = 5.5 B.
  Job bf16_sync = bf16_job(Runtime::kNemo);
  bf16_sync.reduce_precision = Precision::kBf16;
  const RankMemoryInput one = layers_on_rank(1);
  CHECK(nemo_runtime_rules().memory(bf16_sync, dp8(2), one).states.total() == Approx(5.5 * kLayer));
  CHECK(nemo_runtime_rules().memory(bf16_sync, dp8(1), one).states.gradient_bytes == 402759680);
  // One data-parallel rank: the reduced shard is the buffer itself (2 B, not 2 + 2), and the
  // remainders and moments are whole (10 B): 2 + 2 + 10 = 14 B.
  Strategy alone = dp8(2);
  alone.dp = 1;
  const RuntimeMemory z2_alone = nemo_runtime_rules().memory(bf16_sync, alone, one);
  CHECK(z2_alone.states.gradient_bytes == 402759680);  // 2 * 201,379,840
  CHECK(z2_alone.states.total() == Approx(14 * kLayer));
  // Exposure (N = 1e9 parameters, forward window 1 s, backward 2 s, 1 GB/s), bf16 gradients:
  // their reduce-scatter (2 s) under the last backward, max(2 - 2, the last 125 MB bucket's
  // 0.125 s) = 0.125; the bf16 weights' all-gather (2 s) under the next forward: max(2 - 1,
  // 0.125) = 1. In fp32 the reduce-scatter takes 4 s: max(4 - 2, 0.125) = 2. Zero 1 reduces
  // its bf16 buffer: max(2 - 2, the 40M-element bucket's 0.08 s).
  const DataParallelInput in = linear_links(1e9, 1e8, 2);
  const RuntimeRules nemo = nemo_runtime_rules();
  const DataParallelExposure e2 = nemo.exposure(bf16_sync, dp8(2), in);
  CHECK(e2.gradient_s == Approx(0.125));
  CHECK(e2.parameter_s == Approx(1));
  CHECK(nemo.exposure(bf16_job(Runtime::kNemo), dp8(2), in).gradient_s == Approx(2));
  CHECK(nemo.exposure(bf16_sync, dp8(1), in).gradient_s == Approx(0.08));
  CHECK(nemo.reduce_bytes_per_parameter(bf16_job(Runtime::kNemo)) == 4);
  CHECK(nemo.reduce_bytes_per_parameter(bf16_sync) == 2);
  // NeMo runs zero 2, takes a reduce_dtype and refuses zero 3; Megatron-LM refuses zero 2 and
  // names nemo.
  CHECK_THAT(*runtime_refusal(bf16_job(Runtime::kNemo), dp8(3)), Catch::Contains("zero=3"));
  CHECK_FALSE(runtime_refusal(bf16_sync, dp8(2)));
  CHECK_THAT(*runtime_refusal(bf16_job(Runtime::kMegatron), dp8(2)),
             Catch::Contains("--runtime nemo"));
}

TEST_CASE("deepspeed ZeRO-3: live parameters, prefetch and the contiguous buckets",
          "[runtime][memory]") {
  // Four layers on the rank: N = 805,519,360 parameters.
  const RuntimeMemory m = memory_of(Runtime::kDeepspeed, dp8(3), layers_on_rank(4));
  CHECK(m.states.parameter_bytes == 201379840);   // 2 N / 8
  CHECK(m.states.gradient_bytes == 201379840);    // 2 N / 8
  CHECK(m.states.optimizer_bytes == 1208279040);  // 12 N / 8
  // Two reduce buckets (overlap_comm) of min(5e8, N) bf16 elements:  2,000,000,000
  // live parameters: the running layer + the 5e7-element prefetch:   2 (kLayer + 5e7) =
  //                                                                   502,759,680
  // the running layer's full bf16 gradient:                          402,759,680
  // the optimizer step's fp32 gradient partition 4 N / 8, above the
  // (absent) activations:                                            402,759,680
  CHECK(m.buffer_bytes == 2e9 + 502759680 + 402759680 + 402759680);
}

TEST_CASE("deepspeed ZeRO-2: one contiguous bucket, overlap_comm off as emitted",
          "[runtime][memory]") {
  // N = 805,519,360 parameters on the rank. One reduce bucket of min(5e8, N) bf16 elements,
  // 1,000,000,000 (a second one only with overlap_comm, which the emitted configuration leaves
  // off at stage 2); the optimizer step's fp32 gradient partition 4 N / 8 = 402,759,680.
  const RuntimeMemory m = memory_of(Runtime::kDeepspeed, dp8(2), layers_on_rank(4));
  CHECK(m.states.gradient_bytes == 201379840);  // 2 N / 8
  CHECK(m.buffer_bytes == 1e9 + 402759680);
}

TEST_CASE("fsdp: two gathered blocks under FULL_SHARD, all of them under SHARD_GRAD_OP",
          "[runtime][memory]") {
  const RuntimeMemory full = memory_of(Runtime::kFsdp, dp8(3), layers_on_rank(4));
  // fp32 sharded weights (the optimizer's own), fp32 gradients, two fp32 moments: 16 N / 8.
  CHECK(full.states.parameter_bytes == 402759680);  // 4 N / 8
  CHECK(full.states.gradient_bytes == 402759680);
  CHECK(full.states.optimizer_bytes == 805519360);  // 8 N / 8
  // Two bf16 blocks gathered (running + prefetched): 2 * 2 * kLayer = 805,519,360; one block's
  // fp32 gradient before its reduce-scatter: 4 * kLayer = 805,519,360; a fused AdamW allocates
  // nothing.
  CHECK(full.buffer_bytes == 805519360.0 + 805519360);
  // SHARD_GRAD_OP keeps every block gathered after its forward: 2 N = 1,611,038,720 instead.
  const RuntimeMemory grad_op = memory_of(Runtime::kFsdp, dp8(2), layers_on_rank(4));
  CHECK(grad_op.buffer_bytes == 1611038720.0 + 805519360);
  // torch.optim.AdamW's foreach step: the square roots of the shard's second moments, 4 N / 8 =
  // 402,759,680; its per-tensor loop: a root and a quotient of the largest tensor's shard,
  // 8 x 4 x 4096^2 / 8 = 67,108,864 (no activations to outlast here).
  Job job = bf16_job(Runtime::kFsdp);
  job.optimizer_kernels = OptimizerKernels::kForeach;
  const RankMemoryInput in = layers_on_rank(4);
  CHECK(fsdp_runtime_rules().memory(job, dp8(3), in).buffer_bytes ==
        805519360.0 + 805519360 + 402759680);
  job.optimizer_kernels = OptimizerKernels::kPerTensor;
  CHECK(fsdp_runtime_rules().memory(job, dp8(3), in).buffer_bytes ==
        805519360.0 + 805519360 + 67108864);
}

TEST_CASE("each runtime's data-parallel exposure", "[runtime][overlap]") {
  // N = 1e9 parameters, 1e8 per layer; forward window 1 s, backward 2 s; 1 GB/s.
  const DataParallelInput in = linear_links(1e9, 1e8, 2);
  // Megatron, distributed optimizer: fp32 grads reduce-scattered (4 s) under the last backward,
  // the last 40M-element bucket (0.16 s) exposed at least: max(4 - 2, 0.16) = 2. The bf16
  // weights' all-gather (2 s) under the next forward: max(2 - 1, 0.08) = 1.
  DataParallelExposure m =
      megatron_runtime_rules().exposure(bf16_job(Runtime::kMegatron), dp8(1), in);
  CHECK(m.gradient_s == Approx(2));
  CHECK(m.parameter_s == Approx(1));
  // FSDP FULL_SHARD, per micro-batch: the gather (2 s) under the forward: max(2 - 1, 0.2) = 1;
  // the backward's gather (2 s) and fp32 reduce-scatter (4 s): max(6 - 2, 0.4) = 4; two
  // micro-batches.
  DataParallelExposure f = fsdp_runtime_rules().exposure(bf16_job(Runtime::kFsdp), dp8(3), in);
  CHECK(f.parameter_s == Approx(2));
  CHECK(f.gradient_s == Approx(8));
  // DeepSpeed ZeRO-2 without overlap_comm: a reduce-scatter of bf16 grads (2 s) per micro-batch,
  // the all-gather of updated weights (2 s) after the step.
  DataParallelExposure d =
      deepspeed_runtime_rules().exposure(bf16_job(Runtime::kDeepspeed), dp8(2), in);
  CHECK(d.gradient_s == Approx(4));
  CHECK(d.parameter_s == Approx(2));
}

TEST_CASE("loom's ZeRO-2 reduce-scatters on NCCL and all-reduces on Gloo", "[runtime][overlap]") {
  // An all-reduce at twice a reduce-scatter's time (its bytes on a ring), nothing to hide behind:
  // bf16 gradients of 1e9 parameters, 2 GB, reduce-scatter 2 s, all-reduce 4 s; two micro-batches,
  // each reduced.
  DataParallelInput in = linear_links(1e9, 1e8, 2);
  in.time_s = [](Collective c, double bytes) {
    return (c == Collective::kAllReduce ? 2 : 1) * bytes / 1e9;
  };
  in.forward_window_s = 0;
  in.backward_window_s = 0;
  in.bucket_bytes = 25.0 * 1024 * 1024;
  const RuntimeRules loom = loom_runtime_rules();
  CHECK(loom.exposure(bf16_job(Runtime::kLoom), dp8(2), in).gradient_s == Approx(2 * 2.0));
  in.gloo = true;
  CHECK(loom.exposure(bf16_job(Runtime::kLoom), dp8(2), in).gradient_s == Approx(2 * 4.0));
  // ZeRO-1 all-reduces once per step either way.
  CHECK(loom.exposure(bf16_job(Runtime::kLoom), dp8(1), in).gradient_s == Approx(4.0));
}

TEST_CASE("loom's ZeRO-2 staging buffer is at most a bucket and at most the largest block",
          "[runtime][zero]") {
  // The executor copies one block's gradients at a time into its staging buffer, in pieces of at
  // most a bucket (25 MiB). A GPT layer of 201 M parameters: the bucket bounds it. A rank whose
  // largest block has 1 M parameters stages 4 MB, 25 MiB - 4 MB less.
  RankMemoryInput in = layers_on_rank(1);
  const double bucketed = memory_of(Runtime::kLoom, dp8(2), in).buffer_bytes;
  in.largest_block_num_parameters = 1e6;
  CHECK(bucketed - memory_of(Runtime::kLoom, dp8(2), in).buffer_bytes ==
        Approx(25.0 * 1024 * 1024 - 4e6));
}

TEST_CASE("a runtime refuses what its engine cannot run", "[runtime]") {
  const auto model = load_model("gpt2");
  Strategy s;
  s.dp = 4;
  s.pp = 2;
  s.zero = 2;
  s.micro_batch = 1;
  s.num_micro_batches = 4;
  Job job{16, 1024, Precision::kBf16, "adamw"};
  CHECK_FALSE(check_strategy(model, 8, job, s).has_value());  // Loom's executor runs it
  job.runtime = Runtime::kDeepspeed;
  CHECK(check_strategy(model, 8, job, s) ==
        "runtime deepspeed: DeepSpeed's pipeline engine refuses ZeRO-2 and ZeRO-3 (they are "
        "incompatible with its pipeline parallelism); use zero 0 or 1 with pp=2");
  job.runtime = Runtime::kMegatron;
  CHECK(check_strategy(model, 8, job, s) ==
        "runtime megatron: Megatron-LM shards the optimizer states only (its distributed "
        "optimizer is ZeRO-1); zero=2 needs --runtime nemo (Apex's DistributedFusedAdam), "
        "deepspeed or fsdp");
  s.zero = 1;
  job.runtime = Runtime::kFsdp;
  CHECK(check_strategy(model, 8, job, s) ==
        "runtime fsdp: PyTorch FSDP has no optimizer-only sharding (ZeRO-1): zero 0 = NO_SHARD, "
        "2 = SHARD_GRAD_OP, 3 = FULL_SHARD");
}

TEST_CASE("process lines: CUDA context, workspaces, NCCL buffers, fragmentation on GPUs only",
          "[runtime][memory]") {
  const auto gpu = load_cluster("dgx-a100-80g");
  // dp = 8 alone: one communicator, a ring of 8 ranks, 2 peers x 8 channels x (4 MiB + 4.6875
  // MiB + 512 KiB = 9,633,792 bytes) = 154,140,672 bytes.
  ProcessMemory p = process_memory(gpu.device, dp8(0), 1e9);
  CHECK(p.cuda_context_bytes == 536870912);   // 512 MiB
  CHECK(p.workspace_bytes == 2 * 8519680.0);  // two handles of 8 MiB + 128 KiB
  CHECK(p.nccl_buffer_bytes == 154140672);
  CHECK(p.fragmentation_bytes == Approx(1e8));  // 10 % of 1e9 transient bytes
  // dp 2 x tp 4: a pair (1 peer), a ring of 4 (2) and the world of 8 (2): 5 x 8 x 9,633,792.
  Strategy s = dp8(0);
  s.dp = 2;
  s.tp = 4;
  CHECK(nccl_connection_count(s) == 5);
  CHECK(process_memory(gpu.device, s, 0).nccl_buffer_bytes == 385351680);
  CHECK(process_memory(load_cluster("local-cpu").device, s, 1e9).total() == 0);

  // Through the estimate: the lines appear in the breakdown on a GPU, and not on a CPU.
  const auto model = load_model("bert-base");
  Strategy one;
  one.micro_batch = 8;
  Job job{8, 128, Precision::kBf16, "adamw"};
  const Prediction g = CostModel(model, gpu).estimate(job, one, even_partition(model, 1));
  CHECK(g.memory_by_stage[0].cuda_context_bytes == 536870912);
  CHECK(g.memory_by_stage[0].nccl_buffer_bytes == 0);  // one rank joins no communicator
  CHECK(g.peak_memory_bytes ==
        Approx(g.memory_by_stage[0].tensor_bytes() + g.memory_by_stage[0].process_bytes()));
  job.precision = Precision::kFp32;
  const Prediction c =
      CostModel(model, load_cluster("local-cpu")).estimate(job, one, even_partition(model, 1));
  CHECK(c.memory_by_stage[0].process_bytes() == 0);
  CHECK(c.peak_memory_bytes == c.memory_by_stage[0].tensor_bytes());
}

TEST_CASE("the estimate charges the job's runtime", "[runtime][estimate]") {
  const auto model = load_model("gpt2");
  const auto cluster = load_cluster("dgx-a100-80g");
  Strategy s = dp8(0);
  Job job{8, 1024, Precision::kBf16, "adamw"};
  const CostModel cost(model, cluster);
  const Prediction loom = cost.estimate(job, s, even_partition(model, 1));
  job.runtime = Runtime::kMegatron;
  const Prediction megatron = cost.estimate(job, s, even_partition(model, 1));
  // Megatron keeps bf16 weights with fp32 main grads and 12 bytes of optimizer states (fp32
  // master weights and moments); Loom's autocast keeps fp32 weights and gradients and 8 bytes of
  // moments: 18 bytes per parameter against 16.
  const MemoryBreakdown& m = megatron.memory_by_stage[0];
  const MemoryBreakdown& l = loom.memory_by_stage[0];
  CHECK(m.parameter_bytes == 0.5 * l.parameter_bytes);
  CHECK(m.gradient_bytes == l.gradient_bytes);
  CHECK(m.optimizer_bytes == 1.5 * l.optimizer_bytes);
  CHECK(m.parameter_bytes + m.gradient_bytes + m.optimizer_bytes ==
        Approx(18.0 / 16 * (l.parameter_bytes + l.gradient_bytes + l.optimizer_bytes)));
}

TEST_CASE("Loom's autocast keeps fp32 states and 16-bit weight copies, and one GPU frees gradients",
          "[runtime][memory]") {
  // Two GPT layers of kLayer parameters on one rank, bf16 under autocast: fp32 weights (4),
  // gradients (4) and moments (8) per parameter, and the layers' bf16 copies (2 kLayer each)
  // alive with the activations.
  RankMemoryInput in = layers_on_rank(2);
  in.activation_bytes = 2e9;
  Strategy one;
  one.num_micro_batches = 2;
  const RuntimeMemory cpu = memory_of(Runtime::kLoom, one, in);
  CHECK(cpu.states.parameter_bytes == 4 * 2 * kLayer);
  CHECK(cpu.states.gradient_bytes == 4 * 2 * kLayer);
  CHECK(cpu.states.optimizer_bytes == 8 * 2 * kLayer);
  CHECK(cpu.buffer_bytes == Approx(2 * 2 * kLayer));
  // On a GPU one rank sets its gradients to none each step: with one micro-batch the activation
  // peak has none. The step's other peak, the gradients (4 * 2 kLayer) and AdamW's temporary
  // of twice the largest tensor's elements (4 * 2 * 4 * 4096^2) without the activations, lies
  // 1,073,741,824 bytes below the activations here.
  in.gpu = true;
  CHECK(memory_of(Runtime::kLoom, one, in).states.gradient_bytes == 4 * 2 * kLayer);
  one.num_micro_batches = 1;
  const RuntimeMemory gpu = memory_of(Runtime::kLoom, one, in);
  CHECK(gpu.states.gradient_bytes == 0);
  CHECK(gpu.buffer_bytes == Approx(2 * 2 * kLayer));
  // Without activations the gradients and the optimizer's temporary are the peak.
  in.activation_bytes = 0;
  CHECK(memory_of(Runtime::kLoom, one, in).buffer_bytes ==
        Approx(4 * 2 * kLayer + 4 * 2 * 4 * 4096.0 * 4096));
}

TEST_CASE("an eager language-model loss allocates fp32 gradients, a fused one keeps the logits",
          "[runtime][memory]") {
  // GPT-2 (vocabulary 50,257) under FSDP on 8 A100s, micro-batch 4 of 1024 tokens: the eager
  // cross-entropy's backward starts with the fp32 gradients of the log-probabilities and of the
  // logits, 8 x 4 x 1024 x 50,257 = 1,646,821,376 bytes beside the kept activations, more than
  // a layer's backward temporaries; a fused loss (and Megatron-LM's) writes its gradient in place.
  const auto model = load_model("gpt2");
  const CostModel cost(model, load_cluster("dgx-a100-80g"));
  Strategy s = dp8(3);
  s.micro_batch = 4;
  s.num_micro_batches = 2;
  Job eager{64, 1024, Precision::kBf16, "adamw"};
  eager.runtime = Runtime::kFsdp;
  Job fused = eager;
  fused.loss = Loss::kFused;
  const double with =
      cost.estimate(eager, s, even_partition(model, 1)).memory_by_stage[0].buffer_bytes;
  const double without =
      cost.estimate(fused, s, even_partition(model, 1)).memory_by_stage[0].buffer_bytes;
  // Without it the backward pass's working memory is one layer's temporaries: the unfused
  // attention's gradients of Q, K and V (3 x 2 x 4 x 1024 x 768 = 18,874,368 bytes) and of the
  // scores (2 x 12 x 4 x 1024^2 = 100,663,296), which the loss's gradients exceed.
  REQUIRE(s.attention == Attention::kMath);
  CHECK(cost.step_terms(fused, s).backward_temporary_bytes == 119537664.0);
  CHECK(with - without == Approx(1646821376.0 - 119537664.0));
  // The eager loss keeps the bf16 logits and their fp32 softmax (6 bytes a logit); the fused one
  // only the logits (2), from which it recomputes the softmax: 4 x 4 x 1024 x 50,257 =
  // 823,410,688 fewer activation bytes for the one micro-batch in flight.
  CHECK(head_kept_bytes_per_logit(eager) == 6);
  CHECK(head_kept_bytes_per_logit(fused) == 2);
  CHECK(cost.estimate(eager, s, even_partition(model, 1)).memory_by_stage[0].activation_bytes -
            cost.estimate(fused, s, even_partition(model, 1)).memory_by_stage[0].activation_bytes ==
        Approx(823410688.0));
  Job megatron = eager;
  megatron.runtime = Runtime::kMegatron;
  Job megatron_fused = megatron;
  megatron_fused.loss = Loss::kFused;
  s.zero = 1;
  // Megatron-LM runs its own loss whatever the job says: it keeps the fp32 softmax.
  CHECK(head_kept_bytes_per_logit(megatron_fused) == 6);
  CHECK(cost.estimate(megatron, s, even_partition(model, 1)).peak_memory_bytes ==
        cost.estimate(megatron_fused, s, even_partition(model, 1)).peak_memory_bytes);
  // Loom's executor runs only the eager loss, so its runtime refuses a fused one.
  const Strategy plain;
  CHECK_FALSE(runtime_refusal(fused, plain).has_value());
  Job loom_fused = fused;
  loom_fused.runtime = Runtime::kLoom;
  const auto why = runtime_refusal(loom_fused, plain);
  REQUIRE(why.has_value());
  CHECK_THAT(*why, Catch::Matchers::Contains("runs the eager loss"));
  // The plan's job says so only when fused.
  CHECK_FALSE(job_to_json(eager).contains("loss"));
  CHECK(job_to_json(fused)["loss"] == "fused");
  CHECK(job_from_json(job_to_json(fused), "plan.json", "$.job") == fused);
}

TEST_CASE("torch.compile is a job field that only PyTorch runtimes take", "[runtime][compile]") {
  Job job{64, 1024, Precision::kBf16, "adamw"};
  CHECK_FALSE(job_to_json(job).contains("compile"));
  job.runtime = Runtime::kFsdp;
  job.compile = true;
  CHECK(job_to_json(job)["compile"] == true);
  CHECK(job_from_json(job_to_json(job), "plan.json", "$.job") == job);
  Strategy s;
  CHECK_FALSE(runtime_refusal(job, s).has_value());
  job.runtime = Runtime::kDeepspeed;
  CHECK_FALSE(runtime_refusal(job, s).has_value());
  for (Runtime r : {Runtime::kLoom, Runtime::kMegatron}) {
    job.runtime = r;
    const auto why = runtime_refusal(job, s);
    REQUIRE(why.has_value());
    CHECK_THAT(*why, Catch::Matchers::Contains("torch.compile is not available"));
  }
}

TEST_CASE("fsdp reduces gradients in the job's reduce_dtype", "[runtime][overlap][memory]") {
  Job job = bf16_job(Runtime::kFsdp);
  job.reduce_precision = Precision::kBf16;
  CHECK(fsdp_runtime_rules().reduce_bytes_per_parameter(bf16_job(Runtime::kFsdp)) == 4);
  CHECK(fsdp_runtime_rules().reduce_bytes_per_parameter(job) == 2);
  // FULL_SHARD as in "each runtime's data-parallel exposure", the reduce-scatter of bf16
  // gradients 2 s instead of 4: the backward's gather (2 s) and reduction, max(4 - 2, 0.2) = 2
  // per micro-batch, two micro-batches; the forward's gather unchanged.
  const DataParallelExposure f =
      fsdp_runtime_rules().exposure(job, dp8(3), linear_links(1e9, 1e8, 2));
  CHECK(f.parameter_s == Approx(2));
  CHECK(f.gradient_s == Approx(4));
  // The block's unsharded gradient before its reduce-scatter in bf16: 2 * kLayer = 402,759,680
  // where fp32 held 805,519,360; the sharded states stay fp32.
  const RuntimeMemory m = fsdp_runtime_rules().memory(job, dp8(3), layers_on_rank(4));
  CHECK(m.states.gradient_bytes == 402759680);
  CHECK(m.buffer_bytes == 805519360.0 + 402759680);
  // A plan file names it; a runtime whose reduction has another width refuses it.
  CHECK(job_to_json(job)["reduce_dtype"] == "bf16");
  CHECK(job_from_json(job_to_json(job), "plan.json", "$.job") == job);
  CHECK_FALSE(job_to_json(bf16_job(Runtime::kFsdp)).contains("reduce_dtype"));
  Strategy s;
  CHECK_FALSE(runtime_refusal(job, s).has_value());
  job.runtime = Runtime::kDeepspeed;  // reduces in the job's width, bf16
  CHECK_FALSE(runtime_refusal(job, s).has_value());
  job.runtime = Runtime::kLoom;  // fp32 gradients
  const auto why = runtime_refusal(job, s);
  REQUIRE(why.has_value());
  CHECK_THAT(*why, Catch::Matchers::Contains("reduces gradients in 4-byte elements"));
  job.runtime = Runtime::kMegatron;  // --grad-reduce-in-bf16
  CHECK_FALSE(runtime_refusal(job, s).has_value());
  job.reduce_precision = Precision::kFp32;
  CHECK_FALSE(runtime_refusal(job, s).has_value());
}

TEST_CASE("a half model is a job field that turns Loom's autocast off", "[runtime][autocast]") {
  Job job{64, 384, Precision::kFp16, "adamw"};
  CHECK(trains_under_autocast(job));
  CHECK(state_element_bytes(job) == 4);
  CHECK_FALSE(job_to_json(job).contains("half_model"));
  job.half_model = true;
  CHECK_FALSE(trains_under_autocast(job));
  CHECK(state_element_bytes(job) == 2);
  CHECK(job_to_json(job)["half_model"] == true);
  CHECK(job_from_json(job_to_json(job), "plan.json", "$.job") == job);
  // The other runtimes keep 16-bit models anyway; 4-byte precisions have no autocast.
  job.half_model = false;
  job.runtime = Runtime::kDeepspeed;
  CHECK_FALSE(trains_under_autocast(job));
  job.runtime = Runtime::kLoom;
  job.precision = Precision::kTf32;
  CHECK_FALSE(trains_under_autocast(job));
}

TEST_CASE("loom's ZeRO-3 backward gathers leave the lookup tables out", "[runtime][zero]") {
  // 1e9 parameters, 3e8 of them embedding tables only looked up; nothing hides the gathers:
  // bf16, 1 GB/s. Per micro-batch the forward gathers 2 GB (2 s) and the backward 1.4 GB (1.4 s);
  // two micro-batches: 6.8 s. FSDP gathers each wrapped block whole: 2 * (2 + 2) = 8 s.
  DataParallelInput in = linear_links(1e9, 1e8, 2);
  in.forward_window_s = 0;
  in.backward_window_s = 0;
  in.backward_ungathered_num_parameters = 3e8;
  CHECK(loom_runtime_rules().exposure(bf16_job(Runtime::kLoom), dp8(3), in).parameter_s ==
        Approx(6.8));
  CHECK(loom_runtime_rules().skips_lookup_gathers);
  CHECK_FALSE(fsdp_runtime_rules().skips_lookup_gathers);
  CHECK_FALSE(deepspeed_runtime_rules().skips_lookup_gathers);
  // The tables: BERT-base's word (30522 x 768), position (512 x 768) and token-type (2 x 768)
  // embeddings; a tied LM head reads the word table, so only positions and types remain.
  loom::profiles::ModelSpec bert = load_model("bert-base");
  CHECK(count_parameters(bert).lookup_tables.sharded == 30522 * 768);
  CHECK(count_parameters(bert).lookup_tables.replicated == (512 + 2) * 768);
  bert.num_labels.reset();
  bert.tied_embeddings = true;
  CHECK(count_parameters(bert).lookup_tables.sharded == 0);
  CHECK(count_parameters(bert).lookup_tables.replicated == (512 + 2) * 768);
}

TEST_CASE("loom's ZeRO-3 forward gathers read only the rows the dp group looks up",
          "[runtime][zero]") {
  // BERT-base's tables: 30 522 word, 512 position and 2 token-type rows of 768. At dp 8, one
  // sample of 128 tokens a rank, the group looks up at most 1 024 word rows, 128 positions and
  // both types: 768 * 1 154 = 886 272 parameters of the 31 036 * 768 = 23 835 648.
  const loom::profiles::ModelSpec bert = load_model("bert-base");
  Job job = bf16_job(Runtime::kLoom);
  job.seq_len = 128;
  const Strategy s = dp8(3);
  const double lookup = 31036.0 * 768;
  CHECK(count_parameters(bert).lookup_tables.per_rank(1) == lookup);
  CHECK(lookup_rows_read(bert, 1, 8 * 128, 128) == 886272);
  CHECK(forward_ungathered_num_parameters(job, bert, s, lookup) == lookup - 886272);
  // First the ranks all-reduce a mask of the rows in fp32: 4 * 31 036 bytes.
  CHECK(lookup_table_rows(bert, 1) == 31036);
  CHECK(lookup_mask_bytes(job, bert, s, lookup) == 124144);
  // Enough tokens to read every row: nothing is left out. Under tp 2 a rank holds 15 261 word
  // rows.
  CHECK(lookup_rows_read(bert, 1, 1 << 20, 128) == (30522 + 128 + 2) * 768);
  CHECK(lookup_rows_read(bert, 2, 1 << 20, 128) == (15261 + 128 + 2) * 768);
  CHECK(lookup_table_rows(bert, 2) == 15261 + 512 + 2);
  // No tables on the chunk, one dp rank, or a runtime that gathers blocks whole: all gathered.
  CHECK(forward_ungathered_num_parameters(job, bert, s, 0) == 0);
  CHECK(lookup_mask_bytes(job, bert, s, 0) == 0);
  Strategy alone = s;
  alone.dp = 1;
  CHECK(forward_ungathered_num_parameters(job, bert, alone, lookup) == 0);
  job.runtime = Runtime::kFsdp;
  CHECK(forward_ungathered_num_parameters(job, bert, s, lookup) == 0);
  CHECK(lookup_mask_bytes(job, bert, s, lookup) == 0);

  // The exposure at 1 GB/s, nothing hidden: 1e9 parameters (bf16), 2.9e8 of them rows no rank
  // reads, 3e8 tables. Per micro-batch: the mask (4 MB, 0.004 s), the forward's 1.42 GB and the
  // backward's 1.4 GB; two micro-batches: 5.648 s.
  DataParallelInput in = linear_links(1e9, 1e8, 2);
  in.forward_window_s = 0;
  in.backward_window_s = 0;
  in.backward_ungathered_num_parameters = 3e8;
  in.forward_ungathered_num_parameters = 2.9e8;
  in.lookup_mask_bytes = 4e6;
  CHECK(loom_runtime_rules().exposure(bf16_job(Runtime::kLoom), dp8(3), in).parameter_s ==
        Approx(5.648));
}

TEST_CASE("parameter tensors as Hugging Face's modules hold them", "[runtime][layers]") {
  auto tensors = [](const loom::profiles::ModelSpec& m) {
    const ParameterCounts c = count_parameters(m);
    return std::vector<std::int64_t>{c.embedding.tensors, c.transformer_layer.tensors,
                                     c.head.tensors};
  };
  using V = std::vector<std::int64_t>;
  // BertForSequenceClassification: word, position, token type, LayerNorm (2); 16 per layer;
  // pooler and classifier (2 each): 5 + 12 x 16 + 4 = 201.
  loom::profiles::ModelSpec bert = load_model("bert-base");
  CHECK(tensors(bert) == V{5, 16, 4});
  // RoBERTa's one token type is a table too; its head is dense and out_proj.
  CHECK(tensors(load_model("roberta-base")) == V{5, 16, 4});
  // DistilBERT has no token types: 4 + 6 x 16 + 4 = 104.
  loom::profiles::ModelSpec distil = bert;
  distil.type_vocab = 0;
  CHECK(tensors(distil)[0] == 4);
  // BertForMaskedLM: transform dense (2), LayerNorm (2), decoder bias, and the decoder weight
  // when it is not tied to the word table.
  loom::profiles::ModelSpec mlm = bert;
  mlm.num_labels.reset();
  CHECK(tensors(mlm)[2] == 5);
  mlm.tied_embeddings = false;
  CHECK(tensors(mlm)[2] == 6);
  // GPT2LMHeadModel, tied: wte and wpe, 12 per layer, ln_f: 2 + 12 x 12 + 2 = 148, DeepSpeed's
  // count for gpt2; GPT2ForSequenceClassification adds the score (no bias).
  loom::profiles::ModelSpec gpt2 = load_model("gpt2");
  CHECK(tensors(gpt2) == V{2, 12, 2});
  gpt2.num_labels = 2;
  CHECK(tensors(gpt2)[2] == 3);
  // LlamaForCausalLM: the word table; 9 per layer; the final RMSNorm and the LM head, which a
  // tied model does not have.
  loom::profiles::ModelSpec llama = load_model("gpt2");
  llama.gated_mlp = true;
  llama.activation = loom::profiles::Activation::kOther;
  llama.tied_embeddings = false;
  CHECK(tensors(llama) == V{1, 9, 2});
  llama.tied_embeddings = true;
  CHECK(tensors(llama)[2] == 1);
  // A gated encoder keeps an encoder's head, as count_parameters counts it.
  loom::profiles::ModelSpec gated_encoder = bert;
  gated_encoder.gated_mlp = true;
  CHECK(tensors(gated_encoder) == V{2, 9, 4});  // word and token-type tables, no norm
}

TEST_CASE("deepspeed's ZeRO-2 and ZeRO-3 hooks cost the host per parameter tensor and pass",
          "[runtime][estimate]") {
  const auto model = load_model("bert-base");
  const CostModel cost(model, load_cluster("dgx-a100-80g"));
  Job job{64, 128, Precision::kBf16, "adamw"};
  job.runtime = Runtime::kDeepspeed;
  Strategy s = dp8(1);
  s.micro_batch = 4;
  s.num_micro_batches = 2;
  const SequenceCosts z1 = cost.sequence_costs(job, s);
  s.zero = 2;
  const SequenceCosts z2 = cost.sequence_costs(job, s);
  s.zero = 3;
  const SequenceCosts z3 = cost.sequence_costs(job, s);
  // ZeRO-2: 0.15 ms per tensor in each backward pass; a BERT layer has 16 tensors (2.4 ms), the
  // embedding 5, the classification head 4.
  CHECK(z2.layer.forward_s == z1.layer.forward_s);
  CHECK(z2.layer.backward_s - z1.layer.backward_s == Approx(16 * 0.15e-3));
  CHECK(z2.embedding.backward_s - z1.embedding.backward_s == Approx(5 * 0.15e-3));
  CHECK(z2.head.backward_s - z1.head.backward_s == Approx(4 * 0.15e-3));
  // ZeRO-3: 1.2 ms per tensor, 0.4 in the forward pass and 0.8 in the backward.
  CHECK(z3.layer.forward_s - z1.layer.forward_s == Approx(16 * 0.4e-3));
  CHECK(z3.layer.backward_s - z1.layer.backward_s == Approx(16 * 0.8e-3));
  // Full recomputation runs the ZeRO-3 forward hooks again in the backward pass.
  s.recompute = Recompute::kFull;
  const SequenceCosts z3_full = cost.sequence_costs(job, s);
  s.zero = 1;
  const SequenceCosts z1_full = cost.sequence_costs(job, s);
  CHECK(z3_full.layer.backward_s - z1_full.layer.backward_s == Approx(16 * (0.8e-3 + 0.4e-3)));
  s.recompute = Recompute::kNone;
  // Loom's executor has no such hooks.
  job.runtime = Runtime::kLoom;
  s.zero = 1;
  const SequenceCosts loom1 = cost.sequence_costs(job, s);
  s.zero = 3;
  CHECK(cost.sequence_costs(job, s).layer.forward_s == loom1.layer.forward_s);
  // The estimate's step with one micro-batch (ZeRO-1 and ZeRO-2 then reduce alike): 12 layers,
  // the embedding and the head, backward only.
  job.runtime = Runtime::kDeepspeed;
  s.num_micro_batches = 1;
  job.global_batch = 32;
  s.zero = 1;
  const double step1 = cost.estimate(job, s, even_partition(model, 1)).step_time_s;
  s.zero = 2;
  const double step2 = cost.estimate(job, s, even_partition(model, 1)).step_time_s;
  const double host = (12 * 16 + 5 + 4) * 0.15e-3;  // 30.15 ms
  // ZeRO-2 also stages its gradients (zero_staging_bytes_per_parameter) and zeroes only its
  // gradient shard.
  const StepTerms terms = cost.step_terms(job, s);
  const auto parameters = static_cast<double>(count_parameters(model).total);
  const double staging_s =
      parameters * zero_staging_bytes_per_parameter(s) / terms.memory_bytes_per_s;
  const double zeroing_s = parameters * (1 - 1.0 / 8) * terms.zero_grad_s_per_parameter;
  CHECK(step2 - step1 == Approx(host + staging_s - zeroing_s).epsilon(1e-9));
  // What the plan prints on its own line: the same host time; at ZeRO-3 with full recomputation
  // 1.2 ms a tensor and the layers' forward hooks again (12 x 16 x 0.4 ms).
  CHECK(runtime_host_s_per_step(model, job, s) == Approx(host));
  s.zero = 3;
  s.recompute = Recompute::kFull;
  CHECK(runtime_host_s_per_step(model, job, s) ==
        Approx((12 * 16 + 5 + 4) * 1.2e-3 + 12 * 16 * 0.4e-3));
}

TEST_CASE("the job as Loom's executor runs it", "[runtime]") {
  Job job{64, 1024, Precision::kBf16, "adamw"};
  job.runtime = Runtime::kFsdp;
  job.half_model = true;
  job.reduce_precision = Precision::kBf16;
  job.tp_comm_overlap = true;
  const Job run = executor_job(job);
  CHECK_FALSE(run.tp_comm_overlap);
  CHECK(run.runtime == Runtime::kLoom);
  CHECK_FALSE(run.half_model);
  CHECK_FALSE(run.reduce_precision.has_value());
  CHECK(run.precision == Precision::kBf16);  // the rest as the plan says
  CHECK(run.global_batch == 64);
}
