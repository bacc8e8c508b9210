// How to build Loom for GPUs, in the words of every message that needs it (loom train refusing a
// GPU plan on a CPU build, loom slurm warning about one). LibTorch-free, so that `loom` can say it
// without linking LibTorch.
#pragma once

namespace loom::executor {

// The CMake switch of a CUDA build and where its LibTorch comes from.
inline constexpr const char* kCudaBuildHint =
    "cmake -DLOOM_CUDA=ON (a CUDA LibTorch: the installed CUDA PyTorch, or "
    "-DLOOM_LIBTORCH_DIR=DIR)";

}  // namespace loom::executor
