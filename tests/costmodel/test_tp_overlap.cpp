// TransformerEngine's overlap of the tensor-parallel exchanges with the linear products
// (costmodel/tp_overlap.hpp): the exposed time of one exchange in closed form, a layer's four
// exchanges a pass against their windows, and the estimate with --tp-comm-overlap.
#include <catch2/catch.hpp>

#include "costmodel/estimate.hpp"
#include "costmodel/runtime.hpp"
#include "costmodel/tp_overlap.hpp"
#include "profiles/loader.hpp"

using namespace loom;
using namespace loom::costmodel;

TEST_CASE("an exchange beside a window of products adds what the window and a chunk cannot hide",
          "[tp_overlap]") {
  // 1 ms beside 4 ms of products, 4 chunks, compute 20 % slower while both run: the products
  // end at 4 + 1 * 0.2 / 1.2 ms, and the chunk that cannot overlap adds 1 / 4 ms.
  CHECK(overlapped_exchange_exposed_s(4e-3, 1e-3, 4, 0.2) ==
        Approx(0.2 / 1.2 * 1e-3 + 0.25e-3).epsilon(1e-12));
  // 5 ms beside 2 ms, 2 chunks, no slowdown: the exchange's 5 ms, and 2 / 2 ms of one chunk.
  CHECK(overlapped_exchange_exposed_s(2e-3, 5e-3, 2, 0) == Approx(5e-3 + 1e-3 - 2e-3));
  CHECK(overlapped_exchange_exposed_s(2e-3, 0, 2, 0.2) == 0);
  // No window (a measured layer): the whole exchange.
  CHECK(overlapped_exchange_exposed_s(0, 3e-3, 8, 0.2) == Approx(3e-3));
}

TEST_CASE("a layer's exchanges are rescaled to what their windows leave exposed", "[tp_overlap]") {
  LayerTime layer;
  layer.linear_forward_s = {3, 1, 4, 4};   // QKV, attention output, MLP input, MLP output
  layer.linear_backward_s = {6, 2, 8, 8};  // both gradients' products
  EntryTerms terms;
  terms.forward_tp = {{Collective::kAllGather, 2, 100}, {Collective::kReduceScatter, 2, 100}};
  terms.backward_tp = terms.forward_tp;
  EntryTerms full = terms;
  full.backward_tp = {{Collective::kAllGather, 4, 100}, {Collective::kReduceScatter, 4, 100}};
  // One all-gather and one reduce-scatter take 2 s each; tp 2, no slowdown. Forward: the
  // gathers beside QKV (3) and the MLP input (4) add 3 + 1 - 3 and 4 + 1 - 4, 2 s, one
  // gather's time; the scatters beside the attention output (1) and the MLP output (4) add
  // 2 + 0.5 - 1 and 1, 2.5 s. Backward: the gathers beside the attention output's (2) and the
  // MLP output's (8) products add 1 + 1; the scatters beside QKV's (6) and the MLP input's (8)
  // 1 + 1.
  overlap_layer_exchanges(layer, 2, 2, 2, 0, false, terms);
  CHECK(terms.forward_tp == TensorParallelCollectives{{Collective::kAllGather, 1, 100},
                                                      {Collective::kReduceScatter, 1.25, 100}});
  CHECK(terms.backward_tp == TensorParallelCollectives{{Collective::kAllGather, 1, 100},
                                                       {Collective::kReduceScatter, 1, 100}});
  // Full recomputation replays the forward's exchanges in the backward pass, as exposed.
  overlap_layer_exchanges(layer, 2, 2, 2, 0, true, full);
  CHECK(full.backward_tp == TensorParallelCollectives{{Collective::kAllGather, 2, 100},
                                                      {Collective::kReduceScatter, 2.25, 100}});
}

TEST_CASE("tp_comm_overlap hides part of a large layer's exchanges on an H100 node",
          "[tp_overlap]") {
  const CostModel cost(profiles::load_model("gpt3-175b"), profiles::load_cluster("dgx-h100"));
  Job job{64, 2048, Precision::kBf16, "adamw"};
  job.runtime = Runtime::kMegatron;
  Strategy s;
  s.dp = 1;
  s.tp = 8;
  s.pp = 4;
  s.micro_batch = 1;
  s.num_micro_batches = 64;
  s.sequence_parallel = true;
  s.recompute = Recompute::kSelective;
  s.attention = Attention::kFlash;
  const StepTerms plain = cost.step_terms(job, s);
  job.tp_comm_overlap = true;
  const StepTerms overlapped = cost.step_terms(job, s);
  // Two all-gathers and two reduce-scatters a pass without the overlap; with it, fewer (what
  // stays exposed), but not none: at tp 8 the attention output's product (h^2 / tp per token)
  // is shorter than its reduce-scatter over NVLink.
  REQUIRE(plain.layer.forward_tp.size() == 2);
  REQUIRE(overlapped.layer.forward_tp.size() == 2);
  for (int i = 0; i < 2; ++i) {
    INFO(i);
    CHECK(plain.layer.forward_tp[i].count == 2);
    CHECK(overlapped.layer.forward_tp[i].count > 0);
    CHECK(overlapped.layer.forward_tp[i].count < 2);
    CHECK(overlapped.layer.backward_tp[i].count < plain.layer.backward_tp[i].count);
  }
  // Compute and the embedding's and head's exchanges are not touched.
  CHECK(overlapped.layer.forward_compute_s == plain.layer.forward_compute_s);
  CHECK(overlapped.head.forward_tp == plain.head.forward_tp);
  const std::vector<StageRange> stages = even_partition(cost.model(), s.pp);
  job.tp_comm_overlap = false;
  const Prediction before = cost.estimate(job, s, stages);
  job.tp_comm_overlap = true;
  const Prediction after = cost.estimate(job, s, stages);
  CHECK(after.exposed_communication_s.tp < before.exposed_communication_s.tp);
  CHECK(after.step_time_s < before.step_time_s);
  // Only runtimes that run TransformerEngine overlap.
  job.runtime = Runtime::kFsdp;
  CHECK(runtime_refusal(job, s).value_or("") ==
        "runtime fsdp: tp_comm_overlap is TransformerEngine's userbuffers overlap: use runtime "
        "megatron or nemo, or tp_comm_overlap off");
}
