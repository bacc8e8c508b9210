// Compute time of the layers from a roofline: each kernel takes the longer of its FLOPs at the
// device's matrix rate and its bytes at the device's memory bandwidth, each scaled by an
// efficiency, and at least the launch overhead (kernels are launched asynchronously, so launch
// cost only shows when kernels are shorter than it).
#pragma once

#include <cstdint>

#include "costmodel/strategy.hpp"

namespace loom::costmodel {

// Rates and efficiencies of one device for one precision.
struct DeviceRates {
  double matrix_flops_per_s = 0;  // peak for the precision x matrix efficiency
  double memory_bytes_per_s = 0;  // bandwidth x memory efficiency
  double kernel_launch_s = 0;     // lower bound on any kernel's time
};

// Default efficiencies when the cluster gives none: matrix 0.7 of peak and memory 0.8 of
// bandwidth on GPUs (large bf16 GEMMs reach 70-80 % of the datasheet rate; elementwise kernels
// ~80 % of HBM bandwidth), 0.5 and 0.5 on CPUs; 5 us per kernel on GPUs, 0 on CPUs.
struct EfficiencyDefaults {
  double gpu_matrix = 0.7;
  double gpu_memory = 0.8;
  double cpu_matrix = 0.5;
  double cpu_memory = 0.5;
  double gpu_kernel_launch_s = 5e-6;
};

// Throws InputError when the device has no rate for `precision`.
DeviceRates device_rates(const profiles::DeviceSpec& device, Precision precision,
                         const EfficiencyDefaults& defaults);

// Time of one micro-batch through one layer on one tensor-parallel rank, communication excluded.
struct LayerTime {
  double forward_s = 0;
  double backward_s = 0;
  double recompute_s = 0;  // extra forward work done in the backward pass
};

struct LayerShape {
  std::int64_t micro_batch = 1;
  std::int64_t seq_len = 1;
  int tp = 1;
  int element_bytes = 2;
  Recompute recompute = Recompute::kNone;
};

LayerTime transformer_layer_time(const profiles::ModelSpec& model, const LayerShape& shape,
                                 const DeviceRates& rates);
LayerTime embedding_time(const profiles::ModelSpec& model, const LayerShape& shape,
                         const DeviceRates& rates);
LayerTime head_time(const profiles::ModelSpec& model, const LayerShape& shape,
                    const DeviceRates& rates);

}  // namespace loom::costmodel
