// This host's addresses, as the launcher uses them to decide whether an endpoint is its own
// and where to listen. Loopback and literals only: no name service is assumed beyond
// "localhost" and this host's own name.
#include <catch2/catch.hpp>

#include <netdb.h>
#include <unistd.h>

#include <algorithm>
#include <string>

#include "base/host_addresses.h"
#include "tests/unit/skip.h"

TEST_CASE("host addresses: loopback is local, literals bind as themselves", "[host]") {
  const auto local = crun::LocalAddresses();
  CHECK(std::find(local.begin(), local.end(), "127.0.0.1") != local.end());
  CHECK(crun::ResolveNumeric("127.0.0.1") == std::vector<std::string>{"127.0.0.1"});
  CHECK(crun::NamesThisHost("localhost"));
  CHECK(crun::NamesThisHost("127.0.0.1"));
  CHECK(crun::NamesThisHost("127.0.1.1"));
  char name[256] = {};
  REQUIRE(::gethostname(name, sizeof name - 1) == 0);
  CHECK(crun::NamesThisHost(name));
  // TEST-NET-3: documentation addresses, never a local interface.
  CHECK_FALSE(crun::NamesThisHost("203.0.113.7"));
  CHECK(crun::BindAddressFor("localhost") == "127.0.0.1");
  CHECK(crun::BindAddressFor("10.1.2.3") == "10.1.2.3");
  CHECK(crun::BindAddressFor("::1") == "::1");
  CHECK(crun::LocalAddressToward("127.0.0.1", 9) == "127.0.0.1");
}

TEST_CASE("host addresses: a name that does not exist is refused naming it", "[host][may-skip]") {
  CHECK(crun::CheckResolvable("127.0.0.1").ok());
  CHECK(crun::CheckResolvable("localhost").ok());
  // With no name server answering (the GPU machines have none), the lookup fails with
  // EAI_AGAIN, which crun leaves to the connect that follows: it may be transient.
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo("no-such-host.invalid", nullptr, nullptr, &res);
  if (res != nullptr) ::freeaddrinfo(res);
  if (rc == EAI_AGAIN)
    crun::testing::Skip("no name server answers here, so no name is known not to exist");
  const crun::Status s = crun::CheckResolvable("no-such-host.invalid");
  REQUIRE_FALSE(s.ok());
  CHECK(s.message().find("cannot resolve host 'no-such-host.invalid'") == 0);
}
