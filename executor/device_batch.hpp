// What both training loops and `loom logits` share on the LibTorch side: the torch device and
// the precision a run uses, and micro-batches of examples on that device.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "executor/cuda_build.hpp"
#include "executor/examples.hpp"
#include "executor/model.hpp"
#include "executor/train.hpp"

namespace loom::executor {

// Whether this process can run on cuda: a CUDA build of LibTorch (LOOM_TORCH_CUDA) that sees a
// GPU (torch::cuda::is_available()).
enum class CudaSupport { kNotBuilt, kNoGpu, kAvailable };
CudaSupport cuda_support();

// The torch device that `device` names (CUDA: GPU `device_index`), or an InputError for cuda
// without a CUDA build or a GPU. On CUDA it also sets LibTorch's global TF32 switches: on for
// tf32, off for every other precision (fp32 stays exact fp32, as in torch.backends with
// allow_tf32 = False).
torch::Device prepare_device(Device device, int device_index, profiles::Precision precision);

// Why LibTorch cannot train in `precision` on `device` with `tp`-way tensor parallelism, or ""
// when it can. cuda runs all four. The CPU runs fp32, and bf16 (autocast to bfloat16, as
// torch.autocast("cpu")) without tensor parallelism (Gloo, the CPU's collectives, has no
// bfloat16 all-reduce); not fp16 (LibTorch has no half-precision matrix products on CPUs) nor
// tf32 (a mode of NVIDIA's tensor cores).
std::string precision_refusal(Device device, profiles::Precision precision, int tp);

// How the forward pass runs: bf16 / fp16 under autocast (fp16 with dynamic loss scaling, cuda
// only), tf32 and fp32 without. Throws InputError (source "--precision") for a precision the
// device does not run (precision_refusal with tp = 1): never a silent change to another one.
struct MixedPrecision {
  bool autocast = false;
  c10::ScalarType dtype = c10::ScalarType::Float;
  bool loss_scaling = false;
  std::string name = "fp32";  // what runs
};
MixedPrecision mixed_precision(Device device, profiles::Precision precision);

struct Batch {
  EncoderInputs inputs;
  torch::Tensor labels;
};

// The `count` examples of `data` at positions [begin, begin + count) of `order`, on `device`
// (staged in pinned memory and copied without blocking on CUDA). A batch without padding
// carries no attention mask (EncoderInputs: undefined = no padding).
Batch make_batch(const std::vector<EncodedExample>& data, const std::vector<std::int64_t>& order,
                 std::int64_t begin, std::int64_t count, const torch::Device& device);

}  // namespace loom::executor
