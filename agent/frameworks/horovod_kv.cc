#include "agent/frameworks/horovod_kv.h"

#include <utility>

#include "agent/frameworks/contracts.h"

namespace crun::agent {
namespace {

http::HttpResponse Answer(unsigned status, std::string body) {
  http::HttpResponse r;
  r.status = status;
  r.body = std::move(body);
  return r;
}

}  // namespace

HorovodKv::HorovodKv(std::map<std::string, int> scope_sizes, Limits limits)
    : sizes_(std::move(scope_sizes)), limits_(limits) {}

std::map<std::string, int> HorovodKv::ScopeSizes(const GroupAssignment& g) {
  std::map<std::string, int> sizes{{"global", g.world_size}};
  for (std::size_t i = 0; i < g.members.size(); ++i) {
    const RoundMember& m = g.members[i];
    sizes["local_" + HorovodHostName(g, i)] = m.nproc;
    for (int lr = 0; lr < m.nproc; ++lr) ++sizes["cross_" + std::to_string(lr)];
  }
  return sizes;
}

void HorovodKv::Erase(Scope& scope, Scope::iterator it) {
  bytes_ -= it->first.size() + it->second.size();
  --keys_;
  scope.erase(it);
}

http::HttpResponse HorovodKv::Handle(const http::HttpRequest& req) {
  // "/<scope>/<key>": exactly two non-empty parts.
  const std::string& path = req.target;
  const auto second = path.find('/', 1);
  if (path.size() < 4 || path[0] != '/' || second == std::string::npos || second == 1 ||
      second + 1 == path.size() || path.find('/', second + 1) != std::string::npos) {
    return Answer(400, "Horovod rendezvous: '" + path.substr(0, 200) + "' is not /<scope>/<key>\n");
  }
  const std::string scope = path.substr(1, second - 1);
  const std::string key = path.substr(second + 1);
  if (scope.size() > limits_.max_key_bytes || key.size() > limits_.max_key_bytes) {
    return Answer(413, "Horovod rendezvous: a scope or key over " +
                           std::to_string(limits_.max_key_bytes) + " bytes\n");
  }
  if (req.method == "GET") {
    const auto s = scopes_.find(scope);
    const auto v = s == scopes_.end() ? Scope::iterator() : s->second.find(key);
    if (s == scopes_.end() || v == s->second.end()) return Answer(404, "");
    http::HttpResponse r = Answer(200, v->second);
    r.content_type = "application/octet-stream";
    return r;
  }
  if (req.method == "PUT") {
    Scope& s = scopes_[scope];
    const auto old = s.find(key);
    const std::size_t freed = old == s.end() ? 0 : key.size() + old->second.size();
    const std::size_t added = key.size() + req.body.size();
    if ((old == s.end() && keys_ >= limits_.max_keys) ||
        bytes_ - freed + added > limits_.max_bytes) {
      if (s.empty()) scopes_.erase(scope);
      return Answer(413, "Horovod rendezvous: full (" + std::to_string(keys_) + " keys, " +
                             std::to_string(bytes_) + " bytes; at most " +
                             std::to_string(limits_.max_keys) + " keys, " +
                             std::to_string(limits_.max_bytes) + " bytes)\n");
    }
    if (old != s.end()) Erase(s, old);
    s.emplace(key, req.body);
    bytes_ += added;
    ++keys_;
    return Answer(200, "");
  }
  if (req.method == "DELETE") {
    if (const auto size = sizes_.find(scope); size != sizes_.end()) {
      auto& ended = ended_[scope];
      ended.insert(key);
      if (static_cast<int>(ended.size()) >= size->second) {
        if (auto s = scopes_.find(scope); s != scopes_.end()) {
          while (!s->second.empty()) Erase(s->second, s->second.begin());
          scopes_.erase(s);
        }
        ended_.clear();  // as Horovod's server does
      }
    } else if (auto s = scopes_.find(scope); s != scopes_.end()) {
      if (auto v = s->second.find(key); v != s->second.end()) Erase(s->second, v);
      if (s->second.empty()) scopes_.erase(s);
    }
    return Answer(200, "");
  }
  http::HttpResponse r = Answer(405, "Horovod rendezvous: method " + req.method.substr(0, 20) +
                                         " not allowed: GET, PUT or DELETE\n");
  r.headers = {{"Allow", "GET, PUT, DELETE"}};
  return r;
}

}  // namespace crun::agent
