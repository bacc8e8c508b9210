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

}  // namespace loom::costmodel
