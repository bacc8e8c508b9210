// loom-calibration/1 files (runtime_calibration.hpp).
#include "profiles/runtime_calibration.hpp"

#include "profiles/errors.hpp"
#include "profiles/json_reader.hpp"

namespace loom::profiles {

RuntimeCalibration runtime_calibration_from_json(const nlohmann::json& value,
                                                 const std::string& source) {
  ObjectReader r(value, source);
  r.expect_format("loom-calibration");
  RuntimeCalibration c;
  c.name = r.string("name");
  if (c.name.empty()) r.fail("name", "a non-empty name");
  c.runtime = r.string("runtime");
  c.device = r.string("device");
  c.stack = r.optional_string("stack").value_or("");
  ObjectReader parameters = r.object("parameters");
  const nlohmann::json& object = value.at("parameters");
  for (auto it = object.begin(); it != object.end(); ++it) {
    c.parameters.emplace_back(it.key(), parameters.number(it.key(), 0, false));
  }
  parameters.finish();
  if (r.has("record")) c.record = calibration_from_json(value.at("record"), source, "$.record");
  r.skip("record");
  r.finish();
  return c;
}

nlohmann::json runtime_calibration_to_json(const RuntimeCalibration& c) {
  nlohmann::json j = {{"format", "loom-calibration/1"},
                      {"name", c.name},
                      {"runtime", c.runtime},
                      {"device", c.device},
                      {"parameters", nlohmann::json::object()}};
  if (!c.stack.empty()) j["stack"] = c.stack;
  for (const auto& [name, value] : c.parameters) j["parameters"][name] = value;
  if (c.record) j["record"] = calibration_to_json(*c.record);
  return j;
}

}  // namespace loom::profiles
