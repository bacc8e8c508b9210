// Numbers as text, the one form every printer of Loom uses (the plan summary, the HTML report,
// the simulator's slice names, the planner's reasons): fixed notation with a stated number of
// decimals, time in s / ms / µs, sizes in binary units (KiB, MiB, GiB, TiB: what device memory
// is sold and reported in), percentages with a space before "%". An output that prints many
// figures of one kind picks one Unit for them all (time_unit, byte_unit) and writes each with
// unit_text. The C locale's formatting: the same value gives the same bytes on every machine.
#pragma once

#include <cmath>
#include <cstdio>
#include <string>

namespace loom::profiles {

// `value` with `digits` decimals ("12.35"); "-" when it is not finite, and never "-0.00" (a value
// that rounds to zero prints as zero).
inline std::string fixed_text(double value, int digits) {
  if (!std::isfinite(value)) return "-";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, value);
  std::string out = buf;
  if (out[0] == '-' && out.find_first_not_of("-0.") == std::string::npos) out.erase(0, 1);
  return out;
}

// A duration in the largest unit that keeps it at least 1: "1.234 s", "12.500 ms", "3.5 µs"
// (three decimals; one for µs); "0 s" for zero or less.
inline std::string seconds_text(double seconds) {
  if (seconds >= 1) return fixed_text(seconds, 3) + " s";
  if (seconds >= 1e-3) return fixed_text(seconds * 1e3, 3) + " ms";
  if (seconds > 0) return fixed_text(seconds * 1e6, 1) + " µs";
  return "0 s";
}

// A size in GiB (2^30 bytes) with `digits` decimals: "80.00 GiB".
inline std::string gib_text(double bytes, int digits = 2) {
  return fixed_text(bytes / (1024.0 * 1024 * 1024), digits) + " GiB";
}

// A size in MiB (2^20 bytes) with `digits` decimals: "25.0 MiB".
inline std::string mib_text(double bytes, int digits = 1) {
  return fixed_text(bytes / (1024.0 * 1024), digits) + " MiB";
}

// A size in the largest binary unit that keeps it at least 1, three significant digits:
// "512 B", "1.5 KiB", "24.4 MiB", "1.02 GiB".
inline std::string bytes_text(double bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (bytes >= 1024 && unit < 4) {
    bytes /= 1024;
    ++unit;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g %s", bytes, kUnits[unit]);
  return buf;
}

// The unit of one kind of figure across an output (all its durations, all its sizes), so that a
// reader compares figures without converting: the value is divided by `scale` and followed by
// `name`.
struct Unit {
  const char* name;
  double scale;
};

// The largest of s, ms and µs that keeps `seconds` at least 1 (s for zero or less): chosen from an
// output's headline duration, such as a plan's step time.
inline Unit time_unit(double seconds) {
  if (seconds >= 1 || !(seconds > 0)) return {"s", 1};
  if (seconds >= 1e-3) return {"ms", 1e-3};
  return {"µs", 1e-6};
}

// The largest binary unit that keeps `bytes` at least 1: B, KiB, MiB, GiB or TiB.
inline Unit byte_unit(double bytes) {
  static constexpr const char* kNames[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  double scale = 1;
  while (bytes >= 1024 * scale && unit < 4) {
    scale *= 1024;
    ++unit;
  }
  return {kNames[unit], scale};
}

// `value` in `unit` with `digits` decimals: "12.500 ms". A positive value too small to show at
// that precision prints as "< 0.001 ms", so that it does not read as none.
inline std::string unit_text(double value, Unit unit, int digits) {
  const double scaled = value / unit.scale;
  if (std::isfinite(scaled) && scaled > 0 && scaled < 0.5 * std::pow(10.0, -digits)) {
    return "< " + fixed_text(std::pow(10.0, -digits), digits) + " " + unit.name;
  }
  return fixed_text(scaled, digits) + " " + unit.name;
}

// A fraction as a percentage with `digits` decimals: "41.3 %".
inline std::string percent_text(double fraction, int digits = 1) {
  return fixed_text(100 * fraction, digits) + " %";
}

}  // namespace loom::profiles
