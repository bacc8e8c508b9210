#include "executor/device_batch.hpp"

#include <algorithm>
#include <cstring>

#include "executor/device.hpp"
#include "executor/torch_compat.hpp"
#include "profiles/errors.hpp"

namespace loom::executor {

using profiles::Precision;

CudaSupport cuda_support() {
#if defined(LOOM_TORCH_CUDA)
  return cuda_available() ? CudaSupport::kAvailable : CudaSupport::kNoGpu;
#else
  return CudaSupport::kNotBuilt;
#endif
}

torch::Device prepare_device(Device device, int device_index, Precision precision) {
  if (device != Device::kCuda) return torch::kCPU;
  if (const CudaSupport cuda = cuda_support(); cuda != CudaSupport::kAvailable) {
    throw InputError("--device", "",
                     cuda == CudaSupport::kNotBuilt
                         ? std::string("cuda needs a CUDA build of Loom (") + kCudaBuildHint +
                               "); this one has a CPU LibTorch: use --device cpu"
                         : std::string("cuda needs a visible GPU; this machine shows none to "
                                       "LibTorch: use --device cpu"));
  }
  cuda_set_device(device_index);
  at::globalContext().setAllowTF32CuBLAS(precision == Precision::kTf32);
  at::globalContext().setAllowTF32CuDNN(precision == Precision::kTf32);
  return {torch::kCUDA, static_cast<c10::DeviceIndex>(device_index)};
}

std::string precision_refusal(Device device, Precision precision, int tp) {
  if (precision == Precision::kFp8) return "the executor has no fp8 products";
  if (device == Device::kCuda) return "";
  if (precision == Precision::kFp16 || precision == Precision::kTf32) {
    return std::string(profiles::to_string(precision)) +
           " does not train on the CPU (LibTorch runs fp32 and bf16 there)";
  }
  if (precision == Precision::kBf16 && tp > 1) {
    return "bf16 with tensor parallelism does not train on the CPU (Gloo, its collectives, has "
           "no bf16 all-reduce)";
  }
  return "";
}

MixedPrecision mixed_precision(Device device, Precision precision) {
  if (precision == Precision::kFp8) {
    throw InputError("--precision", "",
                     "fp32, tf32, fp16 or bf16: the executor has no fp8 products");
  }
  if (const std::string why = precision_refusal(device, precision, 1); !why.empty()) {
    throw InputError("--precision", "", "fp32 or bf16 on the CPU: " + why + "; use --device cuda");
  }
  MixedPrecision mp;
  switch (precision) {
    case Precision::kBf16:
      return {true, c10::ScalarType::BFloat16, false, "bf16"};
    case Precision::kFp16:
      return {true, c10::ScalarType::Half, true, "fp16"};
    case Precision::kTf32:
      mp.name = "tf32";
      return mp;
    case Precision::kFp32:
    case Precision::kFp8:  // refused above
      return mp;
  }
  return mp;
}

Batch make_batch(const std::vector<EncodedExample>& data, const std::vector<std::int64_t>& order,
                 std::int64_t begin, std::int64_t count, const torch::Device& device) {
  const auto seq =
      static_cast<std::int64_t>(data[static_cast<std::size_t>(order[0])].input_ids.size());
  // On CUDA the batch is staged in pinned host memory and copied without blocking: a copy from
  // pageable memory would wait for the device's queue to drain (between micro-batches too).
  const bool pinned = device.is_cuda();
  const auto options = torch::TensorOptions().dtype(torch::kLong).pinned_memory(pinned);
  torch::Tensor ids = torch::empty({count, seq}, options);
  torch::Tensor mask = torch::empty({count, seq}, options);
  torch::Tensor types = torch::empty({count, seq}, options);
  torch::Tensor labels = torch::empty({count}, options);
  const std::size_t row_bytes = static_cast<std::size_t>(seq) * sizeof(std::int64_t);
  bool padded = false;
  for (std::int64_t r = 0; r < count; ++r) {
    const EncodedExample& e =
        data[static_cast<std::size_t>(order[static_cast<std::size_t>(begin + r)])];
    std::memcpy(ids.data_ptr<std::int64_t>() + r * seq, e.input_ids.data(), row_bytes);
    std::memcpy(mask.data_ptr<std::int64_t>() + r * seq, e.attention_mask.data(), row_bytes);
    std::memcpy(types.data_ptr<std::int64_t>() + r * seq, e.token_type_ids.data(), row_bytes);
    labels.data_ptr<std::int64_t>()[r] = e.label;
    padded = padded || std::find(e.attention_mask.begin(), e.attention_mask.end(), 0) !=
                           e.attention_mask.end();
  }
  // A batch without padding carries no mask (EncoderInputs: undefined = no padding), so attention
  // may use the kernels that take none (flash attention on CUDA); known here on the host, so no
  // device synchronisation (transformers checks the mask on the device for the same purpose).
  auto to_device = [&](const torch::Tensor& t) { return t.to(device, /*non_blocking=*/pinned); };
  return {{to_device(ids), padded ? to_device(mask) : torch::Tensor(), to_device(types)},
          to_device(labels)};
}

}  // namespace loom::executor
