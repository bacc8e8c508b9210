#include "planner/report.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <utility>

#include "costmodel/estimate.hpp"
#include "planner/report_timeline.hpp"
#include "planner/search.hpp"
#include "profiles/units.hpp"

namespace loom::planner {
namespace {

using costmodel::MemoryBreakdown;
using costmodel::Prediction;
using costmodel::SimulationResult;
using costmodel::Stream;
using costmodel::TraceSlice;

// ---- Numbers as text (fixed formats: the page is byte-for-byte deterministic) -----------------

using profiles::fixed_text;
using profiles::gib_text;
using profiles::percent_text;
using profiles::seconds_text;
using report_svg::kSliceColors;
using report_svg::kSliceKinds;
using report_svg::kSliceNames;
using report_svg::px;
using report_svg::tick_step;

std::string integer(std::int64_t v) { return std::to_string(v); }

std::string signed_percent(double fraction) {
  std::string text = percent_text(fraction);
  return fraction > 0 && text != percent_text(0) ? "+" + text : text;
}

std::string gbps(double v) { return fixed_text(v, 1) + " GB/s"; }

// ---- HTML pieces ------------------------------------------------------------------------------

std::string cell(const std::string& html, const char* tag = "td") {
  return std::string("<") + tag + ">" + html + "</" + tag + ">";
}

std::string num_cell(const std::string& html) { return "<td class=\"num\">" + html + "</td>"; }

// A two-column table of (label, value-as-html) rows.
std::string key_values(const std::string& caption,
                       const std::vector<std::pair<std::string, std::string>>& rows) {
  std::string out = "<table class=\"kv\"><caption>" + escape_html(caption) + "</caption>";
  for (const auto& [key, value] : rows) {
    out += "<tr><th scope=\"row\">" + escape_html(key) + "</th><td>" + value + "</td></tr>";
  }
  return out + "</table>\n";
}

std::string range_text(const costmodel::StageRange& r) {
  return r.first_layer == r.last_layer
             ? std::to_string(r.first_layer)
             : std::to_string(r.first_layer) + "&ndash;" + std::to_string(r.last_layer);
}

// The layer ranges of pipeline rank r (chunk c runs on rank c % pp).
std::string stage_layers(const Plan& plan, int r) {
  std::string out;
  for (std::size_t c = static_cast<std::size_t>(r); c < plan.stages.size();
       c += static_cast<std::size_t>(plan.strategy.pp)) {
    if (!out.empty()) out += ", ";
    out += range_text(plan.stages[c]);
  }
  return out;
}

double exposed_total(const costmodel::ExposedCommunication& e) {
  return e.dp + e.tp + e.pp + e.zero;
}

// Memory per stage: the simulation's (peak activations as played) when it has one per stage,
// otherwise the plan's own prediction.
const std::vector<MemoryBreakdown>& stage_memory(const Plan& plan, const SimulationResult& sim) {
  return sim.prediction.memory_by_stage.size() == static_cast<std::size_t>(plan.strategy.pp)
             ? sim.prediction.memory_by_stage
             : plan.predicted.memory_by_stage;
}

// ---- Style and script -------------------------------------------------------------------------

constexpr const char* kStyle = R"(
:root { --fg: #1d2330; --muted: #5b6475; --line: #d8dde6; --bg: #ffffff; --panel: #f5f7fa; }
* { box-sizing: border-box; }
body { margin: 0; padding: 24px 32px 48px; color: var(--fg); background: var(--bg);
  font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
h1 { font-size: 22px; margin: 0 0 4px; }
h2 { font-size: 17px; margin: 32px 0 8px; border-bottom: 1px solid var(--line); padding-bottom: 4px; }
p.sub, p.note, caption, .muted { color: var(--muted); }
p.note { font-size: 12.5px; margin: 6px 0; }
code, .mono { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; font-size: 12.5px; }
.cards { display: flex; flex-wrap: wrap; gap: 10px; margin: 16px 0 8px; }
.card { background: var(--panel); border: 1px solid var(--line); border-radius: 6px; padding: 8px 14px; min-width: 130px; }
.card .label { font-size: 12px; color: var(--muted); }
.card .value { font-size: 19px; font-weight: 600; }
.panels { display: flex; flex-wrap: wrap; gap: 12px 28px; align-items: flex-start; }
table { border-collapse: collapse; font-size: 13px; }
caption { text-align: left; font-weight: 600; padding: 4px 0; }
th, td { border-bottom: 1px solid var(--line); padding: 3px 10px 3px 0; text-align: left; vertical-align: top; }
thead th { border-bottom: 2px solid var(--line); font-weight: 600; }
table.kv th { font-weight: normal; color: var(--muted); padding-right: 14px; }
table.kv td { max-width: 360px; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; padding-left: 10px; }
tr.current td { background: #fff6d6; font-weight: 600; }
ul.why li { margin: 2px 0; }
.scroll { overflow-x: auto; max-width: 100%; }
svg.chart { display: block; font-size: 11px; }
svg.chart text { fill: var(--fg); }
svg.chart .axis { stroke: #9aa3b2; stroke-width: 1; }
svg.chart .grid { stroke: #e8ebf0; stroke-width: 1; }
svg.chart .limit { stroke: #c0392b; stroke-width: 1.5; }
svg.chart .margin { stroke: #7f8c8d; stroke-width: 1; stroke-dasharray: 4 3; }
svg.chart .mb { fill: #ffffff; font-size: 9px; pointer-events: none; }
.legend { display: flex; flex-wrap: wrap; gap: 14px; font-size: 12.5px; margin: 6px 0; }
.swatch { display: inline-block; width: 12px; height: 12px; border-radius: 2px; vertical-align: -1px; margin-right: 4px; }
footer { margin-top: 36px; font-size: 12px; color: var(--muted); }
)";

constexpr const char* kScript = R"(
(function () {
  var timeline = document.getElementById('timeline');
  var slices = timeline ? timeline.querySelectorAll('rect.slice').length : 0;
  var rows = timeline ? timeline.querySelectorAll('g.row').length : 0;
  var bars = document.querySelectorAll('#memory g.mem-bar').length;
  document.body.setAttribute('data-timeline-rects', String(slices));
  document.body.setAttribute('data-timeline-rows', String(rows));
  document.body.setAttribute('data-memory-bars', String(bars));
  document.body.setAttribute('data-rendered', 'yes');
  var out = document.getElementById('rendered-summary');
  if (out) {
    out.textContent = 'Rendered ' + slices + ' timeline slices in ' + rows + ' rows and ' + bars +
        ' memory bars.';
  }
})();
)";

// ---- Memory bars ------------------------------------------------------------------------------

// The sixth part is what a GPU process holds beyond its tensors (0 on CPUs, so no bar).
constexpr std::array<const char*, 6> kMemoryParts = {"parameters",  "gradients", "optimizer",
                                                     "activations", "buffers",   "process"};
constexpr std::array<const char*, 6> kMemoryColors = {"#4e79a7", "#f28e2b", "#e15759",
                                                      "#76b7b2", "#59a14f", "#b07aa1"};

std::string render_memory(const Plan& plan, const std::vector<MemoryBreakdown>& memory,
                          double memory_margin) {
  constexpr double kLeft = 150, kPlotWidth = 800, kRight = 110, kTop = 26, kBar = 18, kGap = 8;
  const double device = static_cast<double>(plan.cluster.device.memory_bytes);
  double largest = device;
  for (const MemoryBreakdown& m : memory) largest = std::max(largest, m.total());
  if (!(largest > 0)) largest = 1;
  const double full = largest * 1.04;
  auto x_of = [&](double bytes) { return kLeft + bytes / full * kPlotWidth; };
  const double plot_bottom = kTop + static_cast<double>(memory.size()) * (kBar + kGap);
  const double height = plot_bottom + 30;
  const double width = kLeft + kPlotWidth + kRight;

  std::string svg = "<svg class=\"chart\" width=\"" + px(width) + "\" height=\"" + px(height) +
                    "\" viewBox=\"0 0 " + px(width) + " " + px(height) +
                    "\" role=\"img\" aria-label=\"Memory per pipeline stage\">\n";
  // Axis in GiB.
  const double full_gib = full / (1024.0 * 1024 * 1024);
  const double step = tick_step(full_gib, 8);
  const int digits = std::max(0, std::min(6, static_cast<int>(-std::floor(std::log10(step)))));
  for (int i = 0;; ++i) {
    const double v = i * step;
    if (v > full_gib * (1 + 1e-9)) break;
    const double x = x_of(v * 1024.0 * 1024 * 1024);
    svg += "<line class=\"grid\" x1=\"" + px(x) + "\" y1=\"" + px(kTop - 4) + "\" x2=\"" + px(x) +
           "\" y2=\"" + px(plot_bottom) + "\"/><text x=\"" + px(x) + "\" y=\"" +
           px(plot_bottom + 14) + "\" text-anchor=\"middle\">" + fixed_text(v, digits) + "</text>";
  }
  svg += "<text x=\"" + px(kLeft + kPlotWidth / 2) + "\" y=\"" + px(plot_bottom + 28) +
         "\" text-anchor=\"middle\">GiB per rank</text>\n";

  for (std::size_t r = 0; r < memory.size(); ++r) {
    const MemoryBreakdown& m = memory[r];
    const double y = kTop + static_cast<double>(r) * (kBar + kGap);
    svg += "<g class=\"mem-bar\" data-stage=\"" + std::to_string(r) + "\">";
    svg += "<text x=\"" + px(kLeft - 8) + "\" y=\"" + px(y + kBar / 2 + 4) +
           "\" text-anchor=\"end\">stage " + std::to_string(r) + "</text>";
    const std::array<double, 6> parts = {m.parameter_bytes,  m.gradient_bytes, m.optimizer_bytes,
                                         m.activation_bytes, m.buffer_bytes,   m.process_bytes()};
    double at = 0;
    for (std::size_t k = 0; k < parts.size(); ++k) {
      if (parts[k] <= 0) continue;
      svg += "<rect class=\"mem-part\" data-part=\"" + std::string(kMemoryParts[k]) + "\" x=\"" +
             px(x_of(at)) + "\" y=\"" + px(y) + "\" width=\"" + px(x_of(at + parts[k]) - x_of(at)) +
             "\" height=\"" + px(kBar) + "\" fill=\"" + kMemoryColors[k] + "\"><title>stage " +
             std::to_string(r) + " " + kMemoryParts[k] + ": " + gib_text(parts[k]) +
             "</title></rect>";
      at += parts[k];
    }
    svg += "<text x=\"" + px(x_of(at) + 6) + "\" y=\"" + px(y + kBar / 2 + 4) + "\">" +
           gib_text(m.total()) + "</text></g>\n";
  }
  if (device > 0) {
    const double x = x_of(device);
    svg += "<line class=\"limit\" x1=\"" + px(x) + "\" y1=\"" + px(kTop - 10) + "\" x2=\"" + px(x) +
           "\" y2=\"" + px(plot_bottom) + "\"/><text x=\"" + px(x) + "\" y=\"" + px(kTop - 13) +
           "\" text-anchor=\"end\">device memory " + gib_text(device) + "</text>\n";
    const double xm = x_of(device * memory_margin);
    if (memory_margin < 1) {
      svg += "<line class=\"margin\" x1=\"" + px(xm) + "\" y1=\"" + px(kTop - 4) + "\" x2=\"" +
             px(xm) + "\" y2=\"" + px(plot_bottom) + "\"><title>planning margin " +
             percent_text(memory_margin, 0) + "</title></line>\n";
    }
  }
  svg += "</svg>\n";
  return svg;
}

std::string legend(const std::vector<std::pair<std::string, std::string>>& items) {
  std::string out = "<div class=\"legend\">";
  for (const auto& [color, label] : items) {
    out += "<span><span class=\"swatch\" style=\"background:" + color + "\"></span>" +
           escape_html(label) + "</span>";
  }
  return out + "</div>\n";
}

// ---- Sections ---------------------------------------------------------------------------------

std::string plan_section(const Plan& plan) {
  const profiles::ModelSpec& m = plan.model;
  const profiles::Cluster& c = plan.cluster;
  const costmodel::Strategy& s = plan.strategy;
  std::string head = m.num_labels
                         ? "classification, " + integer(*m.num_labels) + " labels"
                         : std::string("language model") + (m.tied_embeddings ? " (tied)" : "");
  std::string out = "<section id=\"plan\"><h2>Plan</h2><div class=\"panels\">\n";
  out += key_values("Model", {{"name", escape_html(m.name)},
                              {"family", escape_html(profiles::to_string(m.family)) + " (" +
                                             escape_html(profiles::to_string(m.model_type)) + ")"},
                              {"layers", integer(m.layers)},
                              {"hidden", integer(m.hidden)},
                              {"heads", integer(m.heads)},
                              {"ffn hidden", integer(m.ffn_hidden)},
                              {"vocabulary", integer(m.vocab)},
                              {"max positions", integer(m.max_positions)},
                              {"head", escape_html(head)}});
  std::vector<std::pair<std::string, std::string>> cluster = {
      {"name", escape_html(c.name)},
      {"devices", integer(c.nodes) + " nodes &times; " + integer(c.devices_per_node) + " " +
                      escape_html(c.device.name)},
      {"device memory", gib_text(static_cast<double>(c.device.memory_bytes))},
      {"peak " + std::string(profiles::to_string(plan.job.precision)),
       fixed_text(c.device.peak_tflops.of(plan.job.precision), 1) + " TFLOP/s"},
      {"memory bandwidth", gbps(c.device.memory_bandwidth_gbps)},
      {"intra-node", escape_html(c.intra_node.kind) + ", " + gbps(c.intra_node.bandwidth_gbps) +
                         ", " + fixed_text(c.intra_node.latency_us, 1) + " µs"}};
  if (c.inter_node) {
    cluster.emplace_back("inter-node", escape_html(c.inter_node->kind) + ", " +
                                           gbps(c.inter_node->bandwidth_gbps) + ", " +
                                           fixed_text(c.inter_node->latency_us, 1) + " µs");
  }
  if (!c.links.empty()) cluster.emplace_back("explicit links", integer(std::ssize(c.links)));
  if (!c.source.empty()) cluster.emplace_back("source", escape_html(c.source));
  out += key_values("Cluster", cluster);
  out += key_values(
      "Job", {{"global batch", integer(plan.job.global_batch)},
              {"sequence length", integer(plan.job.seq_len)},
              {"precision", escape_html(profiles::to_string(plan.job.precision))},
              {"optimizer", escape_html(plan.job.optimizer + " (" +
                                        costmodel::to_string(plan.job.optimizer_kernels) + ")")},
              {"runtime", escape_html(costmodel::to_string(plan.job.runtime))}});
  out += key_values(
      "Strategy",
      {{"data parallel (dp)", integer(s.dp)},
       {"tensor parallel (tp)", integer(s.tp)},
       {"pipeline parallel (pp)", integer(s.pp)},
       {"ZeRO stage", integer(s.zero)},
       {"micro-batch", integer(s.micro_batch) + (s.micro_batch == 1 ? " sample" : " samples")},
       {"micro-batches (chunks)", integer(s.num_micro_batches) + " per step"},
       {"schedule", escape_html(costmodel::to_string(s.schedule))},
       {"virtual stages", integer(s.virtual_stages)},
       {"recompute", escape_html(costmodel::recompute_cell(s))},
       {"sequence parallel", s.sequence_parallel ? "yes" : "no"},
       {"attention", escape_html(costmodel::to_string(s.attention))},
       {"context parallel (cp)", integer(s.cp)},
       {"world size", integer(s.world_size()) + " ranks"}});
  const costmodel::CostOptions& o = plan.cost_options;
  out +=
      key_values("Provenance", {{"loom version", escape_html(plan.loom_version)},
                                {"prediction source", escape_html(plan.predicted.source)},
                                {"GPU matrix efficiency", fixed_text(o.efficiency.gpu_matrix, 2)},
                                {"GPU memory efficiency", fixed_text(o.efficiency.gpu_memory, 2)},
                                {"DP bucket", profiles::mib_text(o.dp_bucket_bytes)},
                                {"attention scores kept", o.attention_scores ? "yes" : "no"}});
  return out + "</div></section>\n";
}

std::string prediction_section(const Plan& plan, const SimulationResult& sim,
                               const ReportOptions& options) {
  const Prediction& p = plan.predicted;
  const Prediction& q = sim.prediction;
  const std::optional<MeasuredSteps>& measured = options.measured;
  std::string out = "<section id=\"prediction\"><h2>Prediction</h2>\n";
  out += "<table class=\"prediction\"><thead><tr><th></th><th class=\"num\">plan (" +
         escape_html(p.source) + ")</th><th class=\"num\">simulated now</th></tr></thead><tbody>";
  auto row = [&](const std::string& label, const std::string& a, const std::string& b) {
    out += "<tr><th scope=\"row\">" + escape_html(label) + "</th>" + num_cell(a) + num_cell(b) +
           "</tr>";
  };
  row("step time", seconds_text(p.step_time_s), seconds_text(q.step_time_s));
  row("samples/s", fixed_text(p.samples_per_s, 1), fixed_text(q.samples_per_s, 1));
  row("tokens/s", fixed_text(p.tokens_per_s, 0), fixed_text(q.tokens_per_s, 0));
  row("model TFLOP/s per GPU", fixed_text(p.model_tflops_per_gpu, 2),
      fixed_text(q.model_tflops_per_gpu, 2));
  row("hardware TFLOP/s per GPU", fixed_text(p.hardware_tflops_per_gpu, 2),
      fixed_text(q.hardware_tflops_per_gpu, 2));
  row("MFU", percent_text(p.mfu), percent_text(q.mfu));
  row("peak memory (largest rank)", gib_text(p.peak_memory_bytes), gib_text(q.peak_memory_bytes));
  row("pipeline bubble", percent_text(p.bubble_fraction), percent_text(q.bubble_fraction));
  row("exposed communication: dp", seconds_text(p.exposed_communication_s.dp),
      seconds_text(q.exposed_communication_s.dp));
  row("exposed communication: tp", seconds_text(p.exposed_communication_s.tp),
      seconds_text(q.exposed_communication_s.tp));
  row("exposed communication: pp", seconds_text(p.exposed_communication_s.pp),
      seconds_text(q.exposed_communication_s.pp));
  row("exposed communication: zero", seconds_text(p.exposed_communication_s.zero),
      seconds_text(q.exposed_communication_s.zero));
  row("optimizer step", seconds_text(p.optimizer_s), seconds_text(q.optimizer_s));
  out += "</tbody></table>\n";
  out += "<p class=\"note\">Bound by: <strong>" +
         escape_html(binding_constraint(plan, options.memory_margin)) +
         "</strong>. The simulated column plays the plan's step event by event (" +
         integer(sim.events_processed) +
         " events); exposed communication is compute waiting on "
         "communication, per kind, on the worst rank.</p>\n";
  if (measured) {
    const MeasuredSteps& m = *measured;
    out +=
        "<h3>Predicted vs measured</h3><table class=\"measured\"><thead><tr><th></th>"
        "<th class=\"num\">plan</th><th class=\"num\">simulated</th><th class=\"num\">measured"
        "</th><th class=\"num\">error (plan)</th><th class=\"num\">error (simulated)</th>"
        "</tr></thead><tbody>";
    auto error = [](double predicted, double actual) {
      return actual > 0 ? signed_percent((predicted - actual) / actual) : std::string("-");
    };
    out += "<tr><th scope=\"row\">step time (median of " + integer(m.steps) + " steps)</th>" +
           num_cell(seconds_text(p.step_time_s)) + num_cell(seconds_text(q.step_time_s)) +
           num_cell(seconds_text(m.median_step_time_s)) +
           num_cell(error(p.step_time_s, m.median_step_time_s)) +
           num_cell(error(q.step_time_s, m.median_step_time_s)) + "</tr>";
    if (m.peak_memory_bytes) {
      out += "<tr><th scope=\"row\">peak memory</th>" + num_cell(gib_text(p.peak_memory_bytes)) +
             num_cell(gib_text(q.peak_memory_bytes)) + num_cell(gib_text(*m.peak_memory_bytes)) +
             num_cell(error(p.peak_memory_bytes, *m.peak_memory_bytes)) +
             num_cell(error(q.peak_memory_bytes, *m.peak_memory_bytes)) + "</tr>";
    }
    out +=
        "</tbody></table><p class=\"note\">Error = (predicted &minus; measured) / measured."
        "</p>\n";
  }
  out += "</section>\n";
  if (!plan.why.empty()) {
    out += "<section id=\"why\"><h2>Why this plan</h2><ul class=\"why\">";
    for (const std::string& w : plan.why) out += "<li>" + escape_html(w) + "</li>";
    out += "</ul></section>\n";
  }
  return out;
}

std::string timeline_section(const SimulationResult& sim, const ReportOptions& options) {
  report_svg::TimelineSvg t = report_svg::render_timeline(sim, options.max_timeline_rects);
  std::string out = "<section id=\"timeline-section\"><h2>Pipeline timeline</h2>\n";
  out += "<p class=\"note\">One simulated step (" + seconds_text(sim.step_time_s) +
         "): one row per pipeline stage representative (dp = tp = 0) and stream. Numbers on "
         "forward and backward slices are micro-batches; hover a slice for its name and time.";
  if (t.merged) {
    out += " " + integer(static_cast<std::int64_t>(t.slices)) + " slices are drawn as " +
           integer(static_cast<std::int64_t>(t.rects)) +
           " rectangles: neighbours narrower than a few pixels are merged into one place "
           "whose coloured bands show each kind's share of its time.";
  }
  if (t.truncated)
    out += " The chart is cut at " + integer(static_cast<std::int64_t>(t.rects)) + " rectangles.";
  out += "</p>\n";
  std::vector<std::pair<std::string, std::string>> items;
  items.reserve(kSliceKinds);
  for (int k = 0; k < kSliceKinds; ++k) items.emplace_back(kSliceColors[k], kSliceNames[k]);
  out += legend(items);
  out += "<div class=\"scroll\">" + t.svg + "</div></section>\n";
  return out;
}

std::string memory_section(const Plan& plan, const SimulationResult& sim,
                           const ReportOptions& options) {
  const std::vector<MemoryBreakdown>& memory = stage_memory(plan, sim);
  const bool simulated = &memory == &sim.prediction.memory_by_stage;
  std::string out = "<section id=\"memory\"><h2>Memory per stage</h2>\n";
  out += std::string("<p class=\"note\">Largest rank of each pipeline stage, ") +
         (simulated ? "activations at their simulated peak" : "as the plan predicts") +
         "; the red line is the device memory, the dashed one the planning margin.</p>\n";
  std::vector<std::pair<std::string, std::string>> items;
  for (std::size_t k = 0; k < kMemoryParts.size(); ++k) {
    items.emplace_back(kMemoryColors[k], kMemoryParts[k]);
  }
  out += legend(items);
  out += "<div class=\"scroll\">" + render_memory(plan, memory, options.memory_margin) +
         "</div></section>\n";
  return out;
}

std::string stages_section(const Plan& plan, const SimulationResult& sim) {
  const std::vector<MemoryBreakdown>& memory = stage_memory(plan, sim);
  const int per_stage = plan.strategy.dp * plan.strategy.tp * plan.strategy.cp;
  std::string out =
      "<section id=\"stages\"><h2>Stages</h2><table><thead><tr><th>stage</th><th>layers</th>"
      "<th>ranks</th><th class=\"num\">busy</th><th class=\"num\">bubble</th>"
      "<th class=\"num\">exposed comm</th><th class=\"num\">peak memory</th></tr></thead><tbody>";
  for (int r = 0; r < plan.strategy.pp; ++r) {
    const int first = r * per_stage;
    std::string ranks = per_stage == 1
                            ? integer(first)
                            : integer(first) + "&ndash;" + integer(first + per_stage - 1);
    out += "<tr>" + cell(integer(r)) + cell(stage_layers(plan, r)) + cell(ranks);
    if (static_cast<std::size_t>(r) < sim.ranks.size()) {
      const costmodel::RankTimeline& t = sim.ranks[static_cast<std::size_t>(r)];
      out += num_cell(seconds_text(t.busy_s)) + num_cell(seconds_text(t.bubble_s)) +
             num_cell(seconds_text(exposed_total(t.exposed_communication_s))) +
             num_cell(gib_text(t.peak_memory_bytes));
    } else {
      const double total = static_cast<std::size_t>(r) < memory.size()
                               ? memory[static_cast<std::size_t>(r)].total()
                               : 0;
      out += num_cell("-") + num_cell("-") + num_cell("-") + num_cell(gib_text(total));
    }
    out += "</tr>";
  }
  out += "</tbody></table><p class=\"note\">Layers index the layer sequence: 0 is the embedding, " +
         integer(plan.model.layers + 1) + " the head, 1&ndash;" + integer(plan.model.layers) +
         " the transformer layers (inclusive ranges";
  if (plan.strategy.virtual_stages > 1) out += "; one per model chunk of the stage";
  out += "). Busy, bubble and exposed communication are the simulated step's.</p></section>\n";
  return out;
}

std::string ranks_section(const Plan& plan, const ReportOptions& options) {
  std::string out =
      "<section id=\"ranks\"><h2>Rank placement</h2><table class=\"ranks\"><thead><tr>"
      "<th class=\"num\">rank</th><th>device</th><th class=\"num\">dp</th>"
      "<th class=\"num\">tp</th><th class=\"num\">pp</th></tr></thead><tbody>";
  const std::size_t shown = std::min(plan.ranks.size(), options.max_rank_rows);
  for (std::size_t i = 0; i < shown; ++i) {
    const RankPlacement& p = plan.ranks[i];
    out += "<tr>" + num_cell(integer(p.rank)) + "<td class=\"mono\">" + escape_html(p.device) +
           "</td>" + num_cell(integer(p.dp)) + num_cell(integer(p.tp)) + num_cell(integer(p.pp)) +
           "</tr>";
  }
  out += "</tbody></table>";
  if (shown < plan.ranks.size()) {
    out += "<p class=\"note\">&hellip; and " +
           integer(static_cast<std::int64_t>(plan.ranks.size() - shown)) +
           " more ranks in the same order (tp fastest, then dp, then pp; the plan file lists "
           "them all).</p>";
  }
  return out + "</section>\n";
}

std::string alternatives_section(const Plan& plan, const std::vector<Plan>& alternatives,
                                 const ReportOptions& options) {
  std::string out = "<section id=\"alternatives\"><h2>Alternatives</h2>\n";
  if (alternatives.empty()) {
    return out +
           "<p class=\"note\">The unpinned search found no plan that fits under the memory "
           "margin.</p></section>\n";
  }
  out +=
      "<p class=\"note\">The search re-run for the same model, cluster and job with nothing "
      "pinned, ranked by predicted step time; relative to this plan's " +
      seconds_text(plan.predicted.step_time_s) + ".</p>\n";
  out +=
      "<table class=\"alternatives\"><thead><tr><th class=\"num\">#</th>"
      "<th class=\"num\">dp</th><th class=\"num\">tp</th><th class=\"num\">pp</th>"
      "<th class=\"num\">zero</th><th class=\"num\">micro-batch</th>"
      "<th class=\"num\">chunks</th><th>schedule</th><th>recompute</th><th>sp</th>"
      "<th class=\"num\">step time</th><th class=\"num\">vs this plan</th>"
      "<th class=\"num\">peak memory</th><th>bound by</th></tr></thead><tbody>";
  bool found = false;
  for (std::size_t i = 0; i < alternatives.size(); ++i) {
    const Plan& a = alternatives[i];
    const costmodel::Strategy& s = a.strategy;
    const bool current = s == plan.strategy && a.stages == plan.stages;
    found = found || current;
    std::string schedule = costmodel::to_string(s.schedule);
    if (s.virtual_stages > 1) schedule += " v=" + std::to_string(s.virtual_stages);
    const double reference = plan.predicted.step_time_s;
    const std::string relative =
        reference > 0 ? signed_percent((a.predicted.step_time_s - reference) / reference) : "-";
    out += std::string(current ? "<tr class=\"current\">" : "<tr>") +
           num_cell(integer(static_cast<std::int64_t>(i + 1))) + num_cell(integer(s.dp)) +
           num_cell(integer(s.tp)) + num_cell(integer(s.pp)) + num_cell(integer(s.zero)) +
           num_cell(integer(s.micro_batch)) + num_cell(integer(s.num_micro_batches)) +
           cell(escape_html(schedule)) + cell(escape_html(costmodel::recompute_cell(s))) +
           cell(s.tp == 1             ? "-"
                : s.sequence_parallel ? "on"
                                      : "off") +
           num_cell(seconds_text(a.predicted.step_time_s)) +
           num_cell(current ? "this plan" : relative) +
           num_cell(gib_text(a.predicted.peak_memory_bytes)) +
           cell(escape_html(binding_constraint(a, options.memory_margin))) + "</tr>";
  }
  out += "</tbody></table>\n";
  if (!found) {
    out +=
        "<p class=\"note\">This plan is not among them: it was made with pinned dimensions, "
        "another memory margin or another partition.</p>\n";
  }
  const Plan& best = alternatives.front();
  if (!best.why.empty()) {
    out += "<h3>Why #1 ranks first</h3><ul class=\"why\">";
    for (const std::string& w : best.why) out += "<li>" + escape_html(w) + "</li>";
    out += "</ul>\n";
  }
  return out + "</section>\n";
}

// The devices' idle share of the step, and with a pipeline the stage that idles most: the
// pipeline bubble (Megatron's (p-1)/m) says nothing of a stage that waits most of the step.
std::string idle_card(const costmodel::SimulationResult& simulation) {
  const std::vector<double> shares = simulation.idle_shares();
  if (shares.empty()) return "-";
  std::string out = percent_text(simulation.mean_idle_share());
  if (shares.size() > 1) {
    const auto most = std::max_element(shares.begin(), shares.end());
    out += " (stage " + integer(most - shares.begin()) + ": " + percent_text(*most) + ")";
  }
  return out;
}

}  // namespace

std::string escape_html(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string render_report(const Plan& plan, const costmodel::SimulationResult& simulation,
                          const std::vector<Plan>& alternatives, const ReportOptions& options) {
  const Prediction& p = plan.predicted;
  const std::string title = "Loom plan: " + plan.model.name + " on " + plan.cluster.name;
  std::string out =
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
      "<title>" +
      escape_html(title) + "</title>\n<style>" + kStyle + "</style>\n</head>\n";
  out += "<body>\n<header><h1>" + escape_html(title) + "</h1>\n<p class=\"sub\" id=\"strategy\">" +
         escape_html(costmodel::describe(plan.strategy)) + " &middot; " +
         integer(plan.strategy.world_size()) + " ranks &middot; global batch " +
         integer(plan.job.global_batch) + " &times; " + integer(plan.job.seq_len) + " tokens, " +
         escape_html(profiles::to_string(plan.job.precision)) + "</p></header>\n";

  auto card = [](const std::string& label, const std::string& value) {
    return "<div class=\"card\"><div class=\"label\">" + escape_html(label) +
           "</div><div class=\"value\">" + value + "</div></div>";
  };
  out += "<div class=\"cards\">" + card("step time", seconds_text(p.step_time_s)) +
         card("samples/s", fixed_text(p.samples_per_s, 1)) +
         card("tokens/s", fixed_text(p.tokens_per_s, 0)) + card("MFU", percent_text(p.mfu)) +
         card("peak memory", gib_text(p.peak_memory_bytes)) +
         card("devices idle", idle_card(simulation)) +
         card("exposed comm", seconds_text(exposed_total(p.exposed_communication_s))) + "</div>\n";

  out += plan_section(plan);
  out += prediction_section(plan, simulation, options);
  out += timeline_section(simulation, options);
  out += memory_section(plan, simulation, options);
  out += stages_section(plan, simulation);
  out += alternatives_section(plan, alternatives, options);
  out += ranks_section(plan, options);
  out +=
      "<footer><p id=\"rendered-summary\">Not rendered by a browser yet.</p>"
      "<p>Generated by loom " +
      escape_html(loom_version()) + " from a loom-plan/1 document.</p></footer>\n";
  out += std::string("<script>") + kScript + "</script>\n</body>\n</html>\n";
  return out;
}

}  // namespace loom::planner
