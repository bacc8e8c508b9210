#include "costmodel/sim_engine.hpp"

#include <algorithm>
#include <stdexcept>
#include <utility>

namespace loom::costmodel::sim {

int Engine::add(Task task) {
  int id = static_cast<int>(tasks_.size());
  stream_of(task.rank, task.stream).tasks.push_back(id);
  stream_of(task.rank, task.queue).order.push_back(id);
  tasks_.push_back(std::move(task));
  return id;
}

void Engine::depend(int before, int after) {
  if (before < 0 || after < 0) return;
  tasks_[static_cast<std::size_t>(before)].successors.push_back(after);
  ++tasks_[static_cast<std::size_t>(after)].pending;
}

int Engine::last_on(int rank, Stream stream) {
  const auto& t = stream_of(rank, stream).tasks;
  return t.empty() ? -1 : t.back();
}

void Engine::run() {
  if (network_) network_->resize(tasks_.size());
  for (RankState& r : ranks_) r.memory.push_back({0, r.static_bytes});
  for (std::size_t s = 0; s < streams_.size(); ++s) try_start(s, -1);
  while (!queue_.empty()) {
    Event e = queue_.pop();
    now_s_ = e.time_s;
    switch (e.kind) {
      case EventKind::kTaskEnd:
        finish(e.task);
        break;
      case EventKind::kLatencyEnd:
        enter_network(e.task);
        break;
      case EventKind::kFlowDrain:
        if (!network_->is_current(e.task, e.version)) continue;
        network_->finish(e.task, now_s_, queue_);
        finish(e.task);
        break;
    }
    ++events_;
  }
  for (const Task& t : tasks_) {
    if (t.end_s < 0) {
      throw std::logic_error("simulator: the task graph deadlocked at \"" + t.name + "\"");
    }
  }
}

StreamState& Engine::stream_of(int rank, Stream stream) {
  return streams_[static_cast<std::size_t>(rank) * kStreamCount + static_cast<std::size_t>(stream)];
}

void Engine::try_start(std::size_t stream, int trigger) {
  StreamState& s = streams_[stream];
  if (s.busy || s.next >= s.order.size()) return;
  int id = s.order[s.next];
  Task& t = tasks_[static_cast<std::size_t>(id)];
  if (t.pending > 0) return;
  s.busy = true;
  ++s.next;
  t.start_s = now_s_;
  t.released_by = trigger;
  RankState& r = rank(t.rank);
  if (t.stream == Stream::kCompute) charge_wait(t, r);
  if (t.allocate_bytes != 0) change_memory(r, t.allocate_bytes);
  if (t.flow.empty()) {
    queue_.push(now_s_ + t.duration_s, EventKind::kTaskEnd, id);
  } else if (t.flow.latency_s > 0) {
    queue_.push(now_s_ + t.flow.latency_s, EventKind::kLatencyEnd, id);
  } else {
    enter_network(id);
  }
}

void Engine::enter_network(int id) {
  const Task& t = tasks_[static_cast<std::size_t>(id)];
  if (t.flow.hop_bytes <= 0) {
    queue_.push(now_s_, EventKind::kTaskEnd, id);
  } else {
    network_->start(id, t.flow.shape, t.flow.hop_bytes, now_s_, queue_);
  }
}

void Engine::finish(int id) {
  Task& t = tasks_[static_cast<std::size_t>(id)];
  t.end_s = now_s_;
  const std::size_t own = stream_index(t);
  streams_[own].busy = false;
  RankState& r = rank(t.rank);
  r.finish_s = std::max(r.finish_s, now_s_);
  if (t.stream == Stream::kCompute) {
    double d = t.end_s - t.start_s;
    r.busy_s += d;
    r.phases_s[static_cast<std::size_t>(t.phase)] += d;
    r.last_compute_end_s = now_s_;
    if (t.pipeline) {
      r.pipeline_busy_s += d;
      r.pipeline_end_s = now_s_;
    }
  }
  if (t.free_bytes != 0) change_memory(r, -t.free_bytes);
  for (int next : t.successors) {
    Task& n = tasks_[static_cast<std::size_t>(next)];
    if (--n.pending == 0) try_start(stream_index(n), id);
  }
  try_start(own, id);
}

void Engine::charge_wait(const Task& t, RankState& r) {
  const double gap_start = r.last_compute_end_s;
  const double gap = now_s_ - gap_start;
  if (gap <= 0) return;
  double cursor = now_s_;
  double charged = 0;
  for (int b = t.released_by; b >= 0 && cursor > gap_start;) {
    const Task& c = tasks_[static_cast<std::size_t>(b)];
    if (c.stream == Stream::kCompute) break;
    double from = std::max(c.start_s, gap_start);
    double to = std::min(c.end_s, cursor);
    if (to > from) {
      r.exposed_s[static_cast<std::size_t>(c.stream)] += to - from;
      const Phase phase = c.stream == Stream::kDataParallel && t.phase == Phase::kBackward
                              ? Phase::kBackward
                              : c.phase;
      r.phases_s[static_cast<std::size_t>(phase)] += to - from;
      charged += to - from;
    }
    cursor = std::min(cursor, c.start_s);
    b = c.released_by;
  }
  r.bubble_s += gap - charged;
  r.phases_s[static_cast<std::size_t>(Phase::kPipelineWait)] += gap - charged;
}

void Engine::change_memory(RankState& r, double delta_bytes) {
  r.activation_bytes += delta_bytes;
  r.peak_activation_bytes = std::max(r.peak_activation_bytes, r.activation_bytes);
  double total = r.static_bytes + r.activation_bytes;
  if (r.memory.size() > 1 && r.memory.back().time_s == now_s_) {
    r.memory.back().bytes = total;
  } else {
    r.memory.push_back({now_s_, total});
  }
}
}  // namespace loom::costmodel::sim
