// What both training loops and `loom logits` share on the LibTorch side: the torch device and
// the precision a run uses, and micro-batches of examples on that device.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "executor/examples.hpp"
#include "executor/model.hpp"
#include "executor/train.hpp"

namespace loom::executor {

// The torch device that `device` names (CUDA: GPU `device_index`), or an InputError for cuda
// without a GPU. On CUDA it also sets LibTorch's global TF32 switches: on for tf32, off for every
// other precision (fp32 stays exact fp32, as in torch.backends with allow_tf32 = False).
torch::Device prepare_device(Device device, int device_index, profiles::Precision precision);

// How the forward pass runs: cpu trains in fp32 whatever the requested precision; cuda runs
// bf16 / fp16 under autocast (fp16 with dynamic loss scaling), tf32 and fp32 without.
struct MixedPrecision {
  bool autocast = false;
  c10::ScalarType dtype = c10::ScalarType::Float;
  bool loss_scaling = false;
  std::string name = "fp32";  // what actually runs
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
