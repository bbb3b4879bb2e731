// Endpoints as users type them: "host", "host:port", "[v6]:port". One parser and one formatter
// for every command that takes one (--rdzv-endpoint, crun status). Plain C++ and inet_pton.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "rendezvous/store/status.h"

namespace crun {

struct Endpoint {
  std::string host;  // a name, an IPv4 literal, or an IPv6 literal without brackets
  std::uint16_t port = 0;

  // "host:port", "[v6]:port".
  std::string ToString() const;
};

// Accepts "host", "host:port", "[v6]" and "[v6]:port" (port 1..65535, else default_port).
// Refused, with a message quoting the text: an empty endpoint or host, a bare IPv6 address
// ("::1:29400" is ambiguous: write [::1]:29400), brackets around something that is not an IPv6
// address, characters no host name has, a bad port.
StatusOr<Endpoint> ParseEndpoint(std::string_view text, std::uint16_t default_port);

}  // namespace crun
