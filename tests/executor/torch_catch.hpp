// LibTorch and Catch2 in one test file. c10 (c10/util/logging_is_not_google_glog.h) defines a
// CHECK macro that aborts, and Catch2 defines its own: LibTorch comes first, its CHECK is dropped,
// then Catch2 defines CHECK. Once per unit, so that test files compiled together as one unity unit
// (tests/CMakeLists.txt) do not drop Catch2's CHECK again.
#pragma once

#include <torch/torch.h>
#undef CHECK

#include <catch2/catch.hpp>
