#!/usr/bin/env bash
# The size rules of the style guide: no source file over 800 lines, no function over 150 lines.
# Prints one line per file or function over its limit and exits 1 when there is any (0 when
# none); part of `make test`, so CI enforces them.
#
# Usage: tools/check-size.sh [FILE...]   (default: every tracked or new *.cpp and *.hpp under
#                                         profiles costmodel planner lab executor tools tests
#                                         bench fuzz)
#        MAX_FILE_LINES=800 MAX_FUNCTION_LINES=150 tools/check-size.sh
#
# Functions are found by a scanner of braces, not a compiler: it drops comments, string and
# character literals (raw strings too) and preprocessor lines, then reads each '{' at namespace
# or class level. After `namespace`, `class`, `struct`, `union`, `enum` or `extern` it opens a
# scope whose members it reads the same way; after a ')' (a function's parameter list, possibly
# followed by const, noexcept, override, a trailing return type or a constructor's initializers)
# it opens a function, which spans from the first line of its declaration to its closing brace,
# with every lambda, class and block inside counted as part of it; anything else (a braced
# initializer) is skipped whole. A function-like macro that opens a body (Catch2's TEST_CASE) is a
# function too.
set -euo pipefail
MAX_FILE_LINES=${MAX_FILE_LINES:-800}
MAX_FUNCTION_LINES=${MAX_FUNCTION_LINES:-150}
if [ $# -gt 0 ]; then
  files=("$@")
else
  cd "$(dirname "$0")/.."
  mapfile -t files < <(git ls-files --cached --others --exclude-standard -- \
    '*.cpp' '*.hpp' | grep -E '^(profiles|costmodel|planner|lab|executor|tools|tests|bench|fuzz)/' |
    sort -u)
fi
[ ${#files[@]} -gt 0 ] || { echo "check-size.sh: no source files found" >&2; exit 2; }
existing=()
for f in "${files[@]}"; do
  if [ -f "$f" ]; then existing+=("$f"); fi  # git lists files deleted in the work tree
done
exec awk -v max_file="$MAX_FILE_LINES" -v max_function="$MAX_FUNCTION_LINES" '
function report(text) { print text; ++found }
function finish_file() {
  if (file != "" && lines > max_file + 0) {
    report(file ": " lines " lines (at most " max_file ")")
  }
}
function start_file() {
  finish_file()
  file = FILENAME
  lines = 0
  in_block_comment = 0
  in_raw = 0
  depth = 0          # braces open
  kind_depth = 0     # scopes open whose members are read (namespaces, classes)
  header = ""        # code since the last ; { } at a read level
  header_line = 0
  body_depth = -1    # depth at which the open function or initializer ends (-1: none)
}
# Feeds one character of code (comments and literals already removed) to the scanner.
function code_char(c) {
  if (body_depth >= 0) {
    if (c == "{") ++depth
    else if (c == "}") {
      --depth
      if (depth == body_depth) {
        if (body_is_function && FNR - header_line + 1 > max_function + 0) {
          report(file ":" header_line ": function of " FNR - header_line + 1 \
                 " lines (at most " max_function "): " signature)
        }
        body_depth = -1
        header = ""
      }
    }
    return
  }
  if (c == "{") {
    classify()
    ++depth
    return
  }
  if (c == "}") {
    --depth
    if (kind_depth > 0) --kind_depth
    header = ""
    return
  }
  if (c == ";") { header = ""; return }
  if (c == ":" && header ~ /^(public|private|protected)[ \t]*$/) { header = ""; return }
  if (header == "" && c ~ /[ \t]/) return
  if (header == "") header_line = FNR
  header = header c
}
# At a "{" outside any function: a scope to read, a function, or an initializer to skip.
function classify(   h, first) {
  h = header
  gsub(/template[ \t]*<[^{]*>/, "", h)
  sub(/^[ \t]+/, "", h)
  first = h
  sub(/[^A-Za-z_].*$/, "", first)
  if (first ~ /^(namespace|class|struct|union|enum|extern)$/ && h !~ /\)/) {
    ++kind_depth
    header = ""
    return
  }
  if (header_line == 0 || header == "") header_line = FNR
  body_depth = depth
  body_is_function = h ~ /\)/
  signature = h
  gsub(/[ \t]+/, " ", signature)
  if (length(signature) > 80) signature = substr(signature, 1, 77) "..."
  header = ""
}
# Whether the quote at `at` opens a raw string: R, u8R, uR, UR or LR right before it.
function is_raw_prefix(text, at,   j, prefix) {
  j = at - 1
  while (j >= 1 && substr(text, j, 1) ~ /[A-Za-z0-9_]/) --j
  prefix = substr(text, j + 1, at - j - 1)
  return prefix ~ /^(R|u8R|uR|UR|LR)$/
}
FNR == 1 { start_file() }
{
  ++lines
  line = $0
  n = length(line)
  if (!in_block_comment && !in_raw && line ~ /^[ \t]*#/) {
    continuing = line ~ /\\$/
    next
  }
  if (continuing) { continuing = line ~ /\\$/; next }
  i = 1
  while (i <= n) {
    c = substr(line, i, 1)
    if (in_block_comment) {
      if (c == "*" && substr(line, i + 1, 1) == "/") { in_block_comment = 0; i += 2; continue }
      ++i; continue
    }
    if (in_raw) {
      end = index(substr(line, i), raw_end)
      if (end == 0) { i = n + 1; continue }
      i += end - 1 + length(raw_end)
      in_raw = 0
      code_char("0")
      continue
    }
    if (c == "/" && substr(line, i + 1, 1) == "/") break
    if (c == "/" && substr(line, i + 1, 1) == "*") { in_block_comment = 1; i += 2; continue }
    if (c == "\"" && is_raw_prefix(line, i)) {
      open = index(substr(line, i + 1), "(")
      raw_end = ")" substr(line, i + 1, open - 1) "\""
      in_raw = 1
      i += open + 1
      continue
    }
    if (c == "\"" || (c == "\047" && substr(line, i - 1, 1) !~ /[0-9A-Fa-f]/)) {
      quote = c
      ++i
      while (i <= n) {
        d = substr(line, i, 1)
        if (d == "\\") { i += 2; continue }
        if (d == quote) break
        ++i
      }
      ++i
      code_char("0")
      continue
    }
    code_char(c)
    ++i
  }
  code_char(" ")
}
END {
  finish_file()
  exit (found > 0 ? 1 : 0)
}' "${existing[@]}"
