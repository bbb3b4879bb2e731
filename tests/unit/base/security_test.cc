// Loading the job token and TLS files, and the helpers the service's checks use: constant-time
// token comparison, peer addresses as gRPC prints them. Files in a
// temporary directory; nothing on the network.
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "base/security.h"

TEST_CASE("security: token comparison, peer addresses", "[security]") {
  using crun::PeerIp;
  using crun::TokenMatches;
  CHECK(TokenMatches("abc", "abc"));
  CHECK_FALSE(TokenMatches("abc", "abd"));
  CHECK_FALSE(TokenMatches("abc", "ab"));
  CHECK_FALSE(TokenMatches("abc", "abcd"));
  CHECK_FALSE(TokenMatches("abc", ""));
  CHECK(PeerIp("ipv4:10.0.0.2:51234") == "10.0.0.2");
  CHECK(PeerIp("ipv6:[::1]:5") == "::1");
  CHECK(PeerIp("ipv6:%5B::1%5D:5") == "::1");
  CHECK(PeerIp("ipv6:[::ffff:10.1.2.3]:77") == "10.1.2.3");
  CHECK(PeerIp("unix:/tmp/x") == "unix:/tmp/x");
}

// The one allow-list builder of a round's servers (the service's round store, etcd's and the
// static backend's, Horovod's rendezvous), as a table.
TEST_CASE("security: a round's allow-list", "[security]") {
  using crun::RoundAllowList;
  using List = std::vector<std::string>;
  struct Row {
    std::vector<List> members;
    bool loopback;
    List want;
  };
  for (const Row& row : std::vector<Row>{
           {{{"10.0.0.1"}, {"10.0.0.2", "fd00::2"}}, false, {"10.0.0.1", "10.0.0.2", "fd00::2"}},
           {{{"10.0.0.1"}, {"10.0.0.2"}}, true, {"10.0.0.1", "10.0.0.2", "127.0.0.1", "::1"}},
           // A member of unknown address: no list (everyone), never a list that leaves it out.
           {{{"10.0.0.1"}, {}}, true, {}},
           {{{}, {"10.0.0.2"}}, false, {}},
           {{}, true, {}},
       }) {
    CHECK(RoundAllowList(row.members, row.loopback) == row.want);
  }
}

TEST_CASE("security: loading the token and TLS files names what is wrong", "[security]") {
  using crun::LoadSecurity;
  using crun::SecurityFlags;
  ::unsetenv("CRUN_TOKEN");
  ::unsetenv("CRUN_TOKEN_FILE");
  char dir[] = "/tmp/crun-security-XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  const std::string token_file = std::string(dir) + "/token";
  SECTION("no token, no TLS") {
    auto s = LoadSecurity({}, "client");
    REQUIRE(s.ok());
    CHECK(s->token.empty());
    CHECK_FALSE(s->tls());
  }
  SECTION("a token file, trailing newline dropped; it wins over CRUN_TOKEN") {
    std::FILE* f = std::fopen(token_file.c_str(), "w");
    std::fputs("t0ken\n", f);
    std::fclose(f);
    ::setenv("CRUN_TOKEN", "other", 1);
    SecurityFlags flags;
    flags.token_file = token_file;
    auto s = LoadSecurity(flags, "client");
    ::unsetenv("CRUN_TOKEN");
    REQUIRE(s.ok());
    CHECK(s->token == "t0ken");
    CHECK_THAT(s->token_source, Catch::Contains(token_file));
  }
  SECTION("CRUN_TOKEN") {
    ::setenv("CRUN_TOKEN", "from-env", 1);
    auto s = LoadSecurity({}, "client");
    ::unsetenv("CRUN_TOKEN");
    REQUIRE(s.ok());
    CHECK(s->token == "from-env");
  }
  SECTION("a missing token file, an empty one, a binary one") {
    SecurityFlags flags;
    flags.token_file = token_file + ".absent";
    auto missing = LoadSecurity(flags, "client");
    REQUIRE_FALSE(missing.ok());
    CHECK_THAT(missing.status().message(),
               Catch::Contains("--token-file " + token_file + ".absent"));
    std::fclose(std::fopen(token_file.c_str(), "w"));
    flags.token_file = token_file;
    auto empty = LoadSecurity(flags, "client");
    REQUIRE_FALSE(empty.ok());
    CHECK_THAT(empty.status().message(), Catch::Contains("empty"));
    std::FILE* f = std::fopen(token_file.c_str(), "w");
    std::fputs(
        "ab\x01"
        "cd",
        f);
    std::fclose(f);
    auto binary = LoadSecurity(flags, "client");
    REQUIRE_FALSE(binary.ok());
    CHECK_THAT(binary.status().message(), Catch::Contains("printable ASCII"));
  }
  SECTION("a certificate without its key, a key that is not PEM, a service CA without a cert") {
    std::FILE* f = std::fopen(token_file.c_str(), "w");
    std::fputs("-----BEGIN CERTIFICATE-----\nxx\n-----END CERTIFICATE-----\n", f);
    std::fclose(f);
    SecurityFlags flags;
    flags.tls_cert = token_file;
    auto lone = LoadSecurity(flags, "client");
    REQUIRE_FALSE(lone.ok());
    CHECK_THAT(lone.status().message(), Catch::Contains("without its key"));
    flags.tls_key = token_file;  // a certificate is no key
    auto bad_key = LoadSecurity(flags, "client");
    REQUIRE_FALSE(bad_key.ok());
    CHECK_THAT(bad_key.status().message(), Catch::Contains("not a PEM private key"));
    SecurityFlags ca_only;
    ca_only.tls_ca = token_file;
    CHECK(LoadSecurity(ca_only, "client").ok());
    auto service = LoadSecurity(ca_only, "service");
    REQUIRE_FALSE(service.ok());
    CHECK_THAT(service.status().message(), Catch::Contains("--tls-cert"));
  }
  std::filesystem::remove_all(dir);
}
