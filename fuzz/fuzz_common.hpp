// Shared by the fuzz targets: the bytes as text, and the rule every reader must follow — bad
// input ends in loom::InputError, nothing else (any other exception, crash or sanitizer report
// is a finding).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "profiles/errors.hpp"

namespace loom::fuzz {

inline std::string text_of(const std::uint8_t* data, std::size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

// Runs `read`; InputError is the expected refusal.
template <typename F>
void expect_input_error_only(F&& read) {
  try {
    read();
  } catch (const loom::InputError&) {
  }
}

}  // namespace loom::fuzz
