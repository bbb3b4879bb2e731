#include "base/endpoint.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cctype>

#include "base/numbers.h"

namespace crun {
namespace {

bool IsIpv6(const std::string& text) {
  in6_addr a;
  return ::inet_pton(AF_INET6, text.c_str(), &a) == 1;
}

// Letters, digits, '.', '-' and '_' (names as resolvers and /etc/hosts have them).
bool IsHostName(std::string_view host) {
  return std::all_of(host.begin(), host.end(), [](unsigned char c) {
    return std::isalnum(c) != 0 || c == '.' || c == '-' || c == '_';
  });
}

}  // namespace

std::string Endpoint::ToString() const { return FormatEndpoint(host, port); }

std::string FormatEndpoint(std::string_view host, std::uint16_t port) {
  std::string out;
  if (host.find(':') != std::string_view::npos && host.front() != '[') {
    out.append("[").append(host).append("]");
  } else {
    out.append(host);
  }
  return out + ":" + std::to_string(port);
}

bool LoopbackOnly(std::string_view host) {
  if (host == "localhost") return true;
  std::string h(host);
  if (h.size() > 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  in_addr v4{};
  if (::inet_pton(AF_INET, h.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  return ::inet_pton(AF_INET6, h.c_str(), &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6);
}

StatusOr<Endpoint> ParseEndpoint(std::string_view text, std::uint16_t default_port) {
  const std::string quoted = "endpoint '" + std::string(text) + "'";
  if (text.empty()) return InvalidArgument("the endpoint is empty: give host[:port]");
  std::string host(text), port;
  if (text.front() == '[') {
    const auto close = text.find(']');
    if (close == std::string_view::npos) return InvalidArgument(quoted + ": missing ']'");
    host = std::string(text.substr(1, close - 1));
    if (!IsIpv6(host)) {
      return InvalidArgument(quoted + ": '" + host +
                             "' is not an IPv6 address (brackets are "
                             "for IPv6 only)");
    }
    if (close + 1 < text.size()) {
      if (text[close + 1] != ':') return InvalidArgument(quoted + ": expected ':' after ']'");
      port = std::string(text.substr(close + 2));
      if (port.empty()) return InvalidArgument(quoted + ": no port after ':'");
    }
  } else {
    const auto colons = std::count(text.begin(), text.end(), ':');
    if (colons > 1) {
      return InvalidArgument(quoted +
                             ": an IPv6 address needs brackets, [address]:port (e.g. "
                             "[::1]:29400)");
    }
    if (colons == 1) {
      const auto colon = text.find(':');
      host = std::string(text.substr(0, colon));
      port = std::string(text.substr(colon + 1));
      if (port.empty()) return InvalidArgument(quoted + ": no port after ':'");
    }
    if (host.empty()) return InvalidArgument(quoted + " names no host");
    if (!IsHostName(host)) {
      return InvalidArgument(quoted + ": '" + host + "' is not a host name or address");
    }
  }
  Endpoint e{host, default_port};
  if (!port.empty()) {
    const auto p = ParseInteger(port, 1, 65535);
    if (!p) return InvalidArgument(quoted + ": port '" + port + "' is not in 1..65535");
    e.port = static_cast<std::uint16_t>(*p);
  }
  return e;
}

}  // namespace crun
