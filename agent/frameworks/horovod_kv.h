// Horovod's HTTP rendezvous for its Gloo controller in static mode (docs/frameworks.md): the
// key-value store that Horovod's C++ client (HTTPStore) reaches at
// HOROVOD_GLOO_RENDEZVOUS_ADDR:PORT, as `horovodrun` serves it. Group rank 0's crun serves a
// fresh one for each round (agent/local_agent.cc), on the port it reserved with its join. This
// is the store's logic alone, requests in and answers out (no sockets); HttpServer::Serve
// carries it.
//
//   PUT /<scope>/<key>     stores the body (200)
//   GET /<scope>/<key>     200 with the value, 404 while there is none (the client polls)
//   DELETE /<scope>/<key>  a rank's end: in the round's scopes ("global", "local_<host>",
//                          "cross_<local rank>") the key is counted, and when every rank of the
//                          scope has ended the scope is emptied (Horovod's server also forgets
//                          every scope's count then); in other scopes the key is deleted
// Anything else is refused naming what: a path not /<scope>/<key> 400, another method 405, a
// key or value beyond the limits 413 (a value beyond body_limit never reaches here: the HTTP
// server answers 413).
#pragma once

#include <cstddef>
#include <map>
#include <set>
#include <string>

#include "agent/rendezvous/assignment.h"
#include "http/http_server.h"

namespace crun::agent {

class HorovodKv {
 public:
  struct Limits {
    std::size_t max_keys = 65'536;     // across every scope
    std::size_t max_bytes = 64 << 20;  // keys and values together
    std::size_t max_key_bytes = 1024;  // a scope or key name
  };
  // The round's scopes and how many ranks each has (ScopeSizes).
  explicit HorovodKv(std::map<std::string, int> scope_sizes, Limits limits);

  // "global": every worker; "local_<HOROVOD_HOSTNAME>": each node's; "cross_<L>": the nodes
  // that have a local rank L.
  static std::map<std::string, int> ScopeSizes(const GroupAssignment& group);

  http::HttpResponse Handle(const http::HttpRequest& request);

  std::size_t keys() const { return keys_; }

 private:
  using Scope = std::map<std::string, std::string>;
  void Erase(Scope& scope, Scope::iterator it);

  std::map<std::string, int> sizes_;
  Limits limits_;
  std::map<std::string, Scope> scopes_;
  std::map<std::string, std::set<std::string>> ended_;  // the round's scopes: ranks that ended
  std::size_t keys_ = 0;
  std::size_t bytes_ = 0;
};

}  // namespace crun::agent
