// The JSON forms of the cost options and of a prediction (estimate.hpp), as plans record them.
#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>

#include "costmodel/estimate.hpp"

namespace loom::costmodel {

nlohmann::json cost_options_to_json(const CostOptions& o) {
  return {{"gpu_matrix_efficiency", o.efficiency.gpu_matrix},
          {"gpu_memory_efficiency", o.efficiency.gpu_memory},
          {"cpu_matrix_efficiency", o.efficiency.cpu_matrix},
          {"cpu_memory_efficiency", o.efficiency.cpu_memory},
          {"gpu_kernel_launch_s", o.efficiency.gpu_kernel_launch_s},
          {"dp_bucket_bytes", o.dp_bucket_bytes},
          {"attention_scores", o.attention_scores}};
}

nlohmann::json prediction_to_json(const Prediction& p) {
  auto bytes = [](double v) { return static_cast<std::int64_t>(std::llround(v)); };
  nlohmann::json stages = nlohmann::json::array();
  for (const MemoryBreakdown& m : p.memory_by_stage) {
    stages.push_back({{"parameters", bytes(m.parameter_bytes)},
                      {"gradients", bytes(m.gradient_bytes)},
                      {"optimizer", bytes(m.optimizer_bytes)},
                      {"activations", bytes(m.activation_bytes)},
                      {"buffers", bytes(m.buffer_bytes)},
                      {"cuda_context", bytes(m.cuda_context_bytes)},
                      {"workspaces", bytes(m.workspace_bytes)},
                      {"nccl_buffers", bytes(m.nccl_buffer_bytes)},
                      {"fragmentation", bytes(m.fragmentation_bytes)},
                      {"total", bytes(m.total())}});
  }
  return {{"step_time_s", p.step_time_s},
          {"samples_per_s", p.samples_per_s},
          {"tokens_per_s", p.tokens_per_s},
          {"model_tflops_per_gpu", p.model_tflops_per_gpu},
          {"hardware_tflops_per_gpu", p.hardware_tflops_per_gpu},
          {"mfu", p.mfu},
          {"peak_memory_bytes", bytes(p.peak_memory_bytes)},
          {"memory_bytes_by_stage", stages},
          {"bubble_fraction", p.bubble_fraction},
          {"exposed_communication_s",
           {{"dp", p.exposed_communication_s.dp},
            {"tp", p.exposed_communication_s.tp},
            {"pp", p.exposed_communication_s.pp},
            {"zero", p.exposed_communication_s.zero}}},
          {"optimizer_s", p.optimizer_s},
          {"source", p.source}};
}

}  // namespace loom::costmodel
