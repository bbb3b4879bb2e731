#include "base/host_addresses.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>

#include "base/endpoint.h"

namespace crun {

bool IsIpLiteral(const std::string& host) {
  in6_addr buf{};
  return ::inet_pton(AF_INET, host.c_str(), &buf) == 1 ||
         ::inet_pton(AF_INET6, host.c_str(), &buf) == 1;
}

namespace {

bool Contains(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

}  // namespace

std::vector<std::string> LocalAddresses() {
  std::vector<std::string> local;
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) != 0) return local;
  for (auto* i = ifs; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr) continue;
    const int family = i->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    char buf[NI_MAXHOST];
    const socklen_t len = family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    if (::getnameinfo(i->ifa_addr, len, buf, sizeof buf, nullptr, 0, NI_NUMERICHOST) == 0) {
      std::string a = buf;
      if (auto pct = a.find('%'); pct != std::string::npos) a.resize(pct);
      local.push_back(a);
    }
  }
  ::freeifaddrs(ifs);
  return local;
}

std::vector<std::string> ResolveNumeric(const std::string& host) {
  std::vector<std::string> out;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0) return out;
  for (auto* r = res; r != nullptr; r = r->ai_next) {
    char buf[NI_MAXHOST];
    if (::getnameinfo(r->ai_addr, r->ai_addrlen, buf, sizeof buf, nullptr, 0, NI_NUMERICHOST) ==
        0) {
      out.push_back(buf);
    }
  }
  ::freeaddrinfo(res);
  return out;
}

bool NamesThisHost(const std::string& host) {
  if (host == "localhost") return true;
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) == 0 && host == name) return true;
  const auto local = LocalAddresses();
  for (const auto& a : ResolveNumeric(host)) {
    if (LoopbackOnly(a) || Contains(local, a)) return true;
  }
  return false;
}

Status CheckResolvable(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (res != nullptr) ::freeaddrinfo(res);
  if (rc == EAI_NONAME || rc == EAI_FAIL || rc == EAI_NODATA) {
    return InvalidArgument("cannot resolve host '" + host + "': " + ::gai_strerror(rc));
  }
  return Status::Ok();
}

std::string BindAddressFor(const std::string& host) {
  if (host == "localhost") return "127.0.0.1";
  if (IsIpLiteral(host)) return host;
  const auto local = LocalAddresses();
  for (const auto& a : ResolveNumeric(host)) {
    if (!LoopbackOnly(a) && Contains(local, a)) return a;
  }
  return "::";
}

std::string LocalAddressToward(const std::string& host, std::uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0) return "";
  std::string found;
  for (auto* r = res; r != nullptr && found.empty(); r = r->ai_next) {
    const int fd = ::socket(r->ai_family, r->ai_socktype | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof local;
    char buf[NI_MAXHOST];
    if (::connect(fd, r->ai_addr, r->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 &&
        ::getnameinfo(reinterpret_cast<sockaddr*>(&local), len, buf, sizeof buf, nullptr, 0,
                      NI_NUMERICHOST) == 0) {
      found = buf;
    }
    ::close(fd);
  }
  ::freeaddrinfo(res);
  return found;
}

}  // namespace crun
