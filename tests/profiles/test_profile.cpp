// loom-profile/1: round trip, strict reading, and refusal of a profile made for another model or
// precision.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "profiles/errors.hpp"
#include "profiles/loader.hpp"
#include "profiles/profile.hpp"

using namespace loom;
using namespace loom::profiles;
using Catch::Contains;
using nlohmann::json;

namespace {

json valid_profile() {
  return json::parse(R"({
    "format": "loom-profile/1",
    "device": "NVIDIA H200", "torch_version": "2.11.0", "created": "2026-11-22T10:00:00Z",
    "precision": "bf16",
    "layers": [
      {"kind": "encoder_layer", "hidden": 768, "heads": 12, "ffn_hidden": 3072, "seq_len": 512,
       "micro_batch": 8, "tp": 1, "forward_s": 0.0012, "backward_s": 0.0024,
       "activation_bytes": 123456789, "parameter_bytes": 14175744, "chained_layers": 12},
      {"kind": "embedding", "hidden": 768, "heads": 12, "ffn_hidden": 3072, "vocab": 30522,
       "seq_len": 512, "micro_batch": 8, "tp": 2, "threads": 4, "recompute": "none",
       "forward_s": 0.0001, "backward_s": 0.0002, "activation_bytes": 1000,
       "parameter_bytes": 2000, "peak_temporary_bytes": 3000, "tp_communication": true}
    ],
    "links": [
      {"collective": "allreduce", "ranks": 8, "bytes": 67108864, "time_s": 0.0009,
       "scope": "intra_node"}
    ],
    "optimizer": [
      {"parameters": 1000, "threads": 2, "time_s": 0.001},
      {"parameters": 1000, "threads": 2, "time_s": 0.002, "flat": true}
    ]
  })");
}

std::string error_of(const json& j) {
  try {
    profile_from_json(j, "prof.json");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("a profile round-trips through JSON", "[profile]") {
  Profile p = profile_from_json(valid_profile(), "prof.json");
  REQUIRE(p.layers.size() == 2);
  CHECK(p.layers[0].kind == LayerKind::kEncoderLayer);
  CHECK(p.layers[0].forward_s == 0.0012);
  CHECK(p.layers[0].recompute == "none");
  CHECK(p.layers[0].threads == 1);
  CHECK(p.layers[1].threads == 4);
  CHECK(p.layers[1].vocab == 30522);
  CHECK(p.layers[1].peak_temporary_bytes == 3000);
  CHECK(p.layers[1].tp_communication);
  CHECK_FALSE(p.layers[0].tp_communication);
  CHECK(p.layers[0].chained_layers == 12);
  CHECK(p.layers[1].chained_layers == 1);  // absent: timed alone
  CHECK(p.links[0].bytes == 67108864);
  CHECK(p.precision == Precision::kBf16);
  REQUIRE(p.optimizer.size() == 2);
  CHECK_FALSE(p.optimizer[0].flat);
  CHECK(p.optimizer[1].flat);
  CHECK(p.layers[0].attention == "math");  // absent: the unfused core
  p.layers[0].attention = "flash";
  Profile again = profile_from_json(profile_to_json(p), "again.json");
  CHECK(again == p);
  CHECK(profile_to_json(p)["layers"][0]["attention"] == "flash");
  CHECK_FALSE(profile_to_json(p)["layers"][1].contains("attention"));
  CHECK(profile_to_json(p)["layers"][0]["chained_layers"] == 12);
  CHECK_FALSE(profile_to_json(p)["layers"][1].contains("chained_layers"));
}

TEST_CASE("malformed profiles are refused with the field named", "[profile]") {
  json j = valid_profile();
  j["format"] = "loom-plan/1";
  CHECK_THAT(error_of(j), Contains("$.format"));

  j = valid_profile();
  j["layers"][0]["forward_s"] = -1;
  CHECK_THAT(error_of(j), Contains("$.layers[0].forward_s"));

  j = valid_profile();
  j["optimizer"][1]["flat"] = "yes";
  CHECK_THAT(error_of(j), Contains("$.optimizer[1].flat"));

  j = valid_profile();
  j["layers"][0]["kind"] = "mlp";
  CHECK_THAT(error_of(j), Contains("$.layers[0].kind"));

  j = valid_profile();
  j["layers"][0]["heads"] = 7;
  CHECK_THAT(error_of(j), Contains("divisor of hidden"));

  j = valid_profile();
  j["layers"][1]["micro_batch"] = 0;
  CHECK_THAT(error_of(j), Contains("$.layers[1].micro_batch"));

  j = valid_profile();
  j["layers"][0]["tp_communication"] = true;  // tp 1 has no all-reduces to include
  CHECK_THAT(error_of(j), Contains("$.layers[0].tp_communication"));

  j = valid_profile();
  j["links"][0]["collective"] = "broadcast";
  CHECK_THAT(error_of(j), Contains("$.links[0].collective"));

  j = valid_profile();
  j["links"][0]["ranks"] = 1;
  CHECK_THAT(error_of(j), Contains("$.links[0].ranks"));

  j = valid_profile();
  j["layers"][0]["fwd_s"] = 1;
  CHECK_THAT(error_of(j), Contains("unknown field"));

  j = valid_profile();
  j["layers"] = json::array();
  j["links"] = json::array();
  CHECK_THAT(error_of(j), Contains("at least one layer or link"));

  CHECK_THROWS_AS(load_profile("/nonexistent/prof.json"), InputError);
}

TEST_CASE("a profile made for another model or precision is refused", "[profile]") {
  Profile p = profile_from_json(valid_profile(), "prof.json");
  CHECK_NOTHROW(check_profile_for(p, load_model("bert-base"), Precision::kBf16, "prof.json"));
  try {
    check_profile_for(p, load_model("bert-large"), Precision::kBf16, "prof.json");
    FAIL("accepted a bert-base profile for bert-large");
  } catch (const InputError& e) {
    CHECK_THAT(std::string(e.what()), Contains("prof.json") && Contains("$.layers") &&
                                          Contains("hidden 1024") && Contains("another model"));
  }
  CHECK_THROWS_WITH(check_profile_for(p, load_model("bert-base"), Precision::kFp32, "prof.json"),
                    Contains("$.precision"));
  // Links only: any model.
  p.layers.clear();
  CHECK_NOTHROW(check_profile_for(p, load_model("bert-large"), Precision::kBf16, "prof.json"));
}

TEST_CASE("profiles merge when device and precision agree", "[profile]") {
  Profile a = profile_from_json(valid_profile(), "a.json");
  Profile b = a;
  Profile m = merge_profiles({a, b}, {"a.json", "b.json"});
  CHECK(m.layers.size() == 4);
  CHECK(m.links.size() == 2);
  b.device = "NVIDIA H100";
  CHECK_THROWS_WITH(merge_profiles({a, b}, {"a.json", "b.json"}),
                    Contains("b.json") && Contains("$.device"));
}
