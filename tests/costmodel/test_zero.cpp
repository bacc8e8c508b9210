// The ZeRO policy table: what each stage shards and when it communicates (zero.hpp).
#include <catch2/catch.hpp>
#include <stdexcept>

#include "costmodel/zero.hpp"

using namespace loom::costmodel;

namespace {

// Fields in the table's order: optimizer states, gradients, parameters sharded; reduces every
// micro-batch; gathers after the step; gathers before the forward; norm summed over dp.
ZeroPolicy row(bool o, bool g, bool p, bool every, bool after, bool before, bool norm) {
  return ZeroPolicy{o, g, p, every, after, before, norm};
}

}  // namespace

TEST_CASE("the ZeRO policy of each stage", "[zero]") {
  CHECK(zero_policy(0) == row(false, false, false, false, false, false, false));
  CHECK(zero_policy(1) == row(true, false, false, false, true, false, true));
  CHECK(zero_policy(2) == row(true, true, false, true, true, false, true));
  CHECK(zero_policy(3) == row(true, true, true, true, false, true, true));
  CHECK_THROWS_AS(zero_policy(-1), std::invalid_argument);
  CHECK_THROWS_AS(zero_policy(4), std::invalid_argument);
}
