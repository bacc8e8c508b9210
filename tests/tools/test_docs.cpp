// Keeps the documentation true to the repository and to the binary: every relative link in
// README.md and docs/*.md resolves to a file of the repository (and its #anchor to a heading), the
// README stays short, nothing points outside the repository, every subcommand that `loom --help`
// lists has a page docs/<command>.md naming every long option its `--help` lists, and the
// README's planning commands (plan, simulate, report, slurm) run as written, against stand-in
// checkpoint folders holding the real config.json (bench/readme_jobs.sh runs the training too).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cctype>
#include <filesystem>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/tools/cli_sandbox.hpp"

namespace fs = std::filesystem;

namespace {

const fs::path kRoot = fs::path(LOOM_SOURCE_DIR);

// README.md and every docs/*.md, in name order.
std::vector<fs::path> documentation_files() {
  std::vector<fs::path> files{kRoot / "README.md"};
  std::vector<fs::path> pages;
  for (const fs::directory_entry& e : fs::directory_iterator(kRoot / "docs")) {
    if (e.is_regular_file() && e.path().extension() == ".md") pages.push_back(e.path());
  }
  std::sort(pages.begin(), pages.end());
  files.insert(files.end(), pages.begin(), pages.end());
  return files;
}

// The targets of the Markdown links `[text](target)` in `text`.
std::vector<std::string> link_targets(const std::string& text) {
  static const std::regex kLink(R"(\]\(([^()\s]+)\))");
  std::vector<std::string> targets;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), kLink);
       it != std::sregex_iterator(); ++it) {
    targets.push_back((*it)[1].str());
  }
  return targets;
}

// GitHub's anchor of a Markdown heading: lower case, punctuation other than '-' and '_' dropped,
// spaces as '-' ("## Plan: `loom-plan/1`" -> "plan-loom-plan1").
std::string heading_anchor(const std::string& heading) {
  std::string anchor;
  for (const char c : heading) {
    const auto u = static_cast<unsigned char>(c);
    if (std::isalnum(u) || c == '-' || c == '_') {
      anchor += static_cast<char>(std::tolower(u));
    } else if (c == ' ') {
      anchor += '-';
    }
  }
  return anchor;
}

// The anchors of the headings of a Markdown text (outside fenced code blocks).
std::set<std::string> heading_anchors(const std::string& text) {
  std::set<std::string> anchors;
  std::istringstream in(text);
  std::string line;
  bool code = false;
  while (std::getline(in, line)) {
    if (line.rfind("```", 0) == 0) code = !code;
    if (code || line.empty() || line[0] != '#') continue;
    const std::size_t start = line.find_first_not_of('#');
    if (start == std::string::npos || line[start] != ' ') continue;
    anchors.insert(heading_anchor(line.substr(start + 1)));
  }
  return anchors;
}

bool is_external(const std::string& target) {
  return target.rfind("http://", 0) == 0 || target.rfind("https://", 0) == 0 ||
         target.rfind("mailto:", 0) == 0;
}

// The subcommands `loom --help` lists (the lines after "Subcommands:", one name each).
std::vector<std::string> subcommands(const std::string& help) {
  std::vector<std::string> names;
  std::istringstream in(help);
  std::string line;
  bool listing = false;
  static const std::regex kEntry(R"(^\s+([a-z][a-z0-9-]*)(\s.*)?$)");
  while (std::getline(in, line)) {
    if (line.rfind("Subcommands:", 0) == 0) {
      listing = true;
      continue;
    }
    std::smatch m;
    if (listing && std::regex_match(line, m, kEntry)) names.push_back(m[1].str());
  }
  return names;
}

// The long options (`--name`) that a subcommand's `--help` lists under "Options:", --help aside.
std::set<std::string> long_options(const std::string& help) {
  std::set<std::string> options;
  std::istringstream in(help);
  std::string line;
  bool listing = false;
  static const std::regex kName(R"(--[a-z][a-z0-9-]*)");
  while (std::getline(in, line)) {
    if (line.rfind("Options:", 0) == 0) {
      listing = true;
      continue;
    }
    if (!listing || line.empty() || line[0] != ' ') continue;
    // An option line starts with its names ("  -o,--output TEXT REQUIRED  description");
    // continuation lines of a long description start with many spaces and no dash.
    const std::size_t first = line.find_first_not_of(' ');
    if (first == std::string::npos || line[first] != '-') continue;
    const std::string names = line.substr(first, line.find(' ', first) - first);
    for (auto it = std::sregex_iterator(names.begin(), names.end(), kName);
         it != std::sregex_iterator(); ++it) {
      if (it->str() != "--help") options.insert(it->str());
    }
  }
  return options;
}

// True when `text` names `option` as a whole word (`--micro-batch` is not found in
// `--micro-batch-per-device` alone).
bool names_option(const std::string& text, const std::string& option) {
  for (std::size_t at = text.find(option); at != std::string::npos;
       at = text.find(option, at + 1)) {
    const std::size_t end = at + option.size();
    const bool word_end =
        end == text.size() || !(std::isalnum(static_cast<unsigned char>(text[end])) ||
                                text[end] == '-' || text[end] == '_');
    if (word_end) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("documentation helpers parse help and links", "[docs]") {
  CHECK(link_targets("see [a](docs/a.md#x) and [b](https://x.org) ![i](img.png)") ==
        std::vector<std::string>{"docs/a.md#x", "https://x.org", "img.png"});
  CHECK(subcommands("Usage: loom\n\nSubcommands:\n  plan   Search\n  demo   Plan\n") ==
        std::vector<std::string>{"plan", "demo"});
  CHECK(long_options("Options:\n  -h,--help  Print\n  -o,--output TEXT REQUIRED  a --not-this\n"
                     "  --precision TEXT:{bf16,fp16}\n                 bf16 | fp16\n") ==
        std::set<std::string>{"--output", "--precision"});
  CHECK(names_option("use --micro-batch-per-device b", "--micro-batch-per-device"));
  CHECK_FALSE(names_option("use --micro-batch-per-device b", "--micro-batch"));
  CHECK(names_option("`--micro-batch b`", "--micro-batch"));
  CHECK(heading_anchors("# A\n```\n# not a heading\n```\n## Plan: `loom-plan/1`\n") ==
        std::set<std::string>{"a", "plan-loom-plan1"});
}

TEST_CASE("every relative link in README.md and docs/ resolves to a file", "[docs]") {
  const std::vector<fs::path> files = documentation_files();
  REQUIRE(files.size() > 10);
  const fs::path root = fs::canonical(kRoot);
  for (const fs::path& file : files) {
    const std::string text = loom::test::read_all(file);
    for (const std::string& target : link_targets(text)) {
      if (is_external(target)) continue;
      INFO(file.filename().string() << " links to " << target);
      const std::size_t hash = target.find('#');
      const fs::path resolved = file.parent_path() / target.substr(0, hash);
      REQUIRE(fs::exists(resolved));
      const std::string inside = fs::canonical(resolved).string();
      CHECK(inside.rfind(root.string(), 0) == 0);
      if (hash != std::string::npos) {
        const fs::path page = hash == 0 ? file : resolved;
        CHECK(heading_anchors(loom::test::read_all(page)).count(target.substr(hash + 1)) == 1);
      }
    }
  }
}

TEST_CASE("README.md stays under 150 lines", "[docs]") {
  const std::string readme = loom::test::read_all(kRoot / "README.md");
  REQUIRE(!readme.empty());
  CHECK(loom::test::line_count(readme) < 150);
}

TEST_CASE("the documentation points at nothing outside the repository", "[docs]") {
  static const std::regex kHistory(R"((issue|session) #?[0-9]+)", std::regex::icase);
  // Any path that climbs with ../ must name a file or folder of the repository, link or not.
  static const std::regex kClimb(R"((\.\./)+[A-Za-z0-9_.-]*)");
  const std::string root = fs::weakly_canonical(kRoot).string();
  for (const fs::path& file : documentation_files()) {
    const std::string text = loom::test::read_all(file);
    INFO(file.filename().string());
    for (std::sregex_iterator m(text.begin(), text.end(), kClimb), end; m != end; ++m) {
      const fs::path target = (file.parent_path() / m->str()).lexically_normal();
      INFO(m->str());
      CHECK(fs::exists(target));
      CHECK(fs::weakly_canonical(target).string().rfind(root, 0) == 0);
    }
    CHECK(text.find("/work/") == std::string::npos);
    CHECK_FALSE(std::regex_search(text, kHistory));
  }
}

TEST_CASE("every repository file that sources and docs cite exists", "[docs]") {
  // A path that starts at one of the repository's top folders and names a file, in any source,
  // script or page; relative to the root, or to the citing file's folder (tests/CMakeLists.txt).
  static const std::regex kCited(
      R"((^|[^A-Za-z0-9_./-])((profiles|costmodel|planner|executor|tools|bench|docs|tests|cmake|)"
      R"(fuzz)/[A-Za-z0-9_./-]+\.(hpp|cpp|md|sh|py|json|cmake|txt)))");
  // Citations of other projects' files and placeholders, not of this repository's.
  const std::set<std::string> elsewhere = {
      "docs/source/distrib_optimizer.md",       // Megatron-LM's documentation
      "bench/reports/YYYY-MM-DD-topic.md",      // the name a new report takes
      "profiles/models/x.json", "docs/a.md",    // examples in an error text and a test
      "profiles/h200-bert-base-chained.json"};  // a profile a GPU run wrote on its machine
  const std::set<std::string> extensions = {".cpp", ".hpp", ".md", ".sh", ".py", ".txt", ".cmake"};
  int cited = 0;
  for (auto it = fs::recursive_directory_iterator(kRoot); it != fs::recursive_directory_iterator();
       ++it) {
    const std::string name = it->path().filename().string();
    if (it->is_directory() &&
        (name.rfind("build", 0) == 0 || name[0] == '.' || name == "gpu-runs")) {
      it.disable_recursion_pending();
      continue;
    }
    if (!it->is_regular_file() || extensions.count(it->path().extension().string()) == 0) continue;
    const std::string text = loom::test::read_all(it->path());
    for (std::sregex_iterator m(text.begin(), text.end(), kCited), end; m != end; ++m) {
      const std::string path = (*m)[2].str();
      if (elsewhere.count(path) > 0) continue;
      ++cited;
      INFO(fs::relative(it->path(), kRoot).string() << " cites " << path);
      CHECK((fs::exists(kRoot / path) || fs::exists(it->path().parent_path() / path)));
    }
  }
  CHECK(cited > 100);
}

TEST_CASE("every subcommand has a page naming every option of its --help", "[docs]") {
  loom::test::CliSandbox box("docs");
  const loom::test::CliResult top = box.loom("--help");
  REQUIRE(top.exit_code == 0);
  const std::vector<std::string> commands = subcommands(top.out);
  REQUIRE(commands.size() >= 10);
  for (const std::string& command : commands) {
    INFO("loom " << command);
    const fs::path page = kRoot / "docs" / (command + ".md");
    REQUIRE(fs::exists(page));
    const loom::test::CliResult help = box.loom(command + " --help");
    if (help.exit_code != 0) {
      // A build without LibTorch has no loom-torch to answer for train, profile, ...
      WARN("loom " << command << " --help failed (" << help.err << "): options not checked");
      continue;
    }
    const std::set<std::string> options = long_options(help.out);
    const std::string text = loom::test::read_all(page);
    for (const std::string& option : options) {
      INFO("option " << option << " on docs/" << command << ".md");
      CHECK(names_option(text, option));
    }
  }
}

namespace {

// The lines of README.md's ```sh blocks (the runnable ones; bench/readme_jobs.sh runs them all).
std::vector<std::string> readme_commands() {
  std::vector<std::string> commands;
  std::istringstream in(loom::test::read_all(kRoot / "README.md"));
  std::string line;
  bool runnable = false;
  while (std::getline(in, line)) {
    if (line.rfind("```", 0) == 0) {
      runnable = !runnable && line == "```sh";
      continue;
    }
    if (runnable && !line.empty() && line[0] != '#') commands.push_back(line);
  }
  return commands;
}

// The config.json of the Hugging Face Hub's bert-base-cased and roberta-large: what the README's
// checkpoint folders hold for planning.
constexpr const char* kBertBaseCasedConfig = R"({
  "architectures": ["BertForMaskedLM"], "attention_probs_dropout_prob": 0.1,
  "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "hidden_size": 768,
  "initializer_range": 0.02, "intermediate_size": 3072, "layer_norm_eps": 1e-12,
  "max_position_embeddings": 512, "model_type": "bert", "num_attention_heads": 12,
  "num_hidden_layers": 12, "pad_token_id": 0, "position_embedding_type": "absolute",
  "type_vocab_size": 2, "vocab_size": 28996})";
constexpr const char* kRobertaLargeConfig = R"({
  "architectures": ["RobertaForMaskedLM"], "attention_probs_dropout_prob": 0.1,
  "bos_token_id": 0, "eos_token_id": 2, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
  "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 4096,
  "layer_norm_eps": 1e-05, "max_position_embeddings": 514, "model_type": "roberta",
  "num_attention_heads": 16, "num_hidden_layers": 24, "pad_token_id": 1,
  "type_vocab_size": 1, "vocab_size": 50265})";

}  // namespace

TEST_CASE("the README's planning commands run as written", "[docs]") {
  const std::vector<std::string> commands = readme_commands();
  REQUIRE(commands.size() >= 20);
  loom::test::CliSandbox box("readme");
  std::filesystem::create_directories(box.work() / "bert-base-cased");
  std::filesystem::create_directories(box.work() / "roberta-large");
  box.write("bert-base-cased/config.json", kBertBaseCasedConfig);
  box.write("roberta-large/config.json", kRobertaLargeConfig);
  int planned = 0;
  for (const std::string& command : commands) {
    // Training needs checkpoints, data and GPUs (bench/readme_jobs.sh runs it on stand-ins).
    const bool planning =
        command.rfind("loom plan ", 0) == 0 || command.rfind("loom simulate ", 0) == 0 ||
        command.rfind("loom report ", 0) == 0 || command.rfind("loom slurm ", 0) == 0;
    if (!planning) continue;
    // A report of a run's metrics needs the run.
    if (command.find("--metrics") != std::string::npos) continue;
    INFO(command);
    const loom::test::CliResult r = box.loom(command.substr(5));
    INFO(r.err);
    CHECK(r.exit_code == 0);
    ++planned;
  }
  CHECK(planned >= 15);
}

TEST_CASE("the README tour's training on this machine learns", "[docs][train]") {
  // The tour's own CPU plan and launch lines, as written: its validation accuracy must be well
  // above chance (two labels), or the first thing a new user runs looks broken.
  std::vector<std::string> tour;
  for (const std::string& command : readme_commands()) {
    if (command.find("cpu.json") != std::string::npos &&
        (command.rfind("loom plan ", 0) == 0 || command.rfind("loom launch ", 0) == 0)) {
      tour.push_back(command);
    }
  }
  REQUIRE(tour.size() == 2);
  loom::test::CliSandbox box("readme-tour");
  REQUIRE(box.loom(tour[0].substr(5)).exit_code == 0);
  // `loom launch ... -- loom train`: the ranks run this build's loom, not one on PATH.
  std::string launch = tour[1].substr(5);
  const std::string inner = "-- loom ";
  REQUIRE(launch.find(inner) != std::string::npos);
  launch.replace(launch.find(inner), inner.size(),
                 "-- " + loom::test::shell_quoted(LOOM_BINARY) + " ");
  const loom::test::CliResult r = box.loom(launch);
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  const std::regex accuracy(R"(\[rank 0\] validation accuracy ([0-9.]+) %)");
  std::smatch m;
  REQUIRE(std::regex_search(r.out, m, accuracy));
  CHECK(std::stod(m[1]) >= 80.0);
}
