#include "profiles/json_reader.hpp"

#include <cmath>
#include <sstream>

#include "profiles/errors.hpp"

namespace loom::profiles {
namespace {
std::string type_name(const nlohmann::json& v) {
  if (v.is_number_integer()) return "an integer";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_boolean()) return "a boolean";
  if (v.is_null()) return "null";
  if (v.is_array()) return "an array";
  return "an object";
}
std::string format_number(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}
}  // namespace

nlohmann::json parse_json_text(const std::string& text, const std::string& source) {
  try {
    return nlohmann::json::parse(text, nullptr, true, /*ignore_comments=*/true);
  } catch (const nlohmann::json::exception& e) {
    // Syntax errors, and numbers too large for a double (out_of_range 406, found by fuzzing).
    std::string what = e.what();
    // nlohmann's message starts with "[json.exception.parse_error.101] "; keep the useful part.
    auto pos = what.find("] ");
    if (pos != std::string::npos) what = what.substr(pos + 2);
    throw InputError(source, "", "not valid JSON (" + what + ")");
  }
}

ObjectReader::ObjectReader(const nlohmann::json& value, std::string source, std::string path)
    : value_(value), source_(std::move(source)), path_(std::move(path)) {
  if (!value_.is_object()) {
    throw InputError(source_, path_, "expected a JSON object, found " + type_name(value_));
  }
}

bool ObjectReader::has(const std::string& key) const {
  auto it = value_.find(key);
  return it != value_.end() && !it->is_null();
}

std::string ObjectReader::key_path(const std::string& key) const { return path_ + "." + key; }

std::string ObjectReader::element_path(const std::string& key, std::size_t index) const {
  return key_path(key) + "[" + std::to_string(index) + "]";
}

void ObjectReader::fail(const std::string& key, const std::string& expectation) const {
  throw InputError(source_, key.empty() ? path_ : key_path(key), expectation);
}

const nlohmann::json* ObjectReader::optional(const std::string& key) {
  known_.insert(key);
  auto it = value_.find(key);
  if (it == value_.end() || it->is_null()) return nullptr;
  return &*it;
}

const nlohmann::json* ObjectReader::required(const std::string& key, const char* what) {
  const nlohmann::json* v = optional(key);
  if (v == nullptr) fail(key, std::string("missing required field (expected ") + what + ")");
  return v;
}

namespace {
std::int64_t to_integer(const ObjectReader& r, const std::string& key, const nlohmann::json& v,
                        std::int64_t min_value, std::int64_t max_value) {
  std::string expect = max_value == ObjectReader::kInt64Max
                           ? "expected an integer >= " + std::to_string(min_value)
                           : "expected an integer from " + std::to_string(min_value) + " to " +
                                 std::to_string(max_value);
  if (!v.is_number_integer()) r.fail(key, expect + ", found " + type_name(v));
  if (v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX)) {
    r.fail(key, expect + ", found a value too large");
  }
  std::int64_t out = v.get<std::int64_t>();
  if (out < min_value || out > max_value) r.fail(key, expect + ", found " + std::to_string(out));
  return out;
}

double to_number(const ObjectReader& r, const std::string& key, const nlohmann::json& v,
                 double min_value, bool exclusive) {
  std::string expect =
      std::string("expected a number ") + (exclusive ? "> " : ">= ") + format_number(min_value);
  if (!v.is_number()) r.fail(key, expect + ", found " + type_name(v));
  double out = v.get<double>();
  if (!std::isfinite(out) || out < min_value || (exclusive && out == min_value)) {
    r.fail(key, expect + ", found " + format_number(out));
  }
  return out;
}
}  // namespace

std::int64_t ObjectReader::integer(const std::string& key, std::int64_t min_value,
                                   std::int64_t max_value) {
  return to_integer(*this, key, *required(key, "an integer"), min_value, max_value);
}

std::optional<std::int64_t> ObjectReader::optional_integer(const std::string& key,
                                                           std::int64_t min_value,
                                                           std::int64_t max_value) {
  const nlohmann::json* v = optional(key);
  if (v == nullptr) return std::nullopt;
  return to_integer(*this, key, *v, min_value, max_value);
}

double ObjectReader::number(const std::string& key, double min_value, bool exclusive) {
  return to_number(*this, key, *required(key, "a number"), min_value, exclusive);
}

std::optional<double> ObjectReader::optional_number(const std::string& key, double min_value,
                                                    bool exclusive) {
  const nlohmann::json* v = optional(key);
  if (v == nullptr) return std::nullopt;
  return to_number(*this, key, *v, min_value, exclusive);
}

std::string ObjectReader::string(const std::string& key) {
  const nlohmann::json* v = required(key, "a string");
  if (!v->is_string()) fail(key, "expected a string, found " + type_name(*v));
  return v->get<std::string>();
}

std::optional<std::string> ObjectReader::optional_string(const std::string& key) {
  const nlohmann::json* v = optional(key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_string()) fail(key, "expected a string, found " + type_name(*v));
  return v->get<std::string>();
}

std::string ObjectReader::choice(const std::string& key, const std::vector<std::string>& allowed) {
  std::string list;
  for (const auto& a : allowed) list += (list.empty() ? "\"" : ", \"") + a + "\"";
  const nlohmann::json* v = required(key, ("one of " + list).c_str());
  if (!v->is_string()) fail(key, "expected one of " + list + ", found " + type_name(*v));
  std::string s = v->get<std::string>();
  for (const auto& a : allowed) {
    if (a == s) return s;
  }
  fail(key, "expected one of " + list + ", found \"" + s + "\"");
}

bool ObjectReader::boolean(const std::string& key) {
  const nlohmann::json* v = required(key, "true or false");
  if (!v->is_boolean()) fail(key, "expected true or false, found " + type_name(*v));
  return v->get<bool>();
}

std::optional<bool> ObjectReader::optional_boolean(const std::string& key) {
  const nlohmann::json* v = optional(key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_boolean()) fail(key, "expected true or false, found " + type_name(*v));
  return v->get<bool>();
}

ObjectReader ObjectReader::object(const std::string& key) {
  const nlohmann::json* v = required(key, "an object");
  return ObjectReader(*v, source_, key_path(key));
}

const nlohmann::json& ObjectReader::array(const std::string& key) {
  const nlohmann::json* v = required(key, "an array");
  if (!v->is_array()) fail(key, "expected an array, found " + type_name(*v));
  return *v;
}

void ObjectReader::skip(const std::string& key) { known_.insert(key); }

void ObjectReader::expect_format(const std::string& kind) {
  std::string want = kind + "/1";
  std::string got = string("format");
  if (got == want) return;
  auto slash = got.rfind('/');
  if (slash != std::string::npos && got.substr(0, slash) == kind) {
    fail("format", "this loom reads \"" + want + "\"; \"" + got +
                       "\" is a newer or unknown version: upgrade loom");
  }
  fail("format", "expected \"" + want + "\", found \"" + got + "\"");
}

void ObjectReader::finish() const {
  for (auto it = value_.begin(); it != value_.end(); ++it) {
    if (known_.count(it.key()) == 0) fail(it.key(), "unknown field");
  }
}

}  // namespace loom::profiles
