// This machine's addresses and what names resolve to here: whether an endpoint names this
// host, where to listen for peers that reach it by a name, and which local address faces a
// peer. getifaddrs/getaddrinfo and nothing else; every call may block on the resolver.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace crun {

// Whether `host` is an IPv4 or IPv6 address written as numbers (no brackets, no zone).
bool IsIpLiteral(const std::string& host);

// The numeric addresses of this machine's interfaces (IPv6 without a "%zone").
std::vector<std::string> LocalAddresses();

// The numeric addresses `host` resolves to here (itself when it is a literal); empty when it
// does not resolve.
std::vector<std::string> ResolveNumeric(const std::string& host);

// Whether `host` names this machine: localhost, a loopback or local interface address, this
// host's name, or a name that resolves to one of those.
bool NamesThisHost(const std::string& host);

// kInvalidArgument when the resolver says `host` does not exist ("cannot resolve host 'x':
// Name or service not known"). A resolver that cannot answer now (EAI_AGAIN) may answer
// later: that is Ok, left to the caller's retries.
Status CheckResolvable(const std::string& host);

// Where to listen for a service or store that other hosts reach as `host`: the address itself
// when it is a literal, loopback for "localhost", else the interface address the name
// resolves to here. A name that resolves to no interface address of this machine but a
// loopback one (Debian maps a machine's own name to 127.0.1.1), or to none at all, listens on
// every interface ("::"): the others reach it under an address this host cannot see.
std::string BindAddressFor(const std::string& host);

// The local address this host would use to reach host:port, numerically (a connected UDP
// socket sends nothing; the kernel only picks the route), or "" when the name does not resolve
// or no route exists. Gives agents and workers an address other hosts can reach them at.
std::string LocalAddressToward(const std::string& host, std::uint16_t port);

}  // namespace crun
