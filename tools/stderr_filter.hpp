// Keeps Gloo's connection chatter off loom's standard error.
//
// Gloo since 2025 (Debian's libgloo of 2025-09, and the copy inside recent LibTorch builds) writes
// "[gloo/transport/tcp/context.cc:243] INFO Rank 0 is connected to 1. Expected number of connected
// peers is: 1" to std::cerr for every group it connects, unconditionally. Loom's contract is one
// clear line per error on standard error, so the `loom` process edge (tools/main.cpp) installs
// this filter on std::cerr before any thread starts and keeps it for the process's life.
//
// Contract: text written to the filtered stream reaches the original buffer unchanged and in
// order, except whole lines that start with '[', name a file under "gloo/" before the first "] ",
// and continue with "INFO ": those are dropped. Text that does not start a line with '[' passes
// through at once (progress bars that rewrite a line with '\r' still work); a line that starts
// with '[' is held until its '\n', a flush that ends the process (the destructor), or 1024 bytes.
// Gloo's warnings and errors ("WARN", "ERROR") pass. Not thread-safe beyond what std::cerr is.
#pragma once

#include <cstddef>
#include <ostream>
#include <streambuf>
#include <string>

namespace loom::tools {

class GlooInfoFilter final : public std::streambuf {
 public:
  // Installs the filter on `stream` (normally std::cerr) until destruction.
  explicit GlooInfoFilter(std::ostream& stream) : stream_(stream), target_(stream.rdbuf()) {
    stream_.rdbuf(this);
  }
  GlooInfoFilter(const GlooInfoFilter&) = delete;
  GlooInfoFilter& operator=(const GlooInfoFilter&) = delete;
  ~GlooInfoFilter() override {
    release();
    stream_.rdbuf(target_);
  }

  // True for one complete line (without its '\n') that the filter drops.
  static bool is_gloo_info(const std::string& line) {
    if (line.empty() || line[0] != '[') return false;
    const std::size_t close = line.find("] ");
    if (close == std::string::npos) return false;
    const std::size_t gloo = line.find("gloo/");
    return gloo != std::string::npos && gloo < close && line.compare(close + 2, 5, "INFO ") == 0;
  }

 protected:
  int_type overflow(int_type c) override {
    if (traits_type::eq_int_type(c, traits_type::eof())) return traits_type::not_eof(c);
    put(traits_type::to_char_type(c));
    return c;
  }
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    for (std::streamsize i = 0; i < n; ++i) put(s[i]);
    return n;
  }
  int sync() override {
    // A held line waits for its end; everything else has already gone through.
    return target_->pubsync();
  }

 private:
  void put(char c) {
    if (held_.empty() && at_line_start_ && c == '[') {
      held_.push_back(c);
      return;
    }
    if (!held_.empty()) {
      if (c == '\n') {
        if (!is_gloo_info(held_)) {
          target_->sputn(held_.data(), static_cast<std::streamsize>(held_.size()));
          target_->sputc('\n');
        }
        held_.clear();
        at_line_start_ = true;
        return;
      }
      held_.push_back(c);
      if (held_.size() >= kMaxHeldBytes) release();
      return;
    }
    target_->sputc(c);
    at_line_start_ = c == '\n';
  }
  // Passes a held partial line through as it is.
  void release() {
    if (held_.empty()) return;
    target_->sputn(held_.data(), static_cast<std::streamsize>(held_.size()));
    held_.clear();
    at_line_start_ = false;
    target_->pubsync();
  }

  static constexpr std::size_t kMaxHeldBytes = 1024;
  std::ostream& stream_;
  std::streambuf* target_;
  std::string held_;
  bool at_line_start_ = true;
};

}  // namespace loom::tools
