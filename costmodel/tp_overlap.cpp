// The tensor-parallel exchanges hidden behind the linear products (tp_overlap.hpp).
#include "costmodel/tp_overlap.hpp"

#include <algorithm>

#include "costmodel/comm.hpp"

namespace loom::costmodel {

double overlapped_exchange_exposed_s(double window_s, double exchange_s, int tp, double slowdown) {
  if (exchange_s <= 0) return 0;
  const double chunk = std::min(exchange_s, window_s) / std::max(1, tp);
  return overlapped_time_s(window_s, exchange_s, slowdown) + chunk - window_s;
}

void overlap_layer_exchanges(const LayerTime& layer, double all_gather_s, double reduce_scatter_s,
                             int tp, double slowdown, bool full_recompute, EntryTerms& terms) {
  auto exposed = [&](const std::array<double, 4>& windows, LinearWindow w, double exchange_s) {
    return overlapped_exchange_exposed_s(windows[w], exchange_s, tp, slowdown);
  };
  const auto& f = layer.linear_forward_s;
  const auto& b = layer.linear_backward_s;
  // Exposed seconds of the forward's all-gathers and reduce-scatters, then the backward's.
  const double forward_gather =
      exposed(f, kQkvWindow, all_gather_s) + exposed(f, kMlpInWindow, all_gather_s);
  const double forward_scatter = exposed(f, kAttentionOutWindow, reduce_scatter_s) +
                                 exposed(f, kMlpOutWindow, reduce_scatter_s);
  double backward_gather =
      exposed(b, kAttentionOutWindow, all_gather_s) + exposed(b, kMlpOutWindow, all_gather_s);
  double backward_scatter =
      exposed(b, kQkvWindow, reduce_scatter_s) + exposed(b, kMlpInWindow, reduce_scatter_s);
  if (full_recompute) {
    backward_gather += forward_gather;
    backward_scatter += forward_scatter;
  }
  auto rescale = [](TensorParallelCollectives& list, double gather_s, double scatter_s,
                    double one_gather_s, double one_scatter_s) {
    for (TensorParallelCollective& c : list) {
      if (c.collective == Collective::kAllGather) {
        c.count = one_gather_s > 0 ? gather_s / one_gather_s : 0;
      } else if (c.collective == Collective::kReduceScatter) {
        c.count = one_scatter_s > 0 ? scatter_s / one_scatter_s : 0;
      }
    }
  };
  rescale(terms.forward_tp, forward_gather, forward_scatter, all_gather_s, reduce_scatter_s);
  rescale(terms.backward_tp, backward_gather, backward_scatter, all_gather_s, reduce_scatter_s);
}

}  // namespace loom::costmodel
