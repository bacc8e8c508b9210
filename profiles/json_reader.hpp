// Strict reading of one JSON object, with error messages that name the file and JSON path.
//
// Every accessor records the key as known; finish() then rejects any key that was never asked
// for, so typos ("hiden") are errors rather than silently ignored. Integers must be JSON integers
// (12, not 12.0 or "12"). All failures throw loom::InputError(source, "$.a.b", expectation).
#pragma once

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace loom::profiles {

// Parses text as JSON (comments allowed); a syntax error becomes an InputError naming `source`.
nlohmann::json parse_json_text(const std::string& text, const std::string& source);

class ObjectReader {
 public:
  static constexpr std::int64_t kInt64Max = std::numeric_limits<std::int64_t>::max();
  static constexpr std::int64_t kIntMax = std::numeric_limits<int>::max();

  // Throws unless `value` is a JSON object.
  ObjectReader(const nlohmann::json& value, std::string source, std::string path = "$");

  // True when the key is present and not null (null counts as absent for optional fields).
  bool has(const std::string& key) const;
  std::size_t size() const { return value_.size(); }

  // An integer in [min_value, max_value]; max_value guards fields kept in an int (kIntMax).
  std::int64_t integer(const std::string& key, std::int64_t min_value,
                       std::int64_t max_value = kInt64Max);
  std::optional<std::int64_t> optional_integer(const std::string& key, std::int64_t min_value,
                                               std::int64_t max_value = kInt64Max);
  // A number (integer or not) >= min_value, or > min_value when `exclusive`.
  double number(const std::string& key, double min_value, bool exclusive);
  std::optional<double> optional_number(const std::string& key, double min_value, bool exclusive);
  std::string string(const std::string& key);
  std::optional<std::string> optional_string(const std::string& key);
  // A string that must be one of `allowed`.
  std::string choice(const std::string& key, const std::vector<std::string>& allowed);
  bool boolean(const std::string& key);
  std::optional<bool> optional_boolean(const std::string& key);
  ObjectReader object(const std::string& key);
  // The array at key (elements to be read by the caller with element_path()).
  const nlohmann::json& array(const std::string& key);
  // Marks the key as known without reading it (fields read elsewhere, or ignored on purpose).
  void skip(const std::string& key);

  // Checks "format": "<kind>/1": a missing or other kind is an error; a newer major version says
  // so explicitly.
  void expect_format(const std::string& kind);

  // Rejects keys that no accessor asked for.
  void finish() const;

  std::string key_path(const std::string& key) const;
  std::string element_path(const std::string& key, std::size_t index) const;
  const std::string& source() const { return source_; }
  [[noreturn]] void fail(const std::string& key, const std::string& expectation) const;

 private:
  const nlohmann::json* required(const std::string& key, const char* what);
  const nlohmann::json* optional(const std::string& key);

  const nlohmann::json& value_;
  std::string source_;
  std::string path_;
  std::set<std::string> known_;
};

}  // namespace loom::profiles
