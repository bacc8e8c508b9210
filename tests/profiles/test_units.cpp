// units.hpp: one unit per kind of figure across an output.
#include <catch2/catch.hpp>

#include "profiles/units.hpp"

using loom::profiles::byte_unit;
using loom::profiles::time_unit;
using loom::profiles::unit_text;

TEST_CASE("time_unit picks the largest unit that keeps the headline at least 1", "[profiles]") {
  CHECK(std::string(time_unit(1.5).name) == "s");
  CHECK(std::string(time_unit(0.25).name) == "ms");
  CHECK(std::string(time_unit(2e-5).name) == "µs");
  CHECK(std::string(time_unit(0).name) == "s");
  CHECK(unit_text(0.25, time_unit(0.25), 3) == "250.000 ms");
  // The other figures of the output follow the headline's unit.
  CHECK(unit_text(1.5, time_unit(0.25), 3) == "1500.000 ms");
  CHECK(unit_text(3e-6, time_unit(0.25), 3) == "0.003 ms");
  CHECK(unit_text(2e-7, time_unit(0.25), 3) == "< 0.001 ms");
  CHECK(unit_text(0, time_unit(1.5), 3) == "0.000 s");
}

TEST_CASE("byte_unit picks the largest binary unit that keeps the headline at least 1",
          "[profiles]") {
  CHECK(std::string(byte_unit(512).name) == "B");
  CHECK(std::string(byte_unit(25.5 * 1024 * 1024).name) == "MiB");
  CHECK(std::string(byte_unit(80.0 * 1024 * 1024 * 1024).name) == "GiB");
  CHECK(unit_text(12884901888.0, byte_unit(25.5 * 1024 * 1024), 2) == "12288.00 MiB");
  CHECK(unit_text(1024.0 * 1024 * 1024, byte_unit(80.0 * 1024 * 1024 * 1024), 2) == "1.00 GiB");
}
