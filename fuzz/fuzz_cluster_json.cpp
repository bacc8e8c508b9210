// Fuzz target: loom-cluster/1 documents, and the topology graph built from them.
#include "fuzz/fuzz_common.hpp"
#include "profiles/cluster.hpp"
#include "profiles/json_reader.hpp"
#include "profiles/topology.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  loom::fuzz::expect_input_error_only([&] {
    const auto json = loom::profiles::parse_json_text(loom::fuzz::text_of(data, size), "fuzz");
    const loom::profiles::Cluster cluster = loom::profiles::cluster_from_json(json, "fuzz");
    const loom::profiles::Topology topology(cluster);
    (void)topology.route(0, topology.device_count() - 1);
  });
  return 0;
}
