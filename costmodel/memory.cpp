#include "costmodel/memory.hpp"

#include <algorithm>

namespace loom::costmodel {

ModelStateBytes model_state_bytes(double parameters, int dp, int zero, Precision precision) {
  bool mixed = precision == Precision::kBf16 || precision == Precision::kFp16;
  double param_bytes = mixed ? 2 : 4;
  double grad_bytes = mixed ? 2 : 4;
  double optimizer_bytes = mixed ? 12 : 8;
  ModelStateBytes out;
  out.parameters = parameters * param_bytes / (zero >= 3 ? dp : 1);
  out.gradients = parameters * grad_bytes / (zero >= 2 ? dp : 1);
  out.optimizer = parameters * optimizer_bytes / (zero >= 1 ? dp : 1);
  return out;
}

double activation_micro_batches_in_flight(Schedule schedule, int pp, int stage,
                                          std::int64_t micro_batches, int virtual_stages) {
  auto m = static_cast<double>(micro_batches);
  switch (schedule) {
    case Schedule::kGpipe:
      return m;
    case Schedule::k1F1B:
      return std::min(static_cast<double>(pp - stage), m);
    case Schedule::kInterleaved: {
      double v = virtual_stages;
      // Megatron-LM runs every forward first when m == pp (no steady phase).
      if (micro_batches == pp) return m;
      double chunks = (pp - stage - 1) * 2.0 + (v - 1) * pp + 1;
      return std::min(chunks, m * v) / v;
    }
  }
  return m;
}

}  // namespace loom::costmodel
