#include "planner/partition.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <limits>

#include "costmodel/lowering.hpp"
#include "profiles/errors.hpp"

namespace loom::planner {

using costmodel::StageRange;

namespace {

// The layer sequence's per-micro-batch costs as prefix sums, and the greedy that fills stages.
class Partitioner {
 public:
  Partitioner(const costmodel::CostModel& cost, const costmodel::StepTerms& terms,
              const costmodel::Job& job, const costmodel::Strategy& s, double limit)
      : cost_(cost), terms_(terms), job_(job), s_(s), limit_(limit) {
    const costmodel::SequenceCosts& c = terms.costs;
    const profiles::ModelSpec& m = cost.model();
    auto add = [&](const costmodel::EntryCost& e, bool layer) {
      time_.push_back(time_.back() + e.forward_s + e.backward_s);
      parameters_.push_back(parameters_.back() + e.num_parameters);
      activations_.push_back(activations_.back() + e.activation_bytes);
      layers_.push_back(layers_.back() + (layer ? 1 : 0));
      largest_entry_s_ = std::max(largest_entry_s_, e.forward_s + e.backward_s);
    };
    add(c.embedding, false);
    for (std::int64_t i = 0; i < m.layers; ++i) add(c.layer, true);
    add(c.head, false);
  }

  int size() const { return static_cast<int>(time_.size()) - 1; }
  double total_time_s() const { return time_.back(); }
  double largest_entry_s() const { return largest_entry_s_; }

  // Whether entries [first, last] fit on pipeline rank `stage` within time `bottleneck_s`.
  bool fits(int stage, int first, int last, double bottleneck_s) const {
    auto sum = [&](const std::vector<double>& prefix) {
      return prefix[static_cast<std::size_t>(last) + 1] - prefix[static_cast<std::size_t>(first)];
    };
    if (sum(time_) > bottleneck_s) return false;
    costmodel::StageLoad load;
    load.num_parameters = sum(parameters_);
    load.activation_bytes = sum(activations_);
    load.num_layers = sum(layers_);
    if (costmodel::chunk_content({first, last}, size()).head) {
      load.num_parameters += costmodel::tied_head_copy_parameters(cost_.model(), s_.tp, stage);
    }
    load.largest_chunk_num_parameters = load.num_parameters;
    return cost_.stage_memory(terms_, job_, s_, stage, load).total() <= limit_;
  }

  // Fills stages from the last backwards, each as long as `bottleneck_s` and memory allow while
  // leaving one entry for each earlier stage. nullopt when the sequence is not covered.
  std::optional<std::vector<StageRange>> greedy(double bottleneck_s) const {
    std::vector<StageRange> out(static_cast<std::size_t>(s_.pp));
    int last = size() - 1;
    for (int stage = s_.pp - 1; stage >= 0; --stage) {
      if (last < stage) return std::nullopt;  // each earlier stage needs one entry
      int first = last;
      if (!fits(stage, first, last, bottleneck_s)) return std::nullopt;
      while (first - 1 >= stage && fits(stage, first - 1, last, bottleneck_s)) --first;
      if (stage == 0 && first != 0) return std::nullopt;
      out[static_cast<std::size_t>(stage)] = StageRange{first, last};
      last = first - 1;
    }
    return out;
  }

 private:
  const costmodel::CostModel& cost_;
  const costmodel::StepTerms& terms_;
  const costmodel::Job& job_;
  const costmodel::Strategy& s_;
  double limit_;
  // Prefix sums over the layer sequence: element i covers entries [0, i).
  std::vector<double> time_{0}, parameters_{0}, activations_{0}, layers_{0};
  double largest_entry_s_ = 0;
};

}  // namespace

std::optional<std::vector<StageRange>> balanced_partition(const costmodel::CostModel& cost,
                                                          const costmodel::Job& job,
                                                          const costmodel::Strategy& s,
                                                          double memory_limit_bytes) {
  if (s.pp == 1 || s.schedule == costmodel::Schedule::kInterleaved) {
    return costmodel::even_partition(cost.model(), s.pp * s.virtual_stages);
  }
  return balanced_partition(cost, cost.step_terms(job, s), job, s, memory_limit_bytes);
}

std::optional<std::vector<StageRange>> balanced_partition(const costmodel::CostModel& cost,
                                                          const costmodel::StepTerms& terms,
                                                          const costmodel::Job& job,
                                                          const costmodel::Strategy& s,
                                                          double memory_limit_bytes) {
  if (s.pp == 1 || s.schedule == costmodel::Schedule::kInterleaved) {
    return costmodel::even_partition(cost.model(), s.pp * s.virtual_stages);
  }
  const Partitioner p(cost, terms, job, s, memory_limit_bytes);
  double hi = p.total_time_s() * (1 + 1e-12);
  auto best = p.greedy(hi);
  if (!best) return std::nullopt;  // memory rules out every split
  double lo = p.largest_entry_s() * (1 - 1e-12);
  // Bisection on the bottleneck down to 1e-4 of it: finer splits than that change nothing a
  // prediction can resolve.
  while (hi - lo > 1e-4 * hi) {
    const double mid = 0.5 * (lo + hi);
    if (auto split = p.greedy(mid)) {
      best = std::move(split);
      hi = mid;
    } else {
      lo = mid;
    }
  }
  return best;
}

std::vector<StageRange> parse_stages(const std::string& text, const std::string& source) {
  std::vector<StageRange> out;
  const std::string expectation =
      "comma-separated inclusive ranges of the layer sequence, one per stage, such as 0-0,1-13 "
      "(0 is the embedding, the last is the head)";
  std::size_t pos = 0;
  while (pos <= text.size()) {
    std::size_t end = text.find(',', pos);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(pos, end - pos);
    const std::size_t dash = item.find('-');
    std::string refusal = expectation;
    refusal.append("; found \"").append(item).append("\"");
    auto number = [&](const std::string& s) {
      if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos || s.size() > 6) {
        throw InputError(source, "", refusal);
      }
      return std::stoi(s);
    };
    if (dash == std::string::npos) throw InputError(source, "", refusal);
    out.push_back(StageRange{number(item.substr(0, dash)), number(item.substr(dash + 1))});
    pos = end + 1;
  }
  return out;
}

}  // namespace loom::planner
