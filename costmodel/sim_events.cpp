#include "costmodel/sim_events.hpp"

namespace loom::costmodel::sim {

void EventQueue::push(double time_s, EventKind kind, int task, std::uint64_t version) {
  heap_.push(Event{time_s, next_sequence_++, kind, task, version});
}

Event EventQueue::pop() {
  Event e = heap_.top();
  heap_.pop();
  return e;
}

}  // namespace loom::costmodel::sim
