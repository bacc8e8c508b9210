// End-to-end tests of `loom report` (docs/README.md): the page, the trace, the errors, and the page
// as a real browser renders it (headless Chromium, Debian's `chromium` package, installed by
// tools/install-deps.sh).
//
// Every command runs in a fresh temporary folder, removed at the end.
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>

namespace fs = std::filesystem;
using Catch::Contains;
using Catch::StartsWith;

namespace {

struct Result {
  int exit_code = -1;
  std::string out;
  std::string err;
};

std::string slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

std::string shell_quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::size_t count_of(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) {
    ++n;
  }
  return n;
}

// A temporary folder for one test, removed at the end; commands run in work().
class ReportSandbox {
 public:
  ReportSandbox() {
    static int counter = 0;
    dir_ = fs::temp_directory_path() /
           ("loom-test-report-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "work");
  }
  ~ReportSandbox() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  ReportSandbox(const ReportSandbox&) = delete;
  ReportSandbox& operator=(const ReportSandbox&) = delete;

  fs::path dir() const { return dir_; }
  fs::path work() const { return dir_ / "work"; }

  // Runs `command` (a shell command line) in work(), stdout and stderr captured apart.
  Result shell(const std::string& command) const {
    const fs::path out = dir_ / "stdout.txt";
    const fs::path err = dir_ / "stderr.txt";
    const std::string line = "cd " + shell_quoted(work().string()) + " && " + command +
                             " </dev/null >" + shell_quoted(out.string()) + " 2>" +
                             shell_quoted(err.string());
    const int status = std::system(line.c_str());
    Result r;
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = slurp(out);
    r.err = slurp(err);
    return r;
  }

  Result loom(const std::string& args) const {
    return shell(shell_quoted(LOOM_BINARY) + " " + args);
  }

  void write(const std::string& name, const std::string& text) const {
    std::ofstream(work() / name, std::ios::binary) << text;
  }

 private:
  fs::path dir_;
};

// Two pipeline stages, so the page has two timeline stages and two memory bars.
const std::string kPipelinePlan =
    "plan --model bert-large --cluster dgx-a100-80g --global-batch 512 --seq-len 512 --tp 2 "
    "--pp 2 --zero 1 --micro-batch 4 --schedule 1f1b --recompute selective -o plan.json";

void make_plan(const ReportSandbox& box) {
  Result r = box.loom(kPipelinePlan);
  INFO("stderr: " << r.err);
  REQUIRE(r.exit_code == 0);
  REQUIRE(fs::exists(box.work() / "plan.json"));
}

// Bad input or failure: the exit code, nothing on stdout, one line "loom report: error: ...".
void require_report_error(const Result& r, int exit_code) {
  INFO("stdout: " << r.out);
  INFO("stderr: " << r.err);
  CHECK(r.exit_code == exit_code);
  CHECK(r.out.empty());
  CHECK(count_of(r.err, "\n") == 1);
  CHECK_THAT(r.err, StartsWith("loom report: error: "));
}

// The Chromium binary on PATH, or empty.
std::string find_chromium(const ReportSandbox& box) {
  for (const char* name : {"chromium", "chromium-browser", "google-chrome"}) {
    Result r = box.shell(std::string("command -v ") + name);
    if (r.exit_code == 0 && !r.out.empty()) return r.out.substr(0, r.out.find('\n'));
  }
  return "";
}

// The value of `attribute="..."` on the first <body ...> tag of `dom`, or empty.
std::string body_attribute(const std::string& dom, const std::string& attribute) {
  const std::size_t body = dom.find("<body");
  if (body == std::string::npos) return "";
  const std::string tag = dom.substr(body, dom.find('>', body) - body);
  std::smatch m;
  const std::regex pattern(attribute + "=\"([^\"]*)\"");
  return std::regex_search(tag, m, pattern) ? m[1].str() : "";
}

}  // namespace

TEST_CASE("loom report writes a self-contained page and the trace", "[tools][cli][report]") {
  ReportSandbox box;
  make_plan(box);
  Result r = box.loom("report plan.json -o report.html --trace t.json");
  INFO("stderr: " << r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.err.empty());
  CHECK_THAT(r.out, Contains("report.html") && Contains("t.json"));
  const std::string page = slurp(box.work() / "report.html");
  CHECK_THAT(page, StartsWith("<!DOCTYPE html>"));
  CHECK_THAT(page, Contains("<title>Loom plan: bert-large on dgx-a100-80g</title>"));
  CHECK_THAT(page, Contains("dp=8 tp=2 pp=2 zero=1"));
  CHECK(count_of(page, "data-stream=\"compute\"") == 2);
  CHECK(count_of(page, "<g class=\"mem-bar\"") == 2);
  CHECK_THAT(page, Contains("<table class=\"alternatives\">"));
  CHECK_THAT(page, !Contains("http://") && !Contains("https://"));
  nlohmann::json trace;
  REQUIRE_NOTHROW(trace = nlohmann::json::parse(slurp(box.work() / "t.json")));
  CHECK(trace.at("traceEvents").size() > 0);
  // The same plan gives the same page.
  Result again = box.loom("report plan.json -o again.html");
  REQUIRE(again.exit_code == 0);
  CHECK(slurp(box.work() / "again.html") == page);
  CHECK_FALSE(fs::exists(box.work() / "again.json"));
}

TEST_CASE("loom report --metrics adds predicted vs measured", "[tools][cli][report]") {
  ReportSandbox box;
  make_plan(box);
  box.write("metrics.jsonl",
            "{\"step\": 1, \"loss\": 0.7, \"step_time_s\": 0.9}\n"
            "{\"step\": 2, \"loss\": 0.6, \"step_time_s\": 0.8, \"peak_memory_bytes\": 1e10}\n"
            "{\"eval\": true, \"step\": 2, \"accuracy\": 0.9}\n");
  Result r = box.loom("report plan.json -o report.html --metrics metrics.jsonl");
  INFO("stderr: " << r.err);
  REQUIRE(r.exit_code == 0);
  const std::string page = slurp(box.work() / "report.html");
  CHECK_THAT(page, Contains("Predicted vs measured") && Contains("median of 2 steps") &&
                       Contains("850.000 ms"));
  box.write("bad.jsonl", "{\"step\": 1, \"step_time_s\": 0.9}\n{oops\n");
  Result bad = box.loom("report plan.json -o bad.html --metrics bad.jsonl");
  require_report_error(bad, 2);
  CHECK_THAT(bad.err, Contains("bad.jsonl") && Contains("line 2"));
  CHECK_FALSE(fs::exists(box.work() / "bad.html"));
}

TEST_CASE("loom report: unreadable, invalid or unwritable files", "[tools][cli][report][errors]") {
  ReportSandbox box;
  Result missing = box.loom("report nope/plan.json -o report.html");
  require_report_error(missing, 2);
  CHECK_THAT(missing.err, Contains("nope/plan.json") && Contains("cannot read"));

  box.write("broken.json", "{\"format\": \"loom-plan/1\",");
  Result broken = box.loom("report broken.json -o report.html");
  require_report_error(broken, 2);
  CHECK_THAT(broken.err, Contains("broken.json") && Contains("not valid JSON"));

  make_plan(box);
  nlohmann::json plan = nlohmann::json::parse(slurp(box.work() / "plan.json"));
  plan["strategy"]["dp"] = 3;
  box.write("wrong.json", plan.dump(2));
  Result wrong = box.loom("report wrong.json -o report.html");
  require_report_error(wrong, 2);
  CHECK_THAT(wrong.err, Contains("wrong.json") && Contains("$.strategy"));
  CHECK_FALSE(fs::exists(box.work() / "report.html"));

  // An -o in a folder that does not exist is the user's to fix: bad input, exit 2.
  Result unwritable = box.loom("report plan.json -o no/such/folder/report.html");
  require_report_error(unwritable, 2);
  CHECK_THAT(unwritable.err, Contains("no/such/folder/report.html") && Contains("folder"));

  Result no_output = box.loom("report plan.json");
  CHECK(no_output.exit_code == 2);
  CHECK_THAT(no_output.err, StartsWith("loom report: error: ") && Contains("-o"));
}

// The page as headless Chromium renders it: the DOM after the inline script ran, which counts
// what the browser drew. Chromium needs --no-sandbox as root (containers, CI) and a profile
// folder it may write; the timeout keeps a stuck browser from hanging the suite.
TEST_CASE("loom report renders in headless Chromium", "[tools][cli][report][browser]") {
  ReportSandbox box;
  const std::string chromium = find_chromium(box);
  INFO("install Chromium with tools/install-deps.sh (Debian package `chromium`)");
  REQUIRE_FALSE(chromium.empty());
  make_plan(box);
  Result r = box.loom("report plan.json -o report.html --trace t.json");
  INFO("stderr: " << r.err);
  REQUIRE(r.exit_code == 0);

  const fs::path page = fs::absolute(box.work() / "report.html");
  const fs::path profile = box.dir() / "chromium-profile";
  const std::string command =
      "HOME=" + shell_quoted(box.dir().string()) + " timeout 60 " + shell_quoted(chromium) +
      " --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run"
      " --no-default-browser-check --disable-extensions --disable-background-networking"
      " --disable-sync --mute-audio --user-data-dir=" +
      shell_quoted(profile.string()) + " --dump-dom " + shell_quoted("file://" + page.string());
  Result dom = box.shell(command);
  INFO("chromium stderr: " << dom.err.substr(0, 2000));
  REQUIRE(dom.exit_code == 0);
  const std::string& html = dom.out;

  // The inline script ran and counted the SVG it found.
  CHECK(body_attribute(html, "data-rendered") == "yes");
  const std::string rects = body_attribute(html, "data-timeline-rects");
  REQUIRE_FALSE(rects.empty());
  CHECK(std::stoi(rects) > 0);
  CHECK(body_attribute(html, "data-memory-bars") == "2");
  CHECK(std::stoi(body_attribute(html, "data-timeline-rows")) >= 2);
  CHECK_THAT(html, Contains("Rendered " + rects + " timeline slices"));
  // The elements themselves, as the browser's DOM has them.
  CHECK(count_of(html, "<rect class=\"slice\"") == static_cast<std::size_t>(std::stoi(rects)));
  CHECK(count_of(html, "<g class=\"mem-bar\"") == 2);
  CHECK_THAT(html, Contains("<title>Loom plan: bert-large on dgx-a100-80g</title>"));
  CHECK_THAT(html, Contains("dp=8 tp=2 pp=2 zero=1"));
}
