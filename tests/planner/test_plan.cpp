// loom-plan/1: writing, reading back, and refusing plans that cannot run.
#include <catch2/catch.hpp>
#include <functional>
#include <nlohmann/json.hpp>

#include "planner/search.hpp"
#include "profiles/errors.hpp"
#include "profiles/loader.hpp"

using namespace loom;
using namespace loom::planner;

namespace {
nlohmann::json sample_plan() {
  costmodel::CostModel cost(profiles::load_model("bert-large"),
                            profiles::load_cluster("dgx-a100-80g"));
  SearchOptions o;
  o.pp = 2;
  o.tp = 2;
  SearchResult r = search(cost, {512, 512, profiles::Precision::kBf16, "adamw"}, o);
  REQUIRE_FALSE(r.plans.empty());
  return plan_to_json(r.plans.front());
}

std::string refusal(nlohmann::json j) {
  try {
    plan_from_json(j, "plan.json");
  } catch (const InputError& e) {
    return e.what();
  }
  return "accepted";
}
}  // namespace

TEST_CASE("a plan survives the round trip through JSON", "[planner][plan]") {
  const nlohmann::json j = sample_plan();
  const Plan p = plan_from_json(j, "plan.json");
  CHECK(plan_to_json(p) == j);
  CHECK(p.ranks.size() == 32);
  CHECK(device_of_rank(p)[17] == 17);
  // The runtime calibration the cluster's values carry travels with the plan; absent: none.
  CHECK(p.calibration.empty());
  CHECK_FALSE(j.contains("calibration"));
  nlohmann::json calibrated = j;
  calibrated["calibration"] = "fsdp-h100";
  CHECK(plan_from_json(calibrated, "plan.json").calibration == "fsdp-h100");
  CHECK(plan_to_json(plan_from_json(calibrated, "plan.json")) == calibrated);
}

TEST_CASE("plans that cannot run are refused with the field and the expectation",
          "[planner][plan]") {
  const nlohmann::json good = sample_plan();
  struct Case {
    const char* what;
    std::function<void(nlohmann::json&)> edit;
    const char* expected;
  };
  const std::vector<Case> cases = {
      {"format", [](nlohmann::json& j) { j["format"] = "loom-model/1"; }, "$.format"},
      {"newer loom", [](nlohmann::json& j) { j["loom_version"] = "99.0.0"; }, "upgrade loom"},
      {"bad model field", [](nlohmann::json& j) { j["model"]["hidden"] = -1; }, "$.model.hidden"},
      {"world size", [](nlohmann::json& j) { j["strategy"]["dp"] = 4; }, "$.strategy"},
      {"stages gap",
       [](nlohmann::json& j) {
         j["stages"][1]["first_layer"] = j["stages"][1]["first_layer"].get<int>() + 1;
       },
       "$.stages"},
      {"missing rank", [](nlohmann::json& j) { j["ranks"].erase(j["ranks"].size() - 1); },
       "$.ranks"},
      {"rank coordinates", [](nlohmann::json& j) { j["ranks"][3]["tp"] = 0; }, "$.ranks[3].rank"},
      {"unknown device", [](nlohmann::json& j) { j["ranks"][0]["device"] = "node9/gpu0"; },
       "$.ranks[0].device"},
      {"device twice", [](nlohmann::json& j) { j["ranks"][1]["device"] = "node0/gpu0"; },
       "appears twice"},
      {"unknown key", [](nlohmann::json& j) { j["strategy"]["pipeline"] = 2; },
       "$.strategy.pipeline"},
      {"predicted source", [](nlohmann::json& j) { j["predicted"]["source"] = "guess"; },
       "$.predicted.source"},
  };
  for (const Case& c : cases) {
    nlohmann::json j = good;
    c.edit(j);
    INFO(c.what);
    const std::string message = refusal(j);
    CHECK_THAT(message, Catch::StartsWith("plan.json: ") && Catch::Contains(c.expected));
  }
}

TEST_CASE("a plan carries its head as the model's num_labels", "[planner][plan]") {
  nlohmann::json j = sample_plan();
  REQUIRE(j.at("model").at("num_labels") == 2);  // bert-large's classifier
  j["model"]["num_labels"] = 5;
  const Plan five = plan_from_json(j, "plan.json");
  CHECK(five.model.num_labels == 5);
  CHECK(plan_to_json(five) == j);
  // Absent: the language-model head, and it stays absent.
  j["model"].erase("num_labels");
  const Plan lm = plan_from_json(j, "plan.json");
  CHECK_FALSE(lm.model.num_labels.has_value());
  CHECK_FALSE(plan_to_json(lm).at("model").contains("num_labels"));
  CHECK(plan_to_json(lm) == j);
}
