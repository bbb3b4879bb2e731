// Horovod's HTTP rendezvous (agent/frameworks/horovod_kv.h) as tables: requests in, answers out.
#include <catch2/catch.hpp>

#include "agent/frameworks/horovod_kv.h"

using crun::agent::GroupAssignment;
using crun::agent::HorovodKv;
using crun::agent::RoundMember;
using crun::http::HttpRequest;

namespace {

struct Kv {
  explicit Kv(HorovodKv::Limits limits = {})
      : kv({{"global", 3}, {"local_a", 2}, {"local_b", 1}, {"cross_0", 2}, {"cross_1", 1}},
           limits) {}
  unsigned Status(const std::string& method, const std::string& target,
                  const std::string& body = "") {
    last = kv.Handle(HttpRequest{method, target, body});
    return last.status;
  }
  HorovodKv kv;
  crun::http::HttpResponse last;
};

}  // namespace

TEST_CASE("horovod rendezvous: PUT, GET, and 404 until a key is there", "[horovod]") {
  Kv k;
  CHECK(k.Status("GET", "/global/rank_0") == 404);  // the client polls until it is there
  CHECK(k.Status("PUT", "/global/rank_0", std::string("addr\0bytes", 10)) == 200);
  CHECK(k.Status("GET", "/global/rank_0") == 200);
  CHECK(k.last.body == std::string("addr\0bytes", 10));
  CHECK(k.last.content_type == "application/octet-stream");
  CHECK(k.Status("GET", "/local_a/rank_0") == 404);        // scopes are apart
  CHECK(k.Status("PUT", "/global/rank_0", "new") == 200);  // replaced
  CHECK(k.Status("GET", "/global/rank_0") == 200);
  CHECK(k.last.body == "new");
  CHECK(k.kv.keys() == 1);
}

TEST_CASE("horovod rendezvous: a round's scope empties when all its ranks have ended",
          "[horovod]") {
  Kv k;
  REQUIRE(k.Status("PUT", "/local_a/0", "x") == 200);
  REQUIRE(k.Status("PUT", "/local_a/1", "y") == 200);
  REQUIRE(k.Status("PUT", "/global/0", "z") == 200);
  CHECK(k.Status("DELETE", "/local_a/0") == 200);
  CHECK(k.Status("DELETE", "/local_a/0") == 200);  // the same rank twice counts once
  CHECK(k.Status("GET", "/local_a/0") == 200);     // 1 of 2 ended: kept
  CHECK(k.Status("DELETE", "/local_a/1") == 200);
  CHECK(k.Status("GET", "/local_a/0") == 404);
  CHECK(k.Status("GET", "/local_a/1") == 404);
  CHECK(k.Status("GET", "/global/0") == 200);  // other scopes untouched
  CHECK(k.kv.keys() == 1);
  // A scope of the client's own (a process set's): DELETE removes the key itself.
  REQUIRE(k.Status("PUT", "/global_ps1/k", "v") == 200);
  CHECK(k.Status("DELETE", "/global_ps1/k") == 200);
  CHECK(k.Status("GET", "/global_ps1/k") == 404);
  CHECK(k.Status("DELETE", "/never/put") == 200);
}

TEST_CASE("horovod rendezvous: malformed, unknown and oversized requests are named", "[horovod]") {
  Kv k({.max_keys = 2, .max_bytes = 64, .max_key_bytes = 8});
  for (const char* bad : {"/", "/global", "/global/", "//key", "/a/b/c", "global/key", ""}) {
    INFO(bad);
    CHECK(k.Status("GET", bad) == 400);
    CHECK(k.last.body.find("is not /<scope>/<key>") != std::string::npos);
  }
  CHECK(k.Status("POST", "/global/k", "v") == 405);
  CHECK(k.last.headers ==
        std::vector<std::pair<std::string, std::string>>{{"Allow", "GET, PUT, DELETE"}});
  CHECK(k.Status("PUT", "/global/a-very-long-key", "v") == 413);
  CHECK(k.last.body.find("a scope or key over 8 bytes") != std::string::npos);
  CHECK(k.Status("PUT", "/global/big", std::string(100, 'x')) == 413);
  CHECK(k.last.body.find("full (0 keys, 0 bytes; at most 2 keys, 64 bytes)") != std::string::npos);
  REQUIRE(k.Status("PUT", "/global/1", "a") == 200);
  REQUIRE(k.Status("PUT", "/global/2", "b") == 200);
  CHECK(k.Status("PUT", "/global/3", "c") == 413);   // a third key
  CHECK(k.Status("PUT", "/global/2", "bb") == 200);  // replacing one is not a new key
  CHECK(k.kv.keys() == 2);
}

TEST_CASE("horovod rendezvous: the round's scopes and their sizes", "[horovod]") {
  GroupAssignment g;
  g.world_size = 5;
  g.members = {RoundMember{"a", "10.0.0.1", 2, {}}, RoundMember{"b", "10.0.0.2", 3, {}}};
  using Sizes = std::map<std::string, int>;
  CHECK(HorovodKv::ScopeSizes(g) == Sizes{{"global", 5},
                                          {"local_a", 2},
                                          {"local_b", 3},
                                          {"cross_0", 2},
                                          {"cross_1", 2},
                                          {"cross_2", 1}});
  g.members[1].host = "a";  // two agents on one host
  CHECK(HorovodKv::ScopeSizes(g).count("local_a-node0") == 1);
  CHECK(HorovodKv::ScopeSizes(g).count("local_a-node1") == 1);
}
