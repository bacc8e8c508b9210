// The dp / ZeRO flat-buffer engine driven directly, ranks as threads over Gloo: for every ZeRO
// stage and 2, 3 and 4 ranks the reduced gradient is the mean over ranks, the parameters after
// a step equal those of one rank that saw the mean gradient, the state round-trips, and every
// rank issues the same reductions in the same order.
#include <exception>
#include <thread>
#include <vector>

#include "executor/distributed.hpp"
#include "executor/flat_parameters.hpp"
#include "profiles/errors.hpp"
#include "tests/executor/thread_ranks.hpp"
#include "tests/executor/torch_catch.hpp"

using loom::executor::FlatOptions;
using loom::executor::FlatParameter;
using loom::executor::FlatParameters;
using loom::executor::FlatRanges;
using loom::executor::GroupOptions;
using loom::executor::ParallelGroups;

namespace {

using Chunks = std::vector<std::vector<FlatParameter>>;

using loom::test::run_ranks;

GroupOptions quick() {
  GroupOptions o;
  o.timeout = std::chrono::seconds(30);
  return o;
}

// Two chunks of parameters (19 elements; ZeRO-2/3 units of 11 and 8), the same values on every
// rank; every other parameter decays. Padded to 20 elements for 2 and 4 ranks and to 21 for 3,
// whether as one unit (ZeRO-0/1) or per chunk (12 + 8, 12 + 8, 12 + 9).
Chunks make_parameters() {
  const std::vector<std::vector<std::vector<std::int64_t>>> shapes = {{{5}, {3, 2}}, {{7}, {1}}};
  Chunks chunks;
  int index = 0;
  for (const auto& chunk_shapes : shapes) {
    std::vector<FlatParameter> chunk;
    for (const auto& shape : chunk_shapes) {
      const std::int64_t n = torch::prod(torch::tensor(shape)).item<std::int64_t>();
      torch::Tensor t = (torch::arange(n, torch::kFloat) * 0.25f + 0.5f * static_cast<float>(index))
                            .reshape(shape)
                            .requires_grad_(true);
      chunk.push_back({t, index % 2 == 0, true});
      ++index;
    }
    chunks.push_back(chunk);
  }
  return chunks;
}

// The per-rank input of parameter i: small integers, so that every sum and mean over ranks is
// exact in fp32.
torch::Tensor base_input(const torch::Tensor& p, int i) {
  return (torch::arange(p.numel(), torch::kFloat).remainder(5) + 1 + i).reshape(p.sizes());
}

// One step's backward passes: for each micro-batch the chunks from the last, the step's last
// pass armed; the loss is sum(p * factor * base_input), so each gradient is factor * base_input
// per micro-batch.
void run_passes(FlatParameters& flat, const Chunks& chunks, float factor, int micro_batches) {
  for (int m = 0; m < micro_batches; ++m) {
    for (int k = static_cast<int>(chunks.size()) - 1; k >= 0; --k) {
      if (k == 0 && m == micro_batches - 1) flat.arm();
      torch::Tensor loss = torch::zeros({});
      int i = k == 0 ? 0 : static_cast<int>(chunks[0].size());
      for (const FlatParameter& p : chunks[static_cast<std::size_t>(k)]) {
        loss = loss + (p.tensor * base_input(p.tensor, i++) * factor).sum();
      }
      loss.backward();
      flat.finish_backward(k);
    }
  }
}

// The whole model's gradient as one flat vector (each parameter at `offsets`, padding zero):
// `scale` times every base input.
torch::Tensor expected_gradient(const Chunks& chunks, std::int64_t padded,
                                const std::vector<std::int64_t>& offsets, float scale) {
  torch::Tensor out = torch::zeros({padded});
  std::size_t i = 0;
  for (const auto& chunk : chunks) {
    for (const FlatParameter& p : chunk) {
      out.narrow(0, offsets[i], p.tensor.numel())
          .copy_(base_input(p.tensor, static_cast<int>(i)).reshape({-1}) * scale);
      ++i;
    }
  }
  return out;
}

// The parts of `full` at `ranges`, concatenated (a rank's shard).
torch::Tensor gather_ranges(const torch::Tensor& full, const FlatRanges& ranges) {
  std::vector<torch::Tensor> parts;
  for (const auto& [start, length] : ranges) parts.push_back(full.narrow(0, start, length));
  return torch::cat(parts);
}

torch::Tensor full_parameters(FlatParameters& flat, const Chunks& chunks) {
  flat.materialize();  // ZeRO-3 holds only its shard between steps
  std::vector<torch::Tensor> parts;
  for (const auto& chunk : chunks) {
    for (const FlatParameter& p : chunk) parts.push_back(p.tensor.detach().reshape({-1}).clone());
  }
  flat.release();
  return torch::cat(parts);
}

struct StepResult {
  torch::Tensor grad;  // what this rank updated with
  double norm = 0;     // the global gradient norm
};

// One optimizer step: passes, reduction, global norm, AdamW (lr 1e-2).
StepResult train_step(FlatParameters& flat, const Chunks& chunks, float factor, int micro_batches) {
  flat.materialize();
  flat.zero_grad();
  run_passes(flat, chunks, factor, micro_batches);
  const torch::Tensor grad = flat.reduce_gradients();
  StepResult result{grad.clone(), flat.global_norm(grad).item<double>()};
  flat.step(grad, 1e-2);
  flat.release();
  return result;
}

FlatOptions options(int zero) {
  FlatOptions o;
  o.zero = zero;
  o.weight_decay = 0.1;
  o.bucket_bytes = 16;  // four elements: several buckets per chunk
  o.overlap = true;
  return o;
}

bool same(const torch::Tensor& a, const torch::Tensor& b) {
  return a.sizes() == b.sizes() && torch::allclose(a, b, 1e-6, 1e-7);
}

}  // namespace

TEST_CASE("FlatParameters: mean gradient, single-rank step, state and bucket order per ZeRO stage",
          "[distributed][flat]") {
  constexpr int kMicroBatches = 2;
  for (const int dp : {2, 3, 4}) {
    const float mean_factor = static_cast<float>(dp + 1) / 2.0f;
    // One rank that sees the mean of the ranks' gradients, without ZeRO.
    Chunks reference_chunks = make_parameters();
    ParallelGroups one(loom::executor::make_local_store(), 0, 1, 1, 1, quick());
    FlatParameters reference(reference_chunks, options(0), one, torch::kCPU);
    const StepResult reference_step =
        train_step(reference, reference_chunks, mean_factor, kMicroBatches);
    const torch::Tensor reference_after_1 = full_parameters(reference, reference_chunks);
    train_step(reference, reference_chunks, mean_factor, kMicroBatches);
    const torch::Tensor reference_after_2 = full_parameters(reference, reference_chunks);
    const torch::Tensor expected = expected_gradient(
        reference_chunks, 19, reference.parameter_offsets(), mean_factor * kMicroBatches);
    CHECK(reference_step.grad.numel() == 19);  // a group of one pads nothing

    for (const int zero : {0, 1, 2, 3}) {
      INFO("dp " << dp << " zero " << zero);
      const auto store = loom::executor::make_local_store();
      const auto n = static_cast<std::size_t>(dp);
      std::vector<FlatRanges> logs(n);
      std::vector<torch::Tensor> grads(n), wanted(n), after_1(n), after_2(n), restored_2(n);
      std::vector<double> norms(n);
      std::vector<std::int64_t> padded(n);
      run_ranks(dp, [&](int rank) {
        const auto r = static_cast<std::size_t>(rank);
        ParallelGroups groups(store, rank, dp, 1, 1, quick());
        Chunks chunks = make_parameters();
        FlatParameters flat(chunks, options(zero), groups, torch::kCPU);
        const float factor = static_cast<float>(rank + 1);
        const StepResult step = train_step(flat, chunks, factor, kMicroBatches);
        logs[r] = flat.reduction_log();
        grads[r] = step.grad;
        norms[r] = step.norm;
        padded[r] = flat.padded_numel();
        // (From fresh parameters: ZeRO-3 released these.)
        const torch::Tensor full =
            expected_gradient(make_parameters(), flat.padded_numel(), flat.parameter_offsets(),
                              mean_factor * kMicroBatches);
        wanted[r] = zero == 0 ? full : gather_ranges(full, flat.shard_ranges());
        after_1[r] = full_parameters(flat, chunks);
        // A fresh engine over fresh parameters, loaded with this rank's state.
        const std::vector<torch::Tensor> saved = flat.state();
        Chunks other = make_parameters();
        FlatParameters restored(other, options(zero), groups, torch::kCPU);
        restored.load_state(saved, "test state");
        train_step(flat, chunks, factor, kMicroBatches);
        train_step(restored, other, factor, kMicroBatches);
        after_2[r] = full_parameters(flat, chunks);
        restored_2[r] = full_parameters(restored, other);
      });
      for (std::size_t r = 0; r < n; ++r) {
        INFO("rank " << r);
        CHECK(padded[r] == (19 + dp - 1) / dp * dp);
        CHECK(grads[r].numel() == (zero == 0 ? padded[r] : padded[r] / dp));
        CHECK(torch::equal(grads[r], wanted[r]));
        CHECK(norms[r] == Approx(expected.norm().item<double>()).epsilon(1e-6));
        CHECK(same(after_1[r], reference_after_1));
        CHECK(same(after_2[r], reference_after_2));
        CHECK(torch::equal(restored_2[r], after_2[r]));
        CHECK(logs[r] == logs[0]);
      }
      // Overlapped (ZeRO-0/1) and sharded (ZeRO-2/3) reductions go in buckets.
      CHECK(logs[0].size() > 2);
    }
  }
}

TEST_CASE("FlatParameters refuses a state of another layout", "[distributed][flat]") {
  ParallelGroups one(loom::executor::make_local_store(), 0, 1, 1, 1, quick());
  Chunks chunks = make_parameters();
  FlatParameters flat(chunks, options(1), one, torch::kCPU);
  std::vector<torch::Tensor> state = flat.state();
  state[0] = torch::zeros({3});
  CHECK_THROWS_AS(flat.load_state(state, "test state"), loom::InputError);
}
