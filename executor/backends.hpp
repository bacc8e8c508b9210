// The c10d process groups that run a group's collectives: Gloo over TCP (CPU tensors) and NCCL
// (CUDA tensors), built for this LibTorch (executor/torch_compat.hpp's CollectiveBackend). Used by
// executor/distributed.cpp alone. A build whose LibTorch lacks one of them gets a function that
// throws std::runtime_error saying so.
#pragma once

#include <chrono>
#include <string>

#include "executor/torch_compat.hpp"

namespace loom::executor {

// A Gloo group over `store` with one TCP device bound to `interface` when given, else to
// `host` when given, else to this machine's hostname; every operation times out after `timeout`.
// Blocks until all `size` members have joined.
c10::intrusive_ptr<compat::CollectiveBackend> make_gloo_backend(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    std::chrono::milliseconds timeout, const std::string& host, const std::string& interface);

// An NCCL group (communicators are created at the first collective) with `timeout`.
c10::intrusive_ptr<compat::CollectiveBackend> make_nccl_backend(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    std::chrono::milliseconds timeout);

// Ends an NCCL group's communicators before it is destroyed (compat::shutdown_nccl). Every rank
// calls it, in the same order. Nothing to do in a build without NCCL.
void shutdown_nccl_backend(const c10::intrusive_ptr<compat::CollectiveBackend>& backend);

// How long waiting for a work may block the host: the group's timeout for Gloo (the wait is
// where it fails); none for NCCL, whose wait with a timeout blocks the host until the kernels end
// (2.x) and whose own watchdog enforces the group's timeout. 0 is c10d's kNoTimeout.
std::chrono::milliseconds wait_timeout(bool nccl, std::chrono::milliseconds timeout);

}  // namespace loom::executor
