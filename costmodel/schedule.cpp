#include "costmodel/schedule.hpp"

#include <algorithm>
#include <stdexcept>

namespace loom::costmodel {

namespace {

std::string num(std::int64_t v) { return std::to_string(v); }

// Megatron-LM's interleaved warm-up on rank `rank`: (pp - rank - 1) * 2 + (v - 1) * pp forwards,
// capped at m v; every forward when m == pp.
std::int64_t interleaved_warm_up(int pp, int rank, std::int64_t m, int v) {
  const std::int64_t total = m * v;
  if (m == pp) return total;
  return std::min<std::int64_t>((pp - rank - 1) * 2 + (v - 1) * pp, total);
}

}  // namespace

const char* to_string(Schedule schedule) {
  switch (schedule) {
    case Schedule::kGpipe:
      return "gpipe";
    case Schedule::k1F1B:
      return "1f1b";
    case Schedule::kInterleaved:
      return "interleaved";
  }
  return "1f1b";
}

std::optional<Schedule> parse_schedule(const std::string& text) {
  for (Schedule s : {Schedule::kGpipe, Schedule::k1F1B, Schedule::kInterleaved}) {
    if (text == to_string(s)) return s;
  }
  return std::nullopt;
}

std::vector<std::string> schedule_names() {
  return {to_string(Schedule::kGpipe), to_string(Schedule::k1F1B),
          to_string(Schedule::kInterleaved)};
}

std::optional<std::string> check_virtual_stages(Schedule schedule, int virtual_stages) {
  if (virtual_stages < 1) return "virtual stages must be >= 1 (found " + num(virtual_stages) + ")";
  if (schedule != Schedule::kInterleaved && virtual_stages != 1) {
    return "virtual stages > 1 need the interleaved schedule";
  }
  if (schedule == Schedule::kInterleaved && virtual_stages < 2) {
    return "the interleaved schedule needs virtual stages >= 2";
  }
  return std::nullopt;
}

std::optional<std::string> check_schedule(Schedule schedule, int pp, std::int64_t num_micro_batches,
                                          int virtual_stages) {
  if (pp < 1) return "pp must be >= 1 (found " + num(pp) + ")";
  if (num_micro_batches < 1) return "the number of micro-batches must be >= 1";
  if (auto why = check_virtual_stages(schedule, virtual_stages)) return why;
  if (schedule == Schedule::kInterleaved) {
    if (pp < 2) return "the interleaved schedule needs pp >= 2";
    if (num_micro_batches % pp != 0) {
      return "the interleaved schedule needs the " + num(num_micro_batches) +
             " micro-batches to be a multiple of pp=" + num(pp);
    }
  }
  return std::nullopt;
}

std::vector<PipelineOp> pipeline_order(Schedule schedule, int pp, int rank, std::int64_t m, int v) {
  if (auto why = check_schedule(schedule, pp, m, v)) throw std::invalid_argument(*why);
  if (rank < 0 || rank >= pp) {
    throw std::invalid_argument("pipeline rank " + num(rank) + " is not in 0.." + num(pp - 1));
  }
  std::vector<PipelineOp> ops;
  ops.reserve(static_cast<std::size_t>(2 * m * v));
  // Forward or backward number i of the rank's m * v: its micro-batch and local chunk.
  const std::int64_t group = static_cast<std::int64_t>(pp) * v;
  auto op = [&](std::int64_t i, PassKind pass) {
    int chunk = static_cast<int>((i % group) / pp);
    if (pass == PassKind::kBackward) chunk = v - 1 - chunk;
    return PipelineOp{pass, (i / group) * pp + i % pp, chunk};
  };
  const std::int64_t total = m * v;
  std::int64_t warm = 0;
  switch (schedule) {
    case Schedule::kGpipe:
      warm = m;
      break;
    case Schedule::k1F1B:
      warm = std::min<std::int64_t>(pp - rank - 1, m);
      break;
    case Schedule::kInterleaved:
      warm = interleaved_warm_up(pp, rank, m, v);
      break;
  }
  for (std::int64_t i = 0; i < warm; ++i) ops.push_back(op(i, PassKind::kForward));
  for (std::int64_t i = 0; i < total - warm; ++i) {
    ops.push_back(op(warm + i, PassKind::kForward));
    ops.push_back(op(i, PassKind::kBackward));
  }
  for (std::int64_t i = total - warm; i < total; ++i) ops.push_back(op(i, PassKind::kBackward));
  return ops;
}

std::string to_string(const std::vector<PipelineOp>& order) {
  const bool chunks =
      std::any_of(order.begin(), order.end(), [](const PipelineOp& o) { return o.chunk != 0; });
  std::string out;
  for (const PipelineOp& o : order) {
    if (!out.empty()) out += ' ';
    out += o.pass == PassKind::kForward ? 'F' : 'B';
    out += std::to_string(o.micro_batch);
    if (chunks) out += "." + std::to_string(o.chunk);
  }
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
