#include "profiles/loader.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string_view>

#include "profiles/builtin_data.hpp"
#include "profiles/errors.hpp"
#include "profiles/json_reader.hpp"
#include "profiles/topology.hpp"

namespace loom::profiles {
namespace {

std::vector<std::string> names_of(const std::vector<BuiltinFile>& files) {
  std::vector<std::string> out;
  out.reserve(files.size());
  for (const auto& f : files) out.emplace_back(f.name);
  return out;
}

const BuiltinFile* find_builtin(const std::vector<BuiltinFile>& files, const std::string& name) {
  for (const auto& f : files) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

bool looks_like_path(const std::string& s) {
  return s.find('/') != std::string::npos || s.find(".json") != std::string::npos;
}

}  // namespace

std::vector<std::string> builtin_model_names() { return names_of(builtin_models()); }
std::vector<std::string> builtin_cluster_names() { return names_of(builtin_clusters()); }
std::vector<std::string> builtin_calibration_names() { return names_of(builtin_calibrations()); }

std::string read_text_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    throw InputError(path, "", "expected a file, found a directory");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw InputError(path, "", std::string("cannot read file (") + std::strerror(errno) + ")");
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

namespace {

// A built-in file's text or a file's, with the name errors should use for it.
struct Resolved {
  std::string text;
  std::string source;
};

Resolved resolve(const std::string& name_or_path, const std::vector<BuiltinFile>& builtins,
                 const char* kind, const char* flag) {
  if (const BuiltinFile* f = find_builtin(builtins, name_or_path)) {
    return {std::string(f->json), std::string("built-in ") + kind + " " + name_or_path};
  }
  std::error_code ec;
  if (!looks_like_path(name_or_path) && !std::filesystem::exists(name_or_path, ec)) {
    throw InputError(flag, "",
                     "\"" + name_or_path + "\" is neither a file nor a built-in " + kind + " (" +
                         join(names_of(builtins)) + ")");
  }
  return {read_text_file(name_or_path), name_or_path};
}

}  // namespace

ModelSpec load_model(const std::string& name_or_path) {
  std::error_code ec;
  if (find_builtin(builtin_models(), name_or_path) == nullptr &&
      std::filesystem::is_directory(name_or_path, ec)) {
    const std::filesystem::path config = std::filesystem::path(name_or_path) / "config.json";
    if (!std::filesystem::is_regular_file(config, ec)) {
      throw InputError(name_or_path, "",
                       "a checkpoint folder holding config.json (a Hugging Face model's "
                       "configuration), found a folder without one");
    }
    return load_model(config.string());
  }
  Resolved r = resolve(name_or_path, builtin_models(), "model", "--model");
  return model_from_json(parse_json_text(r.text, r.source), r.source);
}

Cluster load_cluster(const std::string& name_or_path) {
  Resolved r = resolve(name_or_path, builtin_clusters(), "cluster", "--cluster");
  Cluster cluster = cluster_from_json(parse_json_text(r.text, r.source), r.source);
  // The links name devices and switches: checked here, where the file's name is known, rather
  // than where the planner first builds the topology.
  try {
    const Topology topology(cluster);
  } catch (const InputError& e) {
    throw InputError(r.source, e.path(), e.expectation());
  }
  return cluster;
}

RuntimeCalibration load_calibration(const std::string& name_or_path, const std::string& flag) {
  Resolved r = resolve(name_or_path, builtin_calibrations(), "calibration", flag.c_str());
  return runtime_calibration_from_json(parse_json_text(r.text, r.source), r.source);
}

std::optional<RuntimeCalibration> shipped_calibration(const std::string& runtime,
                                                      const std::string& device) {
  for (const BuiltinFile& f : builtin_calibrations()) {
    RuntimeCalibration c = runtime_calibration_from_json(
        parse_json_text(std::string(f.json), std::string(f.name)), std::string(f.name));
    if (c.runtime == runtime && c.device == device) return c;
  }
  return std::nullopt;
}

void replace_folder(const std::filesystem::path& tmp, const std::filesystem::path& target) {
  namespace fs = std::filesystem;
  if (!fs::exists(target)) {
    fs::rename(tmp, target);
    return;
  }
  const fs::path old = target.parent_path() / (".old-" + target.filename().string() + "-" +
                                               std::to_string(static_cast<long long>(::getpid())));
  fs::remove_all(old);
  fs::rename(target, old);
  fs::rename(tmp, target);
  fs::remove_all(old);
}

void write_file_atomically(const std::string& path, const std::string& text) {
  std::filesystem::path target(path);
  std::filesystem::path dir = target.parent_path().empty() ? "." : target.parent_path();
  std::string tmp = (dir / ("." + target.filename().string() + ".XXXXXX")).string();
  std::vector<char> name(tmp.begin(), tmp.end());
  name.push_back('\0');
  int fd = ::mkstemp(name.data());
  if (fd < 0 && (errno == ENOENT || errno == ENOTDIR)) {
    throw InputError(path, "", "a file in an existing folder: " + dir.string() + " is not one");
  }
  if (fd < 0) {
    throw std::runtime_error("cannot write " + path + ": " + std::strerror(errno));
  }
  auto fail = [&](const char* what) {
    int err = errno;
    ::close(fd);
    ::unlink(name.data());
    throw std::runtime_error("cannot write " + path + " (" + what + "): " + std::strerror(err));
  };
  std::size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("write");
    }
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) fail("fsync");
  ::fchmod(fd, 0644);
  if (::close(fd) != 0) {
    int err = errno;
    ::unlink(name.data());
    throw std::runtime_error("cannot write " + path + " (close): " + std::strerror(err));
  }
  if (::rename(name.data(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(name.data());
    throw std::runtime_error("cannot write " + path + " (rename): " + std::strerror(err));
  }
}

}  // namespace loom::profiles
