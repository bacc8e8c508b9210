// Megatron sequence parallelism in the cost model: the collectives each entry runs over the
// tensor-parallel group, their time, the strategy checks and what the simulator plays.
#include <catch2/catch.hpp>

#include "costmodel/estimate.hpp"
#include "costmodel/simulator.hpp"
#include "profiles/loader.hpp"

using namespace loom;
using namespace loom::costmodel;

namespace {

Strategy tensor_parallel(int tp, bool sp, Recompute recompute = Recompute::kNone) {
  Strategy s;
  s.tp = tp;
  s.micro_batch = 1;
  s.num_micro_batches = 1;
  s.sequence_parallel = sp;
  s.recompute = recompute;
  return s;
}

// GPT-2 (hidden 768, LM head) at micro-batch 1, sequence 1024, bf16: one micro-batch's hidden
// states are b s h e = 1 * 1024 * 768 * 2 = 1,572,864 bytes; the vocab-parallel cross-entropy
// reduces 3 fp32 scalars per token, 3 all-reduces of b s 4 = 4,096 bytes.
constexpr double kHiddenBytes = 1572864;
constexpr double kLossBytes = 4096;

const Job kJob{1, 1024, Precision::kBf16, "adamw"};

CostModel gpt2_on_a100() {
  return CostModel(profiles::load_model("gpt2"), profiles::load_cluster("dgx-a100-80g"));
}

using List = TensorParallelCollectives;

}  // namespace

TEST_CASE("sequence parallelism turns each all-reduce into an all-gather and a reduce-scatter",
          "[sequence_parallel]") {
  const CostModel cost = gpt2_on_a100();
  const StepTerms sp = cost.step_terms(kJob, tensor_parallel(2, true));
  // Per layer and micro-batch: all-gathers before the QKV and MLP-up GEMMs, reduce-scatters
  // after the attention-output and MLP-down GEMMs; backward mirrors them.
  CHECK(sp.layer.forward_tp == List{{Collective::kAllGather, 2, kHiddenBytes},
                                    {Collective::kReduceScatter, 2, kHiddenBytes}});
  CHECK(sp.layer.backward_tp == List{{Collective::kAllGather, 2, kHiddenBytes},
                                     {Collective::kReduceScatter, 2, kHiddenBytes}});
  // The vocab-parallel embedding reduce-scatters its output; its gradient is all-gathered.
  CHECK(sp.embedding.forward_tp == List{{Collective::kReduceScatter, 1, kHiddenBytes}});
  CHECK(sp.embedding.backward_tp == List{{Collective::kAllGather, 1, kHiddenBytes}});
  // The LM head all-gathers the sequence before its vocab-parallel GEMM.
  CHECK(sp.head.forward_tp ==
        List{{Collective::kAllGather, 1, kHiddenBytes}, {Collective::kAllReduce, 3, kLossBytes}});
  CHECK(sp.head.backward_tp == List{{Collective::kReduceScatter, 1, kHiddenBytes}});
  // Between stages the activation is already split: no all-gather after the transfer.
  CHECK(sp.p2p_all_gather_bytes == 0);

  const StepTerms plain = cost.step_terms(kJob, tensor_parallel(2, false));
  CHECK(plain.layer.forward_tp == List{{Collective::kAllReduce, 2, kHiddenBytes}});
  CHECK(plain.layer.backward_tp == List{{Collective::kAllReduce, 2, kHiddenBytes}});
  CHECK(plain.embedding.forward_tp == List{{Collective::kAllReduce, 1, kHiddenBytes}});
  CHECK(plain.embedding.backward_tp.empty());
  CHECK(plain.head.forward_tp == List{{Collective::kAllReduce, 3, kLossBytes}});
  CHECK(plain.head.backward_tp == List{{Collective::kAllReduce, 1, kHiddenBytes}});

  // Full recomputation replays the forward pass's collectives in the backward pass.
  const StepTerms full = cost.step_terms(kJob, tensor_parallel(2, true, Recompute::kFull));
  CHECK(full.layer.backward_tp == List{{Collective::kAllGather, 4, kHiddenBytes},
                                       {Collective::kReduceScatter, 4, kHiddenBytes}});
  // No tensor parallelism, no collectives.
  const StepTerms one = cost.step_terms(kJob, tensor_parallel(1, false));
  CHECK(one.layer.forward_tp.empty());
  CHECK(one.head.backward_tp.empty());
}

TEST_CASE("sequence parallelism moves the bytes of the all-reduces it replaces",
          "[sequence_parallel]") {
  // Per rank and layer, forward, at tp = 2: each all-gather and reduce-scatter moves (t-1)/t of
  // its 1,572,864-byte buffer, 786,432 bytes; two of each: 3,145,728 bytes. Without sequence
  // parallelism two all-reduces each move 2 (t-1)/t * 1,572,864 = 1,572,864 bytes: the same
  // 3,145,728 bytes.
  auto per_rank_bytes = [](const List& list, int tp) {
    double out = 0;
    for (const TensorParallelCollective& c : list) {
      const double share =
          c.collective == Collective::kAllReduce ? 2.0 * (tp - 1) / tp : 1.0 * (tp - 1) / tp;
      out += c.count * share * c.bytes;
    }
    return out;
  };
  const CostModel cost = gpt2_on_a100();
  const StepTerms sp = cost.step_terms(kJob, tensor_parallel(2, true));
  const StepTerms plain = cost.step_terms(kJob, tensor_parallel(2, false));
  CHECK(per_rank_bytes(sp.layer.forward_tp, 2) == 3145728);
  CHECK(per_rank_bytes(plain.layer.forward_tp, 2) == 3145728);
  CHECK(per_rank_bytes(sp.layer.backward_tp, 2) == 3145728);
  // The layer's cost adds the collectives' time over the tensor-parallel group (the first two
  // devices of a node) to its compute.
  const profiles::PathMetrics link = cost.group_links().group(2, 2, 1);
  const double ag = collective_time_s(Collective::kAllGather, kHiddenBytes, 2, link);
  const double rs = collective_time_s(Collective::kReduceScatter, kHiddenBytes, 2, link);
  CHECK(sp.costs.layer.forward_s == Approx(sp.layer.forward_compute_s + 2 * ag + 2 * rs));
  CHECK(sp.costs.layer.backward_s == Approx(sp.layer.backward_compute_s + 2 * ag + 2 * rs));
  CHECK(sp.costs.embedding.backward_s == Approx(sp.embedding.backward_compute_s + ag));
}

TEST_CASE("sequence parallelism needs tensor parallelism and a sequence it divides",
          "[sequence_parallel]") {
  const profiles::ModelSpec model = profiles::load_model("gpt2");
  CHECK(check_strategy(model, 8, kJob, tensor_parallel(1, true)) ==
        "sequence parallelism shards the sequence over the tensor-parallel group: it needs tp > 1 "
        "(found tp=1)");
  // Sequence parallelism stays the strategy's choice: off, tp = 1 is fine.
  CHECK(!check_strategy(model, 8, kJob, tensor_parallel(1, false)));
  CHECK(
      check_strategy(model, 8, Job{1, 1023, Precision::kBf16, "adamw"}, tensor_parallel(4, true)) ==
      "sequence parallelism needs tp=4 to divide seq_len=1023");
  CHECK(!check_strategy(model, 8, kJob, tensor_parallel(4, true)));
}

TEST_CASE("the simulator plays the all-gathers and reduce-scatters", "[sequence_parallel]") {
  const CostModel cost = gpt2_on_a100();
  const Strategy s = tensor_parallel(2, true);
  SimulationOptions options;
  options.record_trace = true;
  const SimulationResult sim = simulate(cost, kJob, s, even_partition(cost.model(), 1), options);
  // One chunk with every entry: forward 1 (embedding) + 12 x 4 (layers) + 1 + 3 (head) = 53
  // collectives, backward 1 + 12 x 4 + 1 = 50.
  int forward = 0;
  int backward = 0;
  for (const TraceSlice& x : sim.slices) {
    if (x.name == "all-gather/reduce-scatter tp F mb0 L0-13 (53x 1.5 MiB)") ++forward;
    if (x.name == "all-gather/reduce-scatter tp B mb0 L0-13 (50x 1.5 MiB)") ++backward;
  }
  CHECK(forward == 1);
  CHECK(backward == 1);
}
