// Endpoints as typed: host, host:port, [v6]:port; what is refused and how it is said; the one
// formatter and the one loopback test.
#include <catch2/catch.hpp>

#include "base/endpoint.h"

using crun::ParseEndpoint;

TEST_CASE("endpoints parse as host and port", "[endpoint]") {
  struct Row {
    const char* text;
    const char* host;
    int port;
  };
  for (const Row& row : std::vector<Row>{{"node7", "node7", 29400},
                                         {"node7:1234", "node7", 1234},
                                         {"10.0.0.5:80", "10.0.0.5", 80},
                                         {"[::1]:29500", "::1", 29500},
                                         {"[fe80::1]", "fe80::1", 29400},
                                         {"gpu-a1_b.example.com", "gpu-a1_b.example.com", 29400}}) {
    INFO(row.text);
    const auto e = ParseEndpoint(row.text, 29400);
    REQUIRE(e.ok());
    CHECK(e->host == row.host);
    CHECK(e->port == row.port);
  }
  CHECK(ParseEndpoint("[::1]:29500", 1)->ToString() == "[::1]:29500");
  CHECK(ParseEndpoint("h:7", 1)->ToString() == "h:7");
}

TEST_CASE("bad endpoints are refused naming the fault", "[endpoint]") {
  struct Row {
    const char* text;
    const char* message;
  };
  for (const Row& row : std::vector<Row>{
           {"", "the endpoint is empty: give host[:port]"},
           {"::1:29400", "endpoint '::1:29400': an IPv6 address needs brackets"},
           {"::1", "an IPv6 address needs brackets"},
           {"[zzz]:29400", "endpoint '[zzz]:29400': 'zzz' is not an IPv6 address"},
           {"[::1", "missing ']'"},
           {"[::1]x", "expected ':' after ']'"},
           {"[::1]:", "no port after ':'"},
           {"h:", "no port after ':'"},
           {":29400", "names no host"},
           {"h:99999", "port '99999' is not in 1..65535"},
           {"h:-1", "port '-1' is not in 1..65535"},
           {"h:12a", "port '12a' is not in 1..65535"},
           {"bad host:1", "'bad host' is not a host name or address"},
       }) {
    INFO(row.text);
    const auto e = ParseEndpoint(row.text, 29400);
    REQUIRE_FALSE(e.ok());
    CHECK(e.status().message().find(row.message) != std::string::npos);
  }
}

TEST_CASE("endpoints format with IPv6 in brackets, once", "[endpoint]") {
  using crun::FormatEndpoint;
  CHECK(FormatEndpoint("node-a", 29400) == "node-a:29400");
  CHECK(FormatEndpoint("10.0.0.5", 1) == "10.0.0.5:1");
  CHECK(FormatEndpoint("::1", 29400) == "[::1]:29400");
  CHECK(FormatEndpoint("[::1]", 29400) == "[::1]:29400");
  CHECK(FormatEndpoint("fe80::1", 65535) == "[fe80::1]:65535");
  // What it formats parses back to the same host and port.
  for (const char* host : {"node-a", "10.0.0.5", "::1", "2001:db8::7"}) {
    INFO(host);
    const auto back = ParseEndpoint(FormatEndpoint(host, 4242), 1);
    REQUIRE(back.ok());
    CHECK(back->host == host);
    CHECK(back->port == 4242);
    CHECK(back->ToString() == FormatEndpoint(host, 4242));
  }
}

TEST_CASE("loopback is 127/8, ::1 and localhost, nothing else", "[endpoint]") {
  using crun::LoopbackOnly;
  for (const char* yes : {"127.0.0.1", "127.3.0.1", "127.0.1.1", "::1", "[::1]", "localhost"}) {
    INFO(yes);
    CHECK(LoopbackOnly(yes));
  }
  for (const char* no :
       {"0.0.0.0", "::", "10.0.0.1", "node-a", "128.0.0.1", "::ffff:10.0.0.1", "", "[127.0.0.1"}) {
    INFO(no);
    CHECK_FALSE(LoopbackOnly(no));
  }
}
