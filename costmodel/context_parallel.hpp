// Context parallelism (Strategy::cp > 1) as Megatron-Core runs it with TransformerEngine's
// attention (cp_comm_type "p2p", the default; transformer_engine/pytorch/attention.py,
// AttnFuncWithCPAndKVP2P):
// - Each sample's sequence is cut into 2 cp equal chunks and cp rank r keeps chunks r and
//   2 cp - 1 - r, so that under a causal mask every rank does the same attention work
//   (megatron/core/utils.py, get_batch_on_this_cp_rank).
// - Everything but the attention core sees seq_len / cp tokens per rank: the linear layers, the
//   elementwise kernels, the activations kept, the tensor-parallel exchanges and the pipeline
//   transfers (compute_terms passes the rank's share as the sequence).
// - The attention core of the rank's seq_len / cp queries runs against every key in cp steps,
//   one fused kernel per step (compute.hpp, LayerShape::cp). At each step the rank sends the
//   key/value block it holds to the next rank of the ring while it attends to the block it
//   received: cp - 1 sends forward, each of 2 (seq_len / cp) b (kv_heads / tp) head_dim elements
//   in the attention's 16 bits; backward the blocks travel again with their gradients, twice the
//   bytes per step. Each step's send is hidden behind that step's attention block, 1/cp of the
//   rank's attention core, compute slowed while both run (overlapped_time_s, comm.hpp).
// TransformerEngine waits for the sends inside its attention function, so what they add is
// charged as attention time on the compute stream, in the estimate and the simulator alike.
// The ring's buffers (two key/value blocks in flight) are not charged to memory.
#pragma once

#include <cstdint>

#include "profiles/model_spec.hpp"

namespace loom::costmodel {

// Bytes of the key/value block one rank sends per ring step forward, for a micro-batch of
// `micro_batch` samples of `seq_len` tokens (the whole sequence) on `cp` ranks with tensor
// parallelism `tp`: 2 (key and value) x seq_len / cp x micro_batch x kv_heads / tp x head_dim x
// element_bytes.
double context_parallel_block_bytes(const profiles::ModelSpec& model, std::int64_t micro_batch,
                                    std::int64_t seq_len, int cp, int tp, int element_bytes);

// What the ring's sends add to one layer's passes.
struct ContextParallelExposure {
  double forward_s = 0;
  double backward_s = 0;
};

// The time cp - 1 ring steps add to a layer whose attention core takes `attention_forward_s`
// and `attention_backward_s` on one rank, one block's send taking `send_s` (twice that per step
// backward), compute slowed by `slowdown` while a send runs. Zero for cp = 1.
ContextParallelExposure context_parallel_exposure(double send_s, double attention_forward_s,
                                                  double attention_backward_s, int cp,
                                                  double slowdown);

}  // namespace loom::costmodel
