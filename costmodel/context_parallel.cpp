#include "costmodel/context_parallel.hpp"

#include "costmodel/comm.hpp"

namespace loom::costmodel {

double context_parallel_block_bytes(const profiles::ModelSpec& model, std::int64_t micro_batch,
                                    std::int64_t seq_len, int cp, int tp, int element_bytes) {
  const double head_dim = static_cast<double>(model.hidden) / static_cast<double>(model.heads);
  return 2 * static_cast<double>(seq_len) / cp * static_cast<double>(micro_batch) *
         static_cast<double>(model.key_value_heads()) / tp * head_dim * element_bytes;
}

ContextParallelExposure context_parallel_exposure(double send_s, double attention_forward_s,
                                                  double attention_backward_s, int cp,
                                                  double slowdown) {
  ContextParallelExposure out;
  if (cp <= 1) return out;
  const double steps = cp - 1;
  const double forward_block_s = attention_forward_s / cp;
  const double backward_block_s = attention_backward_s / cp;
  out.forward_s = steps * (overlapped_time_s(forward_block_s, send_s, slowdown) - forward_block_s);
  out.backward_s =
      steps * (overlapped_time_s(backward_block_s, 2 * send_s, slowdown) - backward_block_s);
  return out;
}

}  // namespace loom::costmodel
