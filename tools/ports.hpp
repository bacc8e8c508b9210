// A port for the rendezvous of the ranks a command launches (loom validate, profile and tune on
// several ranks), and for the tests that launch ranks themselves.
#pragma once

namespace loom::tools {

// A TCP port that a bind found free a moment ago, below the kernel's ephemeral range (Linux's
// ip_local_port_range, 32768-60999 by default), from 10000 up, starting at a random point: the
// ranks' outgoing connections and Gloo's listening sockets draw their ports from the ephemeral
// range, so none of them can take this one before the rendezvous binds it. Where the range
// leaves no room below it, the kernel's choice for port 0; 29500 when no socket can be had.
int free_port();

}  // namespace loom::tools
