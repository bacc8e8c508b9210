#include "executor/backends.hpp"

#include <stdexcept>

// Gloo: Debian's LibTorch and most pip wheels ship its headers; a CUDA build without them uses
// NCCL alone (CPU tensors then cannot be communicated). A CPU build needs Gloo.
#if defined(USE_C10D_GLOO) && __has_include(<gloo/algorithm.h>)
#define LOOM_HAS_GLOO 1
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#elif !defined(LOOM_TORCH_CUDA)
#error "Loom's CPU build needs LibTorch's Gloo (USE_C10D_GLOO and the gloo headers: libgloo-dev)"
#endif

namespace loom::executor {

#if defined(LOOM_HAS_GLOO)
c10::intrusive_ptr<compat::CollectiveBackend> make_gloo_backend(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    std::chrono::milliseconds timeout, const std::string& host, const std::string& interface) {
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  if (!interface.empty()) {
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(interface));
  } else if (!host.empty()) {
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(host));
  } else {
    options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  }
  options->threads = 2;
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
}
#else
c10::intrusive_ptr<compat::CollectiveBackend> make_gloo_backend(
    const c10::intrusive_ptr<c10d::Store>& /*store*/, int /*rank*/, int /*size*/,
    std::chrono::milliseconds /*timeout*/, const std::string& /*host*/,
    const std::string& /*interface*/) {
  throw std::runtime_error(
      "this build of Loom has no Gloo (its LibTorch ships no gloo headers): CPU tensors cannot be "
      "communicated; use --device cuda (NCCL)");
}
#endif

// NCCL: a CUDA build whose LibTorch was compiled with it.
#if defined(LOOM_TORCH_CUDA) && defined(USE_C10D_NCCL)
c10::intrusive_ptr<compat::CollectiveBackend> make_nccl_backend(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    std::chrono::milliseconds timeout) {
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
}
void shutdown_nccl_backend(const c10::intrusive_ptr<compat::CollectiveBackend>& backend) {
  compat::shutdown_nccl(static_cast<c10d::ProcessGroupNCCL&>(*backend));
}
#else
c10::intrusive_ptr<compat::CollectiveBackend> make_nccl_backend(
    const c10::intrusive_ptr<c10d::Store>& /*store*/, int /*rank*/, int /*size*/,
    std::chrono::milliseconds /*timeout*/) {
  throw std::runtime_error("this build of Loom has no NCCL (a CPU LibTorch): use Gloo");
}
void shutdown_nccl_backend(const c10::intrusive_ptr<compat::CollectiveBackend>& /*backend*/) {}
#endif

std::chrono::milliseconds wait_timeout(bool nccl, std::chrono::milliseconds timeout) {
  return nccl ? std::chrono::milliseconds(0) : timeout;
}

}  // namespace loom::executor
