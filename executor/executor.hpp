// The executor: runs plans with LibTorch (later issues). For now it only reports the LibTorch it
// was built against, which proves the build finds LibTorch.
#pragma once

#include <string>

namespace loom::executor {

// "1.13.0" for Debian's LibTorch; the version the executor was compiled against.
std::string torch_version();

}  // namespace loom::executor
