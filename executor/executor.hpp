// The LibTorch the executor was built against (loom --version). The executor itself: training
// (train.hpp), the model (model.hpp), process groups (distributed.hpp), the profiler
// (profiler.hpp) and the LibTorch-free data layer (tokenizer.hpp, dataset.hpp, safetensors.hpp,
// batch_order.hpp, metrics_writer.hpp, metrics.hpp); the pipeline order is
// costmodel/schedule.hpp's.
#pragma once

#include <string>

#include "costmodel/strategy.hpp"

namespace loom::executor {

// "1.13.0" for Debian's LibTorch; the version the executor was compiled against ("none" when
// built without LibTorch).
std::string torch_version();

// Whether this build runs `attention`: kMath always, kFlash with LibTorch 2 and later
// (scaled_dot_product_attention).
bool runs_attention(costmodel::Attention attention);

}  // namespace loom::executor
