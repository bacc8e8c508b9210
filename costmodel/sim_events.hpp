// The simulator's event queue: events kept in order of (time, sequence number), so events at equal
// times run in the order they were scheduled and a plan always plays the same way (ASTRA-sim's
// analytical backend keys its queue alike). Internal to the simulator (simulator.hpp is the
// public interface).
#pragma once

#include <cstdint>
#include <queue>
#include <vector>

namespace loom::costmodel::sim {

enum class EventKind {
  kTaskEnd,     // a task with a fixed duration (compute, or a flow with nothing to move) ends
  kLatencyEnd,  // a flow's latency has passed: its bytes enter the network
  kFlowDrain,   // a flow's last byte arrives, if `version` is still the flow's current one
};

struct Event {
  double time_s = 0;
  std::uint64_t sequence = 0;  // order of scheduling: breaks ties between equal times
  EventKind kind = EventKind::kTaskEnd;
  int task = 0;
  std::uint64_t version = 0;  // kFlowDrain: the flow's rate version when scheduled
};

// Events in order of (time_s, sequence); sequence numbers are given in push order.
class EventQueue {
 public:
  void push(double time_s, EventKind kind, int task, std::uint64_t version = 0);
  bool empty() const { return heap_.empty(); }
  // The earliest event; requires !empty().
  Event pop();

 private:
  struct Later {
    bool operator()(const Event& a, const Event& b) const {
      return a.time_s != b.time_s ? a.time_s > b.time_s : a.sequence > b.sequence;
    }
  };
  std::priority_queue<Event, std::vector<Event>, Later> heap_;
  std::uint64_t next_sequence_ = 0;
};

}  // namespace loom::costmodel::sim
