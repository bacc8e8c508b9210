// The HTML report of a plan (`loom report`, docs/README.md): one self-contained page with the plan,
// its prediction, the simulated pipeline timeline and memory per stage as inline SVG, the
// alternatives the search ranked and, when a run was measured, predicted against measured.
//
// Contracts:
// - Self-contained: no network. No external scripts, fonts, images or style sheets, no URL at all
//   (inline SVG needs no xmlns in HTML). One small inline script counts what the browser drew into
//   #rendered-summary and data-* attributes of <body> (data-rendered, data-timeline-rects,
//   data-timeline-rows, data-memory-bars), so a headless browser can prove the page rendered.
// - Safe: every piece of text taken from the plan (names, why lines, device names) is escaped.
// - Deterministic: the same inputs give the same bytes (fixed number formats, no clock, no
//   locale).
// - Bounded: the timeline draws at most ReportOptions::max_timeline_rects rectangles (when there
//   are more slices, neighbours spanning less than a few pixels are merged into one place drawn
//   as stacked bands, one per kind, as high as the kind's share of the time), and the rank table
//   at most max_rank_rows rows, so a 1024-GPU plan gives a page of a few hundred kilobytes.
//
// The timeline has one row per pipeline stage representative (the rank with dp = tp = 0) and
// stream: compute always, then each communication stream (tp, pp, dp, zero) that carried
// something. Rows are `<g class="row" data-stage="R" data-stream="compute|comm tp|...">`; memory
// bars are `<g class="mem-bar" data-stage="R">`, one per pipeline stage.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "costmodel/simulator.hpp"
#include "planner/plan.hpp"

namespace loom::planner {

// What a training run measured, summarised from its metrics.jsonl (docs/formats.md) by
// executor/metrics.hpp.
struct MeasuredSteps {
  std::int64_t steps = 0;         // lines with a step_time_s
  double median_step_time_s = 0;  // the median of those (the mean of the middle two when even)
  std::optional<double> peak_memory_bytes;  // the largest peak_memory_bytes of any line
  std::optional<double> device_used_bytes;  // the largest device_used_bytes (CUDA runs only)
  // Per phase of loom train's `phases_s` (in the order the lines give them): the median over the
  // same steps as the step time; empty when the lines have none.
  std::vector<std::pair<std::string, double>> median_phases_s;
  bool operator==(const MeasuredSteps&) const = default;
};

struct ReportOptions {
  double memory_margin = 0.9;             // what the alternatives' binding constraint used
  std::size_t max_timeline_rects = 5000;  // slice rectangles in the timeline, at most
  std::size_t max_rank_rows = 64;         // rows of the rank placement table, at most
  std::optional<MeasuredSteps> measured;  // adds "predicted vs measured" when present
};

// The page. `simulation` is simulate_plan(plan) (its timeline, memory and simulated prediction;
// planner/replan.hpp); `alternatives` are ranked plans for the same request
// (alternatives_of(plan)), possibly empty. No I/O.
std::string render_report(const Plan& plan, const costmodel::SimulationResult& simulation,
                          const std::vector<Plan>& alternatives, const ReportOptions& options = {});

// `text` with &, <, >, " and ' replaced by character references, for HTML text and attributes.
std::string escape_html(const std::string& text);

}  // namespace loom::planner
