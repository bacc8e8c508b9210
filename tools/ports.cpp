#include "tools/ports.hpp"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <random>

namespace loom::tools {

namespace {

constexpr int kLowest = 10000;
constexpr int kFallback = 29500;

// The first port of the kernel's ephemeral range (32768 where it cannot be read).
int ephemeral_start() {
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  int first = 0;
  int last = 0;
  if (in >> first >> last && first > 0) return first;
  return 32768;
}

// Binds a fresh socket to `port` on every address (0: the kernel picks) and closes it again;
// returns the port bound, 0 when the bind fails, -1 when no socket can be had.
int try_bind(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  address.sin_port = htons(static_cast<std::uint16_t>(port));
  socklen_t length = sizeof address;
  int bound = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0) {
    bound = ntohs(address.sin_port);
  }
  ::close(fd);
  return bound;
}

}  // namespace

int free_port() {
  const int count = ephemeral_start() - kLowest;
  if (count < 1000) {
    const int port = try_bind(0);
    return port > 0 ? port : kFallback;
  }
  std::random_device entropy;
  const int start = static_cast<int>(entropy() % static_cast<unsigned>(count));
  for (int i = 0; i < count; ++i) {
    const int port = try_bind(kLowest + (start + i) % count);
    if (port < 0) return kFallback;
    if (port > 0) return port;
  }
  return kFallback;
}

}  // namespace loom::tools
