// loom export: a Hugging Face model folder (config.json, model.safetensors, tokenizer files) from
// a checkpoint of loom train, one-rank or many-rank (executor/hf_export.hpp).
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "executor/hf_export.hpp"
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

// --tokenizer: one file, or a folder whose tokenizer files (by their Hugging Face names) are
// copied; empty = the checkpoint's own.
std::vector<std::string> tokenizer_files(const std::string& path) {
  if (path.empty()) return {};
  std::error_code error;
  if (fs::is_regular_file(path, error)) return {path};
  std::vector<std::string> files;
  if (fs::is_directory(path, error)) {
    for (const char* name : executor::kTokenizerFileNames) {
      if (fs::is_regular_file(fs::path(path) / name, error)) {
        files.push_back((fs::path(path) / name).string());
      }
    }
  }
  if (files.empty()) {
    throw InputError("--tokenizer", "",
                     "a tokenizer file or a folder holding one (vocab.txt, vocab.json and "
                     "merges.txt, tokenizer.json), found none at " +
                         path);
  }
  return files;
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
