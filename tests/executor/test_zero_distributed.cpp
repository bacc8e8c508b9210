// ZeRO's communication on many ranks (threads over Gloo): the reduce-scatter, and ZeRO-3's
// block-by-block gathers counted against the cost model's rules (costmodel/zero.hpp).
#include <algorithm>
#include <map>
#include <memory>
#include <vector>

#include "costmodel/layers.hpp"
#include "costmodel/zero.hpp"
#include "executor/distributed.hpp"
#include "executor/flat_parameters.hpp"
#include "executor/model.hpp"
#include "executor/reshard.hpp"
#include "tests/executor/thread_ranks.hpp"
#include "tests/executor/torch_catch.hpp"

using loom::executor::EncoderClassifier;
using loom::executor::EncoderInputs;
using loom::executor::EncoderOptions;
using loom::executor::FlatOptions;
using loom::executor::FlatParameters;
using loom::executor::GroupOptions;
using loom::executor::ParallelGroups;
using loom::test::run_ranks;

namespace {

GroupOptions quick(bool p2p_by_order) {
  GroupOptions o;
  o.timeout = std::chrono::seconds(30);
  o.p2p_by_order = p2p_by_order;
  return o;
}

loom::profiles::ModelSpec tiny_bert(std::int64_t layers) {
  loom::profiles::ModelSpec m;
  m.name = "tiny";
  m.model_type = loom::profiles::ModelType::kBert;
  m.layers = layers;
  m.hidden = 32;
  m.heads = 4;
  m.ffn_hidden = 64;
  m.vocab = 40;
  m.max_positions = 16;
  m.type_vocab = 2;
  m.num_labels = 2;
  return m;
}

}  // namespace

TEST_CASE("Gloo's reduce-scatter sums each rank's chunk", "[distributed][zero]") {
  for (const bool by_order : {false, true}) {
    for (const int size : {2, 3, 4}) {
      INFO(size << " ranks, p2p_by_order " << by_order);
      const auto store = loom::executor::make_local_store();
      constexpr std::int64_t kChunk = 5;
      std::vector<torch::Tensor> got(static_cast<std::size_t>(size));
      std::vector<torch::Tensor> in_place(static_cast<std::size_t>(size));
      run_ranks(size, [&](int rank) {
        ParallelGroups groups(store, rank, size, 1, 1, quick(by_order));
        // Rank r's input: element i is (r + 1) * (i + 1), so the sum is (i + 1) * n (n + 1) / 2.
        const torch::Tensor input =
            torch::arange(1, size * kChunk + 1, torch::kFloat) * static_cast<float>(rank + 1);
        torch::Tensor output = torch::empty({kChunk});
        groups.dp().reduce_scatter_sum(output, input);
        got[static_cast<std::size_t>(rank)] = output;
        // In place: the output is this rank's chunk of the input (a fresh one: on Gloo the input
        // holds the whole sum afterwards).
        torch::Tensor buffer =
            torch::arange(1, size * kChunk + 1, torch::kFloat) * static_cast<float>(rank + 1);
        torch::Tensor mine = buffer.narrow(0, rank * kChunk, kChunk);
        groups.dp().reduce_scatter_sum(mine, buffer);
        in_place[static_cast<std::size_t>(rank)] = mine.clone();
      });
      const float ranks_sum = static_cast<float>(size * (size + 1) / 2);
      for (int r = 0; r < size; ++r) {
        const torch::Tensor want =
            torch::arange(r * kChunk + 1, (r + 1) * kChunk + 1, torch::kFloat) * ranks_sum;
        CHECK(torch::equal(got[static_cast<std::size_t>(r)], want));
        CHECK(torch::equal(in_place[static_cast<std::size_t>(r)], want));
      }
    }
  }
}

TEST_CASE("ZeRO-3 gathers each block before its forward and its backward, two at a time",
          "[distributed][zero]") {
  // Embeddings, 3 layers and the head: 5 blocks; dp 2.
  constexpr int kDp = 2;
  const loom::profiles::ModelSpec spec = tiny_bert(3);
  const int blocks = static_cast<int>(spec.layers) + 2;
  // Each block's elements padded to a multiple of dp: the gathered buffer of its unit.
  std::map<int, std::int64_t> block_numel;
  for (const auto& info : loom::executor::parameter_table(spec)) {
    std::int64_t n = 1;
    for (std::int64_t d : info.shape) n *= d;
    block_numel[info.layer] += n;
  }
  std::int64_t largest = 0;
  std::int64_t adjacent_pair = 0;
  for (auto& [layer, n] : block_numel) {
    n = (n + kDp - 1) / kDp * kDp;
    largest = std::max(largest, n);
    if (block_numel.count(layer + 1) != 0) {
      const std::int64_t next = (block_numel.at(layer + 1) + kDp - 1) / kDp * kDp;
      adjacent_pair = std::max(adjacent_pair, n + next);
    }
  }
  const auto store = loom::executor::make_local_store();
  std::vector<std::int64_t> gathers(kDp), peak(kDp), held_after(kDp), elements(kDp);
  run_ranks(kDp, [&](int rank) {
    ParallelGroups groups(store, rank, kDp, 1, 1, quick(false));
    EncoderOptions model_options;
    model_options.dropout = 0.0;
    model_options.seed = 3;
    std::vector<std::unique_ptr<EncoderClassifier>> chunks;
    chunks.push_back(std::make_unique<EncoderClassifier>(spec, model_options));
    FlatOptions flat_options;
    flat_options.zero = 3;
    flat_options.bucket_bytes = 256;  // several pieces per block
    FlatParameters flat(loom::executor::flat_parameters_of(chunks, true), flat_options, groups,
                        torch::kCPU);
    chunks[0]->set_layer_hooks(flat.layer_hooks(0));
    flat.zero_grad();
    EncoderInputs inputs;
    // Rank 0 looks up word rows 0-15, rank 1 rows 8-23.
    inputs.input_ids = (torch::arange(16, torch::kLong) + 8 * rank).remainder(40).view({2, 8});
    const torch::Tensor labels = torch::tensor({0, 1}, torch::kLong);
    torch::nn::functional::cross_entropy(chunks[0]->forward(inputs), labels).backward();
    flat.finish_backward(0);
    gathers[static_cast<std::size_t>(rank)] = flat.gather_count();
    peak[static_cast<std::size_t>(rank)] = flat.peak_gathered_numel();
    elements[static_cast<std::size_t>(rank)] = flat.gathered_elements();
    // Nothing stays gathered after the backward pass: a second step starts from the shard.
    flat.zero_grad();
    held_after[static_cast<std::size_t>(rank)] = flat.peak_gathered_numel();
  });
  for (int r = 0; r < kDp; ++r) {
    INFO("rank " << r);
    const auto i = static_cast<std::size_t>(r);
    // Every block once before its forward and once before its backward.
    CHECK(gathers[i] == loom::costmodel::zero3_gathers_per_micro_batch(blocks));
    CHECK(gathers[i] == 10);
    // Two neighbours at most (the block computing and the next one's gather in flight): here two
    // transformer layers of 8 544 (query, key, value, output 4 * (32 * 32 + 32), intermediate
    // 64 * 32 + 64, output 32 * 64 + 32, two LayerNorms 2 * 64); the embeddings hold 1 920
    // ((40 + 16 + 2) * 32 + 64), the head 1 122.
    CHECK(peak[i] == adjacent_pair);
    CHECK(adjacent_pair == 2 * 8544);
    CHECK(peak[i] <= loom::costmodel::kZero3GatheredUnits * largest);
    CHECK(held_after[i] == 0);
    // The backward pass gathers the embeddings' LayerNorm only: the word, position and token-type
    // tables, (40 + 16 + 2) * 32 = 1 856 elements, are looked up, and a lookup's backward reads
    // no values. The cost model leaves out the same tables.
    const std::int64_t lookup = (40 + 16 + 2) * 32;
    CHECK(loom::costmodel::count_parameters(spec).lookup_tables.per_rank(1) == lookup);
    // The forward pass gathers the rows some rank looks up: words 0-23, positions 0-7, type 0,
    // (24 + 8 + 1) * 32 = 1 056 elements. The cost model's bound for 2 ranks of 16 tokens:
    // 32 word rows, 8 positions, 2 types.
    const std::int64_t read = (24 + 8 + 1) * 32;
    CHECK(loom::costmodel::lookup_rows_read(spec, 1, 2 * 16, 8) == (32 + 8 + 2) * 32);
    CHECK(elements[i] == 2 * (1920 + 3 * 8544 + 1122) - lookup - (lookup - read));
  }
}
