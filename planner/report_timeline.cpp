#include "planner/report_timeline.hpp"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "planner/report.hpp"
#include "profiles/units.hpp"

namespace loom::planner::report_svg {

namespace {

using costmodel::SimulationResult;
using costmodel::Stream;
using costmodel::TraceSlice;
using profiles::fixed_text;
using profiles::percent_text;
using profiles::seconds_text;

SliceKind kind_of(const TraceSlice& s) {
  switch (s.stream) {
    case Stream::kCompute:
      if (s.name.rfind("F ", 0) == 0) return SliceKind::kForward;
      if (s.name.rfind("B ", 0) == 0) return SliceKind::kBackward;
      return SliceKind::kOther;
    case Stream::kTensorParallel:
      return SliceKind::kTp;
    case Stream::kPipeline:
      return SliceKind::kPp;
    case Stream::kDataParallel:
      return SliceKind::kDp;
    case Stream::kZero:
      return SliceKind::kZero;
  }
  return SliceKind::kOther;
}

// The micro-batch of a compute slice ("F mb12 L0-5" -> "12"), empty when it has none.
std::string micro_batch_of(const std::string& name) {
  std::size_t at = name.find("mb");
  if (at == std::string::npos) return "";
  std::size_t end = at + 2;
  while (end < name.size() && name[end] >= '0' && name[end] <= '9') ++end;
  return end > at + 2 ? name.substr(at + 2, end - at - 2) : "";
}

struct TimelineRow {
  int stage = 0;
  int rank = 0;
  Stream stream = Stream::kCompute;
  std::vector<const TraceSlice*> slices;  // in order of start
};

// What one place of a row draws: one slice, or several merged (drawn as stacked bands).
struct Box {
  double start_s = 0;
  double end_s = 0;
  std::size_t count = 0;
  const TraceSlice* only = nullptr;  // when count == 1
  std::array<double, kSliceKinds> time_by_kind{};

  // Rectangles it draws: one, or one band per kind when merged.
  std::size_t rects() const {
    if (count <= 1) return 1;
    return static_cast<std::size_t>(
        std::count_if(time_by_kind.begin(), time_by_kind.end(), [](double t) { return t > 0; }));
  }
};

// Slices grouped greedily: a box grows while it spans less than `min_width_s`; a slice that is
// wider stays alone. min_width_s = 0 draws every slice.
std::vector<Box> boxes_of(const TimelineRow& row, double min_width_s) {
  std::vector<Box> out;
  for (const TraceSlice* s : row.slices) {
    const double end = s->start_s + s->duration_s;
    const bool join = !out.empty() && min_width_s > 0 && end - out.back().start_s < min_width_s;
    if (!join) {
      out.emplace_back();
      out.back().start_s = s->start_s;
    }
    Box& b = out.back();
    b.end_s = std::max(b.end_s, end);
    b.only = b.count == 0 ? s : nullptr;
    ++b.count;
    b.time_by_kind[static_cast<std::size_t>(kind_of(*s))] += s->duration_s;
  }
  return out;
}

constexpr double kLeft = 150, kPlotWidth = 1000, kRight = 20, kTop = 10;
constexpr double kComputeHeight = 20, kCommHeight = 11, kRowGap = 3, kStageGap = 8;
constexpr double kAxisHeight = 34;

// One row per stage representative and stream that carried something (compute always), its
// slices in order of start.
std::vector<TimelineRow> rows_of(const SimulationResult& sim) {
  // Slices by pipeline rank and stream.
  using ByStream = std::array<std::vector<const TraceSlice*>, costmodel::kStreamCount>;
  std::vector<ByStream> by_rank(sim.ranks.size());
  const int per_stage = std::max(1, sim.ranks_per_stage);
  for (const TraceSlice& s : sim.slices) {
    const auto r = static_cast<std::size_t>(s.rank / per_stage);
    if (r < by_rank.size() && s.duration_s > 0) {
      by_rank[r][static_cast<std::size_t>(s.stream)].push_back(&s);
    }
  }
  std::vector<TimelineRow> rows;
  for (std::size_t r = 0; r < sim.ranks.size(); ++r) {
    const costmodel::RankTimeline& t = sim.ranks[r];
    for (int k = 0; k < costmodel::kStreamCount; ++k) {
      auto& list = by_rank[r][static_cast<std::size_t>(k)];
      if (k != 0 && list.empty()) continue;
      std::stable_sort(list.begin(), list.end(), [](const TraceSlice* a, const TraceSlice* b) {
        return a->start_s < b->start_s;
      });
      rows.push_back(TimelineRow{t.pipeline_rank, t.rank, static_cast<Stream>(k), std::move(list)});
    }
  }
  return rows;
}

}  // namespace

std::string px(double v) { return fixed_text(v, 2); }

double tick_step(double span, int target) {
  const double raw = span / target;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / magnitude;
  const double nice = norm < 1.5 ? 1 : norm < 3.5 ? 2 : norm < 7.5 ? 5 : 10;
  return nice * magnitude;
}

namespace {

// The grid and time axis in ms under rows ending at `plot_bottom`, and the end of the step.
std::string time_axis(const SimulationResult& sim, double span_s, double scale,
                      double plot_bottom) {
  auto x_of = [&](double t) { return kLeft + t * scale; };
  std::string svg;
  const double span_ms = span_s * 1e3;
  const double step_ms = tick_step(span_ms, 10);
  const int tick_digits =
      std::max(0, std::min(6, static_cast<int>(-std::floor(std::log10(step_ms)))));
  svg += "<g class=\"axis-x\">";
  for (int i = 0;; ++i) {
    const double t_ms = i * step_ms;
    if (t_ms > span_ms * (1 + 1e-9)) break;
    const double x = x_of(t_ms / 1e3);
    svg += "<line class=\"grid\" x1=\"" + px(x) + "\" y1=\"" + px(kTop) + "\" x2=\"" + px(x) +
           "\" y2=\"" + px(plot_bottom) + "\"/>";
    svg += "<text x=\"" + px(x) + "\" y=\"" + px(plot_bottom + 14) + "\" text-anchor=\"middle\">" +
           fixed_text(t_ms, tick_digits) + "</text>";
  }
  svg += "<line class=\"axis\" x1=\"" + px(kLeft) + "\" y1=\"" + px(plot_bottom) + "\" x2=\"" +
         px(kLeft + kPlotWidth) + "\" y2=\"" + px(plot_bottom) + "\"/>";
  svg += "<text x=\"" + px(kLeft + kPlotWidth / 2) + "\" y=\"" + px(plot_bottom + 29) +
         "\" text-anchor=\"middle\">time (ms)</text></g>\n";
  if (sim.step_time_s > 0) {
    const double x = x_of(sim.step_time_s);
    svg += "<line class=\"limit\" x1=\"" + px(x) + "\" y1=\"" + px(kTop) + "\" x2=\"" + px(x) +
           "\" y2=\"" + px(plot_bottom) +
           "\"><title>end of step: " + seconds_text(sim.step_time_s) + "</title></line>\n";
  }
  return svg;
}

// The boxes of one row at height `y` (`h` high), as long as the timeline stays within
// `max_rects` rectangles (out.truncated when it does not).
void draw_boxes(TimelineSvg& out, const std::vector<Box>& boxes, double y, double h, double scale,
                std::size_t max_rects) {
  auto x_of = [&](double t) { return kLeft + t * scale; };
  std::string& svg = out.svg;
  for (const Box& b : boxes) {
    if (out.rects + b.rects() > max_rects) {
      out.truncated = true;
      break;
    }
    const double x = x_of(b.start_s);
    const double w = std::max(0.5, (b.end_s - b.start_s) * scale);
    if (b.only != nullptr) {
      const SliceKind kind = kind_of(*b.only);
      svg += "<rect class=\"slice\" x=\"" + px(x) + "\" y=\"" + px(y) + "\" width=\"" + px(w) +
             "\" height=\"" + px(h) + "\" fill=\"" + kSliceColors[static_cast<std::size_t>(kind)] +
             "\"><title>" + escape_html(b.only->name) + ": " + seconds_text(b.only->duration_s) +
             " at " + fixed_text(b.only->start_s * 1e3, 3) + " ms</title></rect>";
      ++out.rects;
      // Micro-batch numbers on forward and backward slices wide enough to hold them.
      const std::string mb = micro_batch_of(b.only->name);
      if ((kind == SliceKind::kForward || kind == SliceKind::kBackward) && !mb.empty() &&
          w >= 5.5 * static_cast<double>(mb.size()) + 4) {
        svg += "<text class=\"mb\" x=\"" + px(x + w / 2) + "\" y=\"" + px(y + h / 2 + 3) +
               "\" text-anchor=\"middle\">" + mb + "</text>";
      }
      continue;
    }
    // Merged: one band per kind, as high as its share of the busy time.
    double busy = 0;
    for (double t : b.time_by_kind) busy += t;
    std::string title = std::to_string(b.count) + " slices from " + fixed_text(b.start_s * 1e3, 3) +
                        " to " + fixed_text(b.end_s * 1e3, 3) + " ms:";
    for (std::size_t k = 0; k < b.time_by_kind.size(); ++k) {
      if (b.time_by_kind[k] > 0) {
        title +=
            std::string(" ") + kSliceNames[k] + " " + percent_text(b.time_by_kind[k] / busy, 0);
      }
    }
    double band_y = y;
    for (std::size_t k = 0; k < b.time_by_kind.size(); ++k) {
      if (!(b.time_by_kind[k] > 0)) continue;
      const double band_h = h * b.time_by_kind[k] / busy;
      svg += "<rect class=\"slice\" x=\"" + px(x) + "\" y=\"" + px(band_y) + "\" width=\"" + px(w) +
             "\" height=\"" + px(band_h) + "\" fill=\"" + kSliceColors[k] + "\" data-merged=\"" +
             std::to_string(b.count) + "\"><title>" + title + "</title></rect>";
      band_y += band_h;
      ++out.rects;
    }
  }
}

}  // namespace

TimelineSvg render_timeline(const SimulationResult& sim, std::size_t max_rects) {
  std::vector<TimelineRow> rows = rows_of(sim);
  double span_s = sim.step_time_s;
  for (const TraceSlice& s : sim.slices) span_s = std::max(span_s, s.start_s + s.duration_s);
  if (!(span_s > 0)) span_s = 1e-3;
  const double scale = kPlotWidth / span_s;  // pixels per second

  TimelineSvg out;
  for (const TimelineRow& r : rows) out.slices += r.slices.size();

  // Merge more and more (slices narrower than 0.5, 1, 2, ... pixels) until the boxes fit.
  std::vector<std::vector<Box>> boxes;
  double min_width_px = 0;
  for (;;) {
    boxes.clear();
    std::size_t count = 0;
    for (const TimelineRow& r : rows) {
      boxes.push_back(boxes_of(r, min_width_px / scale));
      for (const Box& b : boxes.back()) count += b.rects();
    }
    if (count <= max_rects || min_width_px > kPlotWidth) break;
    min_width_px = min_width_px == 0 ? 0.5 : 2 * min_width_px;
    out.merged = true;
  }

  double height = kTop;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    if (i > 0 && rows[i].stage != rows[i - 1].stage) height += kStageGap;
    height += (rows[i].stream == Stream::kCompute ? kComputeHeight : kCommHeight) + kRowGap;
  }
  const double plot_bottom = height;
  height += kAxisHeight;
  const double width = kLeft + kPlotWidth + kRight;

  std::string& svg = out.svg;
  svg += "<svg id=\"timeline\" class=\"chart\" width=\"" + px(width) + "\" height=\"" + px(height) +
         "\" viewBox=\"0 0 " + px(width) + " " + px(height) +
         "\" role=\"img\" aria-label=\"Pipeline timeline of one simulated step\">\n";

  svg += time_axis(sim, span_s, scale, plot_bottom);

  double y = kTop;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const TimelineRow& row = rows[i];
    if (i > 0 && row.stage != rows[i - 1].stage) y += kStageGap;
    const bool compute = row.stream == Stream::kCompute;
    const double h = compute ? kComputeHeight : kCommHeight;
    const std::string stream = costmodel::to_string(row.stream);
    svg += "<g class=\"row\" data-stage=\"" + std::to_string(row.stage) + "\" data-stream=\"" +
           escape_html(stream) + "\">";
    const std::string label =
        compute ? "stage " + std::to_string(row.stage) + " (rank " + std::to_string(row.rank) + ")"
                : stream;
    svg += "<text x=\"" + px(kLeft - 8) + "\" y=\"" + px(y + h / 2 + 4) + "\" text-anchor=\"end\"" +
           (compute ? "" : " class=\"muted\" font-size=\"10\"") + ">" + escape_html(label) +
           "</text>";
    draw_boxes(out, boxes[i], y, h, scale, max_rects);
    svg += "</g>\n";
    y += h + kRowGap;
  }
  svg += "</svg>\n";
  return out;
}

}  // namespace loom::planner::report_svg
