#include "agent/rendezvous/stacks_proto.h"

namespace crun::agent {
namespace {

void RankToProto(const RankStacks& r, bool main_only, v1::RankStacks* out) {
  out->set_host(r.host);
  out->set_rank(r.rank);
  out->set_local_rank(r.local_rank);
  out->set_pid(r.pid);
  out->set_tool(r.tool);
  out->set_error(r.error);
  for (const auto& t : r.threads) {
    if (main_only && !t.main) continue;
    auto* pt = out->add_threads();
    pt->set_title(t.title);
    pt->set_main(t.main);
    for (const auto& f : t.frames) {
      auto* pf = pt->add_frames();
      pf->set_function(f.function);
      pf->set_file(f.file);
      pf->set_line(f.line);
    }
  }
}

RankStacks RankFromProto(const v1::RankStacks& p) {
  RankStacks r;
  r.host = p.host();
  r.rank = p.rank();
  r.local_rank = p.local_rank();
  r.pid = p.pid();
  r.tool = p.tool();
  r.error = p.error();
  for (const auto& pt : p.threads()) {
    ThreadStack t;
    t.title = pt.title();
    t.main = pt.main();
    for (const auto& pf : pt.frames()) t.frames.push_back({pf.function(), pf.file(), pf.line()});
    r.threads.push_back(std::move(t));
  }
  return r;
}

}  // namespace

v1::NodeStacks NodeStacksToProto(const std::string& node_id, const std::string& host,
                                 const std::vector<RankStacks>& ranks, const std::string& error) {
  v1::NodeStacks out;
  out.set_node_id(node_id);
  out.set_host(host);
  out.set_error(error);
  for (const auto& r : ranks) RankToProto(r, false, out.add_ranks());
  if (out.ByteSizeLong() > kMaxNodeStacksBytes) {
    out.clear_ranks();
    for (const auto& r : ranks) RankToProto(r, true, out.add_ranks());
    out.set_error("only each rank's main thread: all threads take more than " +
                  std::to_string(kMaxNodeStacksBytes >> 10) + " KiB (they are in " + host +
                  "'s own report)");
  }
  return out;
}

RemoteStacks RemoteStacksFromProto(const v1::StacksResult& result) {
  RemoteStacks out;
  for (const auto& node : result.nodes()) {
    for (const auto& r : node.ranks()) out.ranks.push_back(RankFromProto(r));
    if (!node.error().empty()) {
      out.missing.push_back(node.node_id() + " (" + node.host() + "): " + node.error());
    }
  }
  out.missing.insert(out.missing.end(), result.missing().begin(), result.missing().end());
  return out;
}

}  // namespace crun::agent
