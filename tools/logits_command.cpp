// loom logits: a sequence classifier's logits for given token ids, from a Hugging Face checkpoint
// folder (config.json and model.safetensors), to compare Loom's model with another
// implementation's (bench/gpu.sh against transformers).
//
// IDS.json: {"input_ids": [[101, 2023, ...], ...], "attention_mask": [[1, 1, ...], ...],
// "token_type_ids": [[0, 0, ...], ...]} (the last two optional: all ones, all zeros). Output:
// {"format": "loom-logits/1", "model", "device", "precision", "logits": [[...], ...]}.
#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "executor/model.hpp"
#include "executor/train.hpp"
#include "profiles/errors.hpp"
#include "profiles/json_reader.hpp"
#include "profiles/loader.hpp"
#include "tools/commands.hpp"

namespace loom::tools {

namespace {

namespace fs = std::filesystem;

struct LogitsArgs {
  std::string init;
  std::string ids;
  std::string output;
  std::string device = "cpu";
  std::string precision = "fp32";
  std::uint64_t seed = 42;
};

// ids[field] as rows of integers, or empty when the field is absent and optional.
std::vector<std::vector<std::int64_t>> rows_of(const nlohmann::json& doc, const std::string& field,
                                               const std::string& source, bool required) {
  if (!doc.contains(field)) {
    if (required) throw InputError(source, "$." + field, "an array of rows of token ids");
    return {};
  }
  const nlohmann::json& rows = doc.at(field);
  std::vector<std::vector<std::int64_t>> out;
  if (!rows.is_array()) throw InputError(source, "$." + field, "an array of rows");
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const std::string where = "$." + field + "[" + std::to_string(i) + "]";
    if (!rows[i].is_array()) throw InputError(source, where, "an array of integers");
    std::vector<std::int64_t> row;
    for (std::size_t j = 0; j < rows[i].size(); ++j) {
      const nlohmann::json& x = rows[i][j];
      if (!x.is_number_integer()) {
        throw InputError(source, where + "[" + std::to_string(j) + "]", "an integer");
      }
      row.push_back(x.get<std::int64_t>());
    }
    out.push_back(std::move(row));
  }
  return out;
}

int run_logits(const LogitsArgs& a) {
  const fs::path config = fs::path(a.init) / "config.json";
  const fs::path weights = fs::path(a.init) / "model.safetensors";
  for (const fs::path& needed : {config, weights}) {
    if (!fs::exists(needed)) {
      throw InputError("--init", "",
                       "a Hugging Face checkpoint folder with config.json and model.safetensors: " +
                           needed.string() + " does not exist");
    }
  }
  executor::LogitsRequest request;
  request.model = profiles::load_model(config.string());
  try {
    executor::check_encoder(request.model);  // named in the config's terms
  } catch (const InputError& e) {
    const std::string key = e.path() == "activation" ? "hidden_act" : e.path();
    throw InputError(config.string(), key.empty() ? "$" : "$." + key, e.expectation());
  }
  request.weights = weights.string();
  request.seed = a.seed;
  request.source = a.ids;
  const nlohmann::json doc = profiles::parse_json_text(profiles::read_text_file(a.ids), a.ids);
  if (!doc.is_object()) throw InputError(a.ids, "$", "an object with input_ids");
  request.input_ids = rows_of(doc, "input_ids", a.ids, true);
  request.attention_mask = rows_of(doc, "attention_mask", a.ids, false);
  request.token_type_ids = rows_of(doc, "token_type_ids", a.ids, false);
  const auto device = executor::parse_device(a.device);
  if (!device) throw InputError("--device", "", "cpu or cuda, found \"" + a.device + "\"");
  request.device = *device;
  const auto precision = profiles::parse_precision(a.precision);
  if (!precision || *precision == profiles::Precision::kFp8) {
    throw InputError("--precision", "", "fp32, tf32, bf16 or fp16, found \"" + a.precision + "\"");
  }
  request.precision = *precision;

  const std::vector<std::vector<double>> logits = executor::classifier_logits(request);
  nlohmann::ordered_json out;
  out["format"] = "loom-logits/1";
  out["model"] = request.model.name;
  out["device"] = a.device;
  // What ran: classifier_logits refuses a precision the device does not run.
  out["precision"] = a.precision;
  out["logits"] = logits;
  const std::string text = out.dump() + "\n";
  if (a.output.empty() || a.output == "-") {
    std::cout << text;
  } else {
    profiles::write_file_atomically(a.output, text);
  }
  return 0;
}

}  // namespace

Runner add_logits_command(CLI::App& app) {
  auto args = std::make_shared<LogitsArgs>();
  CLI::App* cmd = add_subcommand(app, "logits");
  cmd->add_option("--init", args->init, "checkpoint folder (config.json, model.safetensors)")
      ->required();
  cmd->add_option("--ids", args->ids,
                  "IDS.json: {\"input_ids\": [[...]], \"attention_mask\": [[...]]}")
      ->required();
  cmd->add_option("-o,--output", args->output, "write the JSON here (default: stdout)");
  cmd->add_option("--device", args->device, "cpu | cuda");
  cmd->add_option("--precision", args->precision,
                  "fp32 | tf32 | bf16 | fp16 (autocast; the CPU runs fp32 and bf16)");
  cmd->add_option("--seed", args->seed, "seed of head weights the checkpoint lacks")->check(kSeed);
  return [args]() { return run_logits(*args); };
}

}  // namespace loom::tools
