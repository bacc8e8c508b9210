// Loading models and clusters by built-in name or file path, and writing files safely.
//
// Built-in names resolve to the JSON files shipped under profiles/models and profiles/clusters,
// compiled into the binary, so `loom` works from any directory.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "profiles/cluster.hpp"
#include "profiles/model_spec.hpp"
#include "profiles/runtime_calibration.hpp"

namespace loom::profiles {

std::vector<std::string> builtin_model_names();
std::vector<std::string> builtin_cluster_names();

// `name_or_path`: a built-in name, a loom-model JSON file, a Hugging Face config.json, or a
// checkpoint folder holding one (a folder without config.json is an InputError naming it). The
// head is the file's own (model_spec.hpp's with_head() picks the one a plan gets).
ModelSpec load_model(const std::string& name_or_path);
// `name_or_path`: a built-in name or a loom-cluster JSON file.
Cluster load_cluster(const std::string& name_or_path);

std::vector<std::string> builtin_calibration_names();
// `name_or_path`: a shipped calibration's name (profiles/calibrations) or a loom-calibration JSON
// file; `flag` names the option it came from in errors.
RuntimeCalibration load_calibration(const std::string& name_or_path,
                                    const std::string& flag = "--calibration");
// The shipped calibration of `runtime` on device model `device` (DeviceSpec::name), if any.
std::optional<RuntimeCalibration> shipped_calibration(const std::string& runtime,
                                                      const std::string& device);

// Whole file as text; InputError naming the path when it cannot be read.
std::string read_text_file(const std::string& path);
// Writes `text` to `path` through a temporary file in the same folder and a rename, so the final
// name holds either the old content or the whole new content. Throws InputError naming the path
// when its folder does not exist (or is not a folder), std::runtime_error naming it on any other
// failure (and removes the temporary file).
void write_file_atomically(const std::string& path, const std::string& text);
// Puts the finished folder `tmp` (a sibling of `target`) in place as `target`: renamed directly,
// or, when `target` exists, after moving the old one aside (to ".old-NAME-PID"), which is removed
// last. `target` names a whole folder at every moment but one rename apart. Throws
// std::filesystem::filesystem_error when a rename fails.
void replace_folder(const std::filesystem::path& tmp, const std::filesystem::path& target);

}  // namespace loom::profiles
