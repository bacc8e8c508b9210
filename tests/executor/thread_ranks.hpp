// Ranks as threads of one test process: run_ranks(n, body) runs body(rank) for rank 0..n-1 on n
// threads, joins them all, then rethrows the first rank's failure (so a Catch assertion or an
// exception on any rank fails the test after every thread has stopped).
#pragma once

#include <exception>
#include <thread>
#include <vector>

namespace loom::test {

template <typename Body>
void run_ranks(int ranks, Body body) {
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace loom::test
