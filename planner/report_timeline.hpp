// The report's SVG pieces shared by its sections (planner/report.cpp): coordinates as text, axis
// ticks, and the pipeline timeline of one simulated step, with the contract of planner/report.hpp
// (one row per stage representative and stream, at most max_rects rectangles, deterministic
// bytes). Internal to the report.
#pragma once

#include <array>
#include <cstddef>
#include <string>

#include "costmodel/simulator.hpp"

namespace loom::planner::report_svg {

// A coordinate in the SVG: two decimals are far below a pixel.
std::string px(double v);

// "Nice" tick spacing (1, 2 or 5 times a power of ten) for about `target` ticks over `span`.
double tick_step(double span, int target);

// The kinds of slices the timeline colours, with their colours and legend names.
enum class SliceKind { kForward, kBackward, kOther, kTp, kPp, kDp, kZero };
constexpr int kSliceKinds = 7;
constexpr std::array<const char*, kSliceKinds> kSliceColors = {
    "#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#9c755f"};
constexpr std::array<const char*, kSliceKinds> kSliceNames = {
    "forward", "backward", "optimizer", "comm tp", "comm pp", "comm dp", "comm zero"};

// The timeline as an <svg id="timeline"> element and what it drew.
struct TimelineSvg {
  std::string svg;
  std::size_t slices = 0;  // slices of the simulation
  std::size_t rects = 0;   // rectangles drawn
  bool merged = false;
  bool truncated = false;
};

// The timeline of `sim`: time runs left to right in ms, rows top to bottom by stage, slices
// narrower than a few pixels merged into stacked bands when there are more than `max_rects`.
TimelineSvg render_timeline(const costmodel::SimulationResult& sim, std::size_t max_rects);

}  // namespace loom::planner::report_svg
