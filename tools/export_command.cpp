// loom export: a Hugging Face model folder (config.json, model.safetensors, tokenizer files) from
// a checkpoint of loom train, one-rank or many-rank (executor/hf_export.hpp).
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "executor/hf_export.hpp"
#include "executor/tokenizer_files.hpp"
#include "profiles/errors.hpp"
#include "tools/commands.hpp"

namespace loom::tools {

namespace {

namespace fs = std::filesystem;

struct ExportArgs {
  std::string checkpoint;
  std::string output;
  std::string tokenizer;
};

// --tokenizer: the files load_tokenizer() reads from PATH (a file, or a folder picked by the files
// present, as loom train picks them); empty = the checkpoint's own.
std::vector<std::string> tokenizer_files(const std::string& path) {
  if (path.empty()) return {};
  return executor::load_tokenizer(path)->files();
}

int run_export(const ExportArgs& a) {
  executor::export_checkpoint(a.checkpoint, a.output, tokenizer_files(a.tokenizer));
  std::cout << "wrote " << a.output << " (config.json, model.safetensors, tokenizer files)\n";
  return 0;
}

}  // namespace

Runner add_export_command(CLI::App& app) {
  auto args = std::make_shared<ExportArgs>();
  CLI::App* cmd = add_subcommand(app, "export");
  cmd->add_option("checkpoint", args->checkpoint,
                  "a step folder of --checkpoint, or the --checkpoint folder (its latest step)")
      ->required();
  cmd->add_option("-o,--output", args->output, "the Hugging Face model folder to write")
      ->required();
  cmd->add_option("--tokenizer", args->tokenizer,
                  "tokenizer file or folder to copy (default: the checkpoint's tokenizer files)");
  return [args]() { return run_export(*args); };
}

}  // namespace loom::tools
