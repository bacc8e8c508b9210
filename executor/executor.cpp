#include "executor/executor.hpp"

#if __has_include(<torch/version.h>)
#include <torch/version.h>
#else
#define TORCH_VERSION "none"
#endif

namespace loom::executor {

std::string torch_version() { return TORCH_VERSION; }

}  // namespace loom::executor
