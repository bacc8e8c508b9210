// The rows of the bad-input table (test_bad_input_table.cpp): what each row writes into its
// sandbox, the command it runs and the substrings its one error line must hold, with the valid
// files the rows start from and edit.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace loom::test::bad_input {

using nlohmann::json;

// Files to write, relative to the sandbox's work folder; a name ending in '/' is an empty folder.
using Files = std::vector<std::pair<std::string, std::string>>;

// The valid plans every row starts from, made once by `loom plan`.
struct Plans {
  json one;  // one rank
  json two;  // dp=2 on two devices
};

struct Row {
  std::string name;
  Files files;                        // added to (or replacing) the base files
  std::string args;                   // shell words after `loom`
  std::vector<std::string> expected;  // substrings of the error line
  std::string env;                    // NAME=VALUE words
};

// The tiny encoder of these rows: hidden 24 with 3 heads, so tp=2 divides ffn_hidden but not the
// heads; its vocabulary (100) holds the synthetic one.
json valid_model();
// The local-cpu cluster with `devices` devices.
json cpu_cluster(int devices);
// `j` as a file's text.
std::string text(const json& j);
// A WordPiece vocabulary the rows' data uses.
inline constexpr const char* kVocab = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\ngood\nbad\nfilm\n";

// Every row, over `plans` (names unique).
std::vector<Row> table(const Plans& plans);

}  // namespace loom::test::bad_input
