// Endpoints as users type them: "host", "host:port", "[v6]:port". The one parser and the one
// formatter of host:port in crun (flags, messages, gRPC targets, listening addresses), and the
// one loopback test. Plain C++ and inet_pton.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "base/status.h"

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

// "host:port", or "[v6]:port" when the host is an IPv6 literal (one given in brackets keeps
// them).
std::string FormatEndpoint(std::string_view host, std::uint16_t port);

// Whether `host` (an IP literal, bracketed or not, or a name) reaches only this machine:
// 127.0.0.0/8, ::1, "localhost". A name that is not a literal and not "localhost" is not
// loopback.
bool LoopbackOnly(std::string_view host);

}  // namespace crun
