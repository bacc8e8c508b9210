// A simulated step as a Chrome trace (the JSON trace event format that Perfetto and
// chrome://tracing open): {"traceEvents": [...]}.
//
// - One process per rank (pid = global rank), named "rank N (node0/gpu3)" by a process_name
//   metadata event and ordered by process_sort_index, so every rank of the plan is listed.
// - One thread per stream (tid = Stream: 0 compute, 1 comm tp, 2 comm pp, 3 comm dp, 4 comm zero),
//   named by thread_name metadata events.
// - Each task that took time is a complete event ("ph": "X", ts and dur in microseconds, three
//   decimals) named as in SimulationResult::slices ("F mb3 L0-11", "allreduce dp 26.2 MB"); a send
//   is named "send act mb3 -> rank 2", its peer as seen from that rank.
// - A "memory" counter event ("ph": "C", args.bytes as an integer) at every change of the rank's
//   memory.
//
// Big plans: the simulator plays one representative per pipeline stage (simulator.hpp). When the
// world has at most TraceOptions::max_ranks_with_slices ranks, every rank gets its
// representative's slices and counters (identical times, peers shifted to the rank's own
// dp/tp position); above that, only the representatives (dp = tp = 0) get them, and every other
// rank gets its process metadata plus a process_labels metadata event "same as rank R", which keeps
// traces of 1024-GPU plans to a few megabytes.
//
// Deterministic: the same result gives the same bytes (fixed number formats, events in order of
// rank, then metadata, slices by stream, start and name, then counters).
#pragma once

#include <string>

#include "costmodel/simulator.hpp"

namespace loom::costmodel {

struct TraceOptions {
  int max_ranks_with_slices = 64;
  bool memory_counters = true;
};

std::string chrome_trace_json(const SimulationResult& result, const TraceOptions& options = {});

}  // namespace loom::costmodel
