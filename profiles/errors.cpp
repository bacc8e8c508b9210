#include "profiles/errors.hpp"

namespace loom {
namespace {
std::string compose(const std::string& source, const std::string& path,
                    const std::string& expectation) {
  std::string out = source;
  if (!path.empty()) out += out.empty() ? path : ": " + path;
  if (!expectation.empty()) out += out.empty() ? expectation : ": " + expectation;
  return out;
}
}  // namespace

InputError::InputError(std::string source, std::string path, std::string expectation)
    : std::runtime_error(compose(source, path, expectation)),
      source_(std::move(source)),
      path_(std::move(path)),
      expectation_(std::move(expectation)) {}

}  // namespace loom
