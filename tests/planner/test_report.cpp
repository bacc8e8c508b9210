// The HTML report: what the page shows, escaping, determinism, no network, bounded size, and
// the metrics summary behind "predicted vs measured".
#include <catch2/catch.hpp>
#include <string>

#include "planner/report.hpp"
#include "planner/search.hpp"
#include "profiles/errors.hpp"
#include "profiles/loader.hpp"

using namespace loom;
using namespace loom::planner;
using Catch::Contains;

namespace {

std::size_t occurrences(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) {
    ++n;
  }
  return n;
}

// bert-large on 32 A100s with two pipeline stages.
Plan pipeline_plan() {
  costmodel::CostModel cost(profiles::load_model("bert-large"),
                            profiles::load_cluster("dgx-a100-80g"));
  SearchOptions o;
  o.pp = 2;
  o.tp = 2;
  o.top = 1;
  SearchResult r = search(cost, {512, 512, profiles::Precision::kBf16, "adamw"}, o);
  REQUIRE_FALSE(r.plans.empty());
  return r.plans.front();
}

std::string render(const Plan& plan, const ReportOptions& options = {}) {
  return render_report(plan, simulate_plan(plan), alternatives_of(plan), options);
}

}  // namespace

TEST_CASE("the report shows the plan, the timeline, memory and the alternatives",
          "[planner][report]") {
  const Plan plan = pipeline_plan();
  REQUIRE(plan.strategy.pp == 2);
  const std::string page = render(plan);
  CHECK_THAT(page, Contains("<!DOCTYPE html>"));
  CHECK_THAT(page, Contains("<title>Loom plan: bert-large on dgx-a100-80g</title>"));
  CHECK_THAT(page, Contains("tp=2 pp=2"));
  // The timeline: one compute row per pipeline stage, slices drawn.
  CHECK_THAT(page, Contains("<svg id=\"timeline\""));
  CHECK(occurrences(page, "data-stream=\"compute\"") == 2);
  CHECK_THAT(page, Contains("data-stage=\"1\" data-stream=\"compute\""));
  CHECK(occurrences(page, "<rect class=\"slice\"") > 0);
  CHECK_THAT(page, Contains("time (ms)"));
  // Memory: one stacked bar per stage, with the device limit.
  CHECK(occurrences(page, "<g class=\"mem-bar\"") == 2);
  CHECK_THAT(page, Contains("data-part=\"parameters\"") && Contains("data-part=\"optimizer\"") &&
                       Contains("data-part=\"activations\""));
  CHECK_THAT(page, Contains("device memory 80.00 GiB"));
  // The alternatives and the plan's reasons.
  CHECK_THAT(page, Contains("<table class=\"alternatives\">"));
  CHECK_THAT(page, Contains("bound by"));
  for (const std::string& why : plan.why) CHECK_THAT(page, Contains(escape_html(why)));
  // The prediction, the stages, the ranks.
  CHECK_THAT(page, Contains("exposed communication: tp"));
  CHECK_THAT(page, Contains("<section id=\"stages\">"));
  CHECK_THAT(page, Contains("node0/gpu0"));
  CHECK_THAT(page, Contains("id=\"rendered-summary\""));
}

TEST_CASE("the report is deterministic and needs no network", "[planner][report]") {
  const Plan plan = pipeline_plan();
  const std::string a = render(plan);
  const std::string b = render(plan);
  CHECK(a == b);
  CHECK_THAT(a, !Contains("http://") && !Contains("https://"));
  CHECK_THAT(a,
             !Contains("<link") && !Contains("src=") && !Contains("@import") && !Contains("url("));
}

TEST_CASE("the report escapes text from the plan", "[planner][report]") {
  Plan plan = pipeline_plan();
  plan.model.name = "<script>alert('x')</script> & co";
  plan.why.push_back("a \"quoted\" <b>reason</b>");
  const std::string page = render_report(plan, simulate_plan(plan), {});
  CHECK_THAT(page, !Contains("<script>alert"));
  CHECK_THAT(page, Contains("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; co"));
  CHECK_THAT(page, Contains("a &quot;quoted&quot; &lt;b&gt;reason&lt;/b&gt;"));
  CHECK(occurrences(page, "<script>") == 1);  // only the page's own
  // No alternatives: said, not a crash.
  CHECK_THAT(page, Contains("found no plan"));
}

TEST_CASE("escape_html replaces the five special characters", "[planner][report]") {
  CHECK(escape_html("a<b>&\"c'") == "a&lt;b&gt;&amp;&quot;c&#39;");
  CHECK(escape_html("plain") == "plain");
}

TEST_CASE("the timeline stays small: slices beyond the cap are merged", "[planner][report]") {
  const Plan plan = pipeline_plan();
  const costmodel::SimulationResult sim = simulate_plan(plan);
  ReportOptions small;
  small.max_timeline_rects = 40;
  REQUIRE(sim.slices.size() > 40);
  const std::string page = render_report(plan, sim, {}, small);
  const std::size_t rects = occurrences(page, "<rect class=\"slice\"");
  CHECK(rects > 0);
  CHECK(rects <= 40);
  CHECK_THAT(page, Contains("data-merged="));
  CHECK(occurrences(page, "data-stream=\"compute\"") == 2);  // every row is still there
  // Without a cap problem nothing is merged.
  const std::string full = render_report(plan, sim, {});
  CHECK_THAT(full, !Contains("data-merged="));
  CHECK(occurrences(full, "<rect class=\"slice\"") == sim.slices.size());
}

TEST_CASE("the report of an interleaved plan lists every chunk of a stage", "[planner][report]") {
  costmodel::CostModel cost(profiles::load_model("bert-large"),
                            profiles::load_cluster("dgx-a100-80g"));
  SearchOptions o;
  o.pp = 2;
  o.tp = 8;
  o.schedule = costmodel::Schedule::kInterleaved;
  o.virtual_stages = 2;
  o.top = 1;
  SearchResult r = search(cost, {512, 512, profiles::Precision::kBf16, "adamw"}, o);
  REQUIRE_FALSE(r.plans.empty());
  const Plan& plan = r.plans.front();
  REQUIRE(plan.stages.size() == 4);
  const std::string page = render_report(plan, simulate_plan(plan), {});
  const auto range = [](const costmodel::StageRange& s) {
    return std::to_string(s.first_layer) + "&ndash;" + std::to_string(s.last_layer);
  };
  CHECK_THAT(page, Contains(range(plan.stages[0]) + ", " + range(plan.stages[2])));
  CHECK(occurrences(page, "<g class=\"mem-bar\"") == 2);
}

TEST_CASE("predicted vs measured from a metrics file", "[planner][report]") {
  const std::string jsonl =
      "{\"step\": 1, \"loss\": 0.7, \"step_time_s\": 0.50, \"peak_memory_bytes\": 1000}\n"
      "\n"
      "{\"step\": 2, \"loss\": 0.6, \"step_time_s\": 0.20, \"peak_memory_bytes\": 3000}\n"
      "{\"eval\": true, \"step\": 2, \"accuracy\": 0.9, \"loss\": 0.5}\n"
      "{\"step\": 3, \"loss\": 0.5, \"step_time_s\": 0.30}\n"
      "{\"step\": 4, \"loss\": 0.4, \"step_time_s\": 0.40}\n";
  const MeasuredSteps m = summarize_metrics(jsonl, "metrics.jsonl");
  CHECK(m.steps == 4);
  CHECK(m.median_step_time_s == Approx(0.35));
  REQUIRE(m.peak_memory_bytes);
  CHECK(*m.peak_memory_bytes == 3000);

  const Plan plan = pipeline_plan();
  ReportOptions options;
  options.measured = m;
  const std::string page = render_report(plan, simulate_plan(plan), {}, options);
  CHECK_THAT(page, Contains("Predicted vs measured") && Contains("median of 4 steps") &&
                       Contains("350.000 ms"));

  auto error_of = [](const std::string& text) {
    try {
      summarize_metrics(text, "m.jsonl");
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  CHECK_THAT(error_of("{\"step\": 1, \"step_time_s\": 0.1}\nnot json\n"),
             Contains("m.jsonl") && Contains("line 2"));
  CHECK_THAT(error_of("{\"step_time_s\": \"fast\"}\n"),
             Contains("line 1") && Contains("step_time_s"));
  CHECK_THAT(error_of("{\"eval\": true, \"loss\": 0.3}\n"), Contains("none"));
  CHECK_THAT(error_of("{\"step_time_s\": 0.1, \"phases_s\": 3}\n"), Contains("line 1: phases_s"));
  CHECK_THAT(error_of("{\"step_time_s\": 0.1, \"phases_s\": {\"forward\": -1}}\n"),
             Contains("phases_s.forward"));
}

TEST_CASE("each phase of loom train's steps gets its median over the steps after the warm-up",
          "[planner][report]") {
  const std::string jsonl =
      "{\"step\": 1, \"step_time_s\": 0.9, \"phases_s\": {\"forward\": 0.5, \"backward\": 0.4}}\n"
      "{\"step\": 2, \"step_time_s\": 0.3, \"phases_s\": {\"forward\": 0.1, \"backward\": 0.2}}\n"
      "{\"step\": 3, \"step_time_s\": 0.4, \"phases_s\": {\"forward\": 0.3, \"backward\": 0.1}}\n"
      "{\"step\": 4, \"step_time_s\": 0.5, \"phases_s\": {\"forward\": 0.2, \"backward\": 0.3}}\n";
  const MeasuredSteps m = summarize_metrics(jsonl, "metrics.jsonl", 1);
  CHECK(m.median_step_time_s == Approx(0.4));
  // In the lines' order (not alphabetical), step 1 left out.
  REQUIRE(m.median_phases_s.size() == 2);
  CHECK(m.median_phases_s[0].first == "forward");
  CHECK(m.median_phases_s[0].second == Approx(0.2));
  CHECK(m.median_phases_s[1].first == "backward");
  CHECK(m.median_phases_s[1].second == Approx(0.2));
  CHECK(summarize_metrics("{\"step_time_s\": 0.1}\n", "m.jsonl").median_phases_s.empty());
}
