// The HTML report: what the page shows, escaping, determinism, no network, bounded size, and
// "predicted vs measured".
#include <catch2/catch.hpp>
#include <cstdio>
#include <string>
#include <vector>

#include "planner/replan.hpp"
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
  CHECK_THAT(page, Contains("<th>recompute</th><th>sp</th>"));
  // The job's runtime and the strategy's attention kernels and sequence parallelism.
  CHECK_THAT(page, Contains("<tr><th scope=\"row\">runtime</th><td>loom</td></tr>"));
  CHECK_THAT(page, Contains("<tr><th scope=\"row\">attention</th><td>flash</td></tr>"));
  CHECK_THAT(page, Contains(std::string("<tr><th scope=\"row\">sequence parallel</th><td>") +
                            (plan.strategy.sequence_parallel ? "yes" : "no") + "</td></tr>"));
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

TEST_CASE("predicted vs measured from a run's measured steps", "[planner][report]") {
  MeasuredSteps m;
  m.steps = 4;
  m.median_step_time_s = 0.35;
  m.peak_memory_bytes = 3000;
  const Plan plan = pipeline_plan();
  ReportOptions options;
  options.measured = m;
  const std::string page = render_report(plan, simulate_plan(plan), {}, options);
  CHECK_THAT(page, Contains("Predicted vs measured") && Contains("median of 4 steps") &&
                       Contains("350.000 ms"));
}

TEST_CASE("the report's headline shows the devices' idle share and the idlest stage",
          "[planner][report]") {
  // The naive split: the embedding alone on GPU 0, everything else on GPU 1.
  costmodel::CostModel cost(profiles::load_model("bert-base"),
                            profiles::load_cluster("v100-32g-2x-pcie"));
  SearchOptions o;
  o.pp = 2;
  o.dp = 1;
  o.tp = 1;
  o.micro_batch = 32;
  o.stages = std::vector<costmodel::StageRange>{{0, 0}, {1, 13}};
  o.top = 1;
  const SearchResult r = search(cost, {32, 512, profiles::Precision::kFp16, "adamw"}, o);
  REQUIRE_FALSE(r.plans.empty());
  const costmodel::SimulationResult sim = simulate_plan(r.plans.front());
  const std::vector<double> shares = sim.idle_shares();
  REQUIRE(shares.size() == 2);
  // Stage 0 waits for stage 1 almost the whole step; the mean is half of the two GPUs' time.
  CHECK(shares[0] > 0.95);
  CHECK(shares[1] < 0.05);
  CHECK(sim.mean_idle_share() == Approx((shares[0] + shares[1]) / 2));
  const std::string page = render_report(r.plans.front(), sim, {});
  char expected[128];
  std::snprintf(expected, sizeof expected,
                "<div class=\"label\">devices idle</div><div class=\"value\">%.1f %% (stage 0: "
                "%.1f %%)</div>",
                100 * sim.mean_idle_share(), 100 * shares[0]);
  CHECK_THAT(page, Contains(expected));
  CHECK_THAT(page, !Contains("<div class=\"label\">bubble</div>"));
}
