// The ZeRO policy table: what each stage shards and when it communicates (zero.hpp).
#include <catch2/catch.hpp>
#include <stdexcept>

#include "costmodel/zero.hpp"

using namespace loom::costmodel;

namespace {

// Fields in the table's order: optimizer states, gradients, parameters sharded; reduces every
// micro-batch; gathers after the step; gathers before the forward; norm summed over dp; gathers
// block by block; reduce-scatters the gradients.
ZeroPolicy row(bool o, bool g, bool p, bool every, bool after, bool before, bool norm,
               bool per_block, bool reduce_scatter) {
  return ZeroPolicy{o, g, p, every, after, before, norm, per_block, reduce_scatter};
}

}  // namespace

TEST_CASE("the ZeRO policy of each stage", "[zero]") {
  CHECK(zero_policy(0) == row(false, false, false, false, false, false, false, false, false));
  CHECK(zero_policy(1) == row(true, false, false, false, true, false, true, false, false));
  CHECK(zero_policy(2) == row(true, true, false, true, true, false, true, false, true));
  CHECK(zero_policy(3) == row(true, true, true, true, false, true, true, true, true));
  CHECK_THROWS_AS(zero_policy(-1), std::invalid_argument);
  CHECK_THROWS_AS(zero_policy(4), std::invalid_argument);
}

TEST_CASE("ZeRO-3 gathers every block twice per micro-batch, two held at once", "[zero]") {
  CHECK(zero3_gathers_per_micro_batch(1) == 2);
  CHECK(zero3_gathers_per_micro_batch(26) == 52);  // BERT-large: embeddings, 24 layers, head
  CHECK(kZero3GatheredUnits == 2);
}
