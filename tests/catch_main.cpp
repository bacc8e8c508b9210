// The tests' main: Catch2's, with SIGPIPE ignored as in the `loom` binary (a write to a socket
// whose peer died must fail with EPIPE, which the distributed code reports, not kill the process).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <csignal>

int main(int argc, char* argv[]) {
  std::signal(SIGPIPE, SIG_IGN);
  return Catch::Session().run(argc, argv);
}
