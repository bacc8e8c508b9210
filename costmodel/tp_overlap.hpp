// TransformerEngine's userbuffers overlap of the tensor-parallel exchanges with the linear layers'
// products (Megatron-LM's --tp-comm-overlap, NeMo's ub_tp_comm_overlap; Job::tp_comm_overlap).
//
// With sequence parallelism a transformer layer exchanges its hidden states over the tp group
// four times a pass, each beside one group of linear products (compute.hpp, LinearWindow):
//   forward   all-gather before the QKV products and before the MLP's input products,
//             reduce-scatter after the attention output product and after the MLP's output one;
//   backward  all-gather of the output gradient before the attention output's and the MLP
//             output's products, reduce-scatter of the input gradient after the QKV and the MLP
//             input products (TransformerEngine overlaps both with the gradient products).
// TransformerEngine splits a product into tp chunks and moves one chunk while the previous one
// multiplies (ring exchange; transformer_engine/pytorch/module/base.py, initialize_ub, and the
// userbuffers GEMM of cpp_extensions/gemm.py), so an exchange of c seconds beside products of w
// seconds ends after
//   overlapped_time_s(w, c, slowdown) + min(c, w) / tp
// (comm.hpp: compute slowed while both run; the chunk whose exchange cannot overlap). What the
// exchange adds to the pass is that less w.
#pragma once

#include "costmodel/compute.hpp"
#include "costmodel/estimate.hpp"

namespace loom::costmodel {

// The time an exchange of `exchange_s` adds to a window of products of `window_s`.
double overlapped_exchange_exposed_s(double window_s, double exchange_s, int tp, double slowdown);

// `layer`'s tensor-parallel collectives (sequence parallelism: all-gathers and reduce-scatters of
// the hidden states, forward and backward, the forward's again in the backward pass with full
// recomputation) with each count scaled so that their time is what the exchanges add beside the
// layer's linear windows. `all_gather_s` and `reduce_scatter_s` are one exchange's times.
void overlap_layer_exchanges(const LayerTime& layer, double all_gather_s, double reduce_scatter_s,
                             int tp, double slowdown, bool full_recompute, EntryTerms& terms);

}  // namespace loom::costmodel
