#include "executor/pipeline_schedule.hpp"

#include <algorithm>

namespace loom::executor {

namespace {

void one_f_one_b(std::vector<PipelineTask>& tasks, int pp, int rank, std::int64_t m) {
  const std::int64_t warmup = std::min<std::int64_t>(pp - rank - 1, m);
  for (std::int64_t i = 0; i < warmup; ++i) tasks.push_back({true, 0, i});
  for (std::int64_t i = warmup; i < m; ++i) {
    tasks.push_back({true, 0, i});
    tasks.push_back({false, 0, i - warmup});
  }
  for (std::int64_t i = m - warmup; i < m; ++i) tasks.push_back({false, 0, i});
}

void interleaved(std::vector<PipelineTask>& tasks, int pp, int rank, std::int64_t m, int v) {
  const std::int64_t total = m * v;
  auto task = [&](std::int64_t i, bool forward) {
    const auto k = static_cast<int>((i % (pp * v)) / pp);
    return PipelineTask{forward, forward ? k : v - 1 - k, (i / (pp * v)) * pp + i % pp};
  };
  const std::int64_t warmup =
      m == pp ? total : std::min<std::int64_t>((pp - rank - 1) * 2 + (v - 1) * pp, total);
  for (std::int64_t i = 0; i < warmup; ++i) tasks.push_back(task(i, true));
  for (std::int64_t i = 0; i < total - warmup; ++i) {
    tasks.push_back(task(i + warmup, true));
    tasks.push_back(task(i, false));
  }
  for (std::int64_t i = total - warmup; i < total; ++i) tasks.push_back(task(i, false));
}

}  // namespace

std::vector<PipelineTask> pipeline_order(costmodel::Schedule schedule, int pp, int rank,
                                         std::int64_t num_micro_batches, int virtual_stages) {
  std::vector<PipelineTask> tasks;
  if (schedule == costmodel::Schedule::kGpipe) {
    for (std::int64_t i = 0; i < num_micro_batches; ++i) tasks.push_back({true, 0, i});
    for (std::int64_t i = 0; i < num_micro_batches; ++i) tasks.push_back({false, 0, i});
  } else if (schedule == costmodel::Schedule::k1F1B) {
    one_f_one_b(tasks, pp, rank, num_micro_batches);
  } else {
    interleaved(tasks, pp, rank, num_micro_batches, virtual_stages);
  }
  return tasks;
}

std::string to_string(const std::vector<PipelineTask>& tasks, bool show_chunks) {
  std::string out;
  for (const PipelineTask& t : tasks) {
    if (!out.empty()) out += ' ';
    out += t.forward ? 'F' : 'B';
    out += std::to_string(t.micro_batch);
    if (show_chunks) {
      out += '.';
      out += std::to_string(t.chunk);
    }
  }
  return out;
}

}  // namespace loom::executor
