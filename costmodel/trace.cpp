#include "costmodel/trace.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <utility>
#include <vector>

namespace loom::costmodel {
namespace {

void append_escaped(std::string& out, const std::string& text) {
  out += '"';
  for (char ch : text) {
    auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  out += '"';
}

void append_us(std::string& out, double seconds) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.3f", seconds * 1e6);
  out += buf;
}

void metadata(std::string& out, const char* name, int pid, int tid, const char* key,
              const std::string& value, bool quoted) {
  out += "{\"name\":\"";
  out += name;
  out += "\",\"ph\":\"M\",\"pid\":" + std::to_string(pid) + ",\"tid\":" + std::to_string(tid) +
         ",\"args\":{\"";
  out += key;
  out += "\":";
  if (quoted) {
    append_escaped(out, value);
  } else {
    out += value;
  }
  out += "}},\n";
}

}  // namespace

std::string chrome_trace_json(const SimulationResult& result, const TraceOptions& options) {
  const int world = result.world_size;
  const int per_stage = std::max(1, result.ranks_per_stage);
  const bool every_rank = world <= options.max_ranks_with_slices;

  // Slices of each representative: [begin, end) into result.slices (sorted by rank).
  std::vector<std::pair<std::size_t, std::size_t>> range(result.ranks.size(), {0, 0});
  for (std::size_t i = 0; i < result.slices.size();) {
    std::size_t j = i;
    while (j < result.slices.size() && result.slices[j].rank == result.slices[i].rank) ++j;
    std::size_t stage = static_cast<std::size_t>(result.slices[i].rank / per_stage);
    if (stage < range.size()) range[stage] = {i, j};
    i = j;
  }

  std::string out = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  for (int rank = 0; rank < world; ++rank) {
    const int stage = rank / per_stage;
    const int offset = rank % per_stage;
    const int representative = stage * per_stage;
    std::string label = "rank " + std::to_string(rank);
    if (static_cast<std::size_t>(rank) < result.device_names.size()) {
      label += " (" + result.device_names[static_cast<std::size_t>(rank)] + ")";
    }
    metadata(out, "process_name", rank, 0, "name", label, true);
    metadata(out, "process_sort_index", rank, 0, "sort_index", std::to_string(rank), false);
    if (!every_rank && rank != representative) {
      metadata(out, "process_labels", rank, 0, "labels",
               "same as rank " + std::to_string(representative), true);
      continue;
    }
    for (int s = 0; s < kStreamCount; ++s) {
      metadata(out, "thread_name", rank, s, "name", to_string(static_cast<Stream>(s)), true);
      metadata(out, "thread_sort_index", rank, s, "sort_index", std::to_string(s), false);
    }
    if (static_cast<std::size_t>(stage) >= result.ranks.size()) continue;
    auto [begin, end] = range[static_cast<std::size_t>(stage)];
    for (std::size_t i = begin; i < end; ++i) {
      const TraceSlice& slice = result.slices[i];
      std::string name = slice.name;
      if (slice.peer_rank >= 0) name += " -> rank " + std::to_string(slice.peer_rank + offset);
      out += "{\"name\":";
      append_escaped(out, name);
      out += ",\"cat\":";
      append_escaped(out, to_string(slice.stream));
      out += ",\"ph\":\"X\",\"pid\":" + std::to_string(rank) +
             ",\"tid\":" + std::to_string(static_cast<int>(slice.stream)) + ",\"ts\":";
      append_us(out, slice.start_s);
      out += ",\"dur\":";
      append_us(out, slice.duration_s);
      out += "},\n";
    }
    if (options.memory_counters) {
      for (const MemorySample& m : result.ranks[static_cast<std::size_t>(stage)].memory) {
        out += "{\"name\":\"memory\",\"ph\":\"C\",\"pid\":" + std::to_string(rank) +
               ",\"tid\":0,\"ts\":";
        append_us(out, m.time_s);
        out += ",\"args\":{\"bytes\":" + std::to_string(std::llround(m.bytes)) + "}},\n";
      }
    }
  }
  // Close the array: drop the last separator.
  if (out.size() >= 2 && out.compare(out.size() - 2, 2, ",\n") == 0) out.erase(out.size() - 2, 1);
  char step[64];
  std::snprintf(step, sizeof step, "%.9g", result.step_time_s);
  out += "],\"otherData\":{\"step_time_s\":\"";
  out += step;
  out += "\",\"source\":\"loom simulate\"}}\n";
  return out;
}

}  // namespace loom::costmodel
