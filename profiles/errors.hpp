// Errors shared by every layer.
//
// InputError is the one failure a user can cause and fix: a bad file, field or flag. Its message
// names the input (file or flag), the JSON path or field, and what was expected. The command line
// prints it as `loom <subcommand>: error: <message>` and exits with code 2. Library code throws it,
// never exits.
#pragma once

#include <stdexcept>
#include <string>

namespace loom {

class InputError : public std::runtime_error {
 public:
  // `source`: the file or flag ("profiles/models/x.json", "--tp"); `path`: the JSON path
  // ("$.device.memory_bytes") or empty; `expectation`: what a good value looks like.
  InputError(std::string source, std::string path, std::string expectation);

  const std::string& source() const { return source_; }
  const std::string& path() const { return path_; }
  const std::string& expectation() const { return expectation_; }

 private:
  std::string source_;
  std::string path_;
  std::string expectation_;
};

}  // namespace loom
