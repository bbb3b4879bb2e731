// Slow ranks judged job-wide on etcd (docs/health.md, "Slow ranks"), as the service judges them:
// every agent puts its ranks' window figures on its figures/ key, the decider folds each put into
// one detector for the running round and writes the verdicts to a/stragglers, which every agent
// watches; the node that runs a rank named says so. Pure: the keys' values and the decisions on
// them, no etcd call.
//
//   <prefix>figures/<node id>  {"round": R, "figures": [[rank, window, microseconds], ...]}:
//                              the figures since the node's last put, bound to its lease
//   <prefix>a/stragglers       {"round": R, "named": [V, ...], "cleared": [V, ...]}, V =
//                              {"rank", "window", "ratio", "host"}: the ranks named slow now, and
//                              those named in the round and cleared since
//
// The decider folds each put as its watch delivers it (not the mirror's latest value, which a
// second put could overwrite before a pass). A new decider starts its detector over: the
// verdicts written stay until a window of its own says otherwise.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "base/status.h"
#include "rendezvous/etcd/job.h"
#include "rendezvous/rules/stragglers.h"
#include "rendezvous/service/messages.h"

namespace crun::etcd {

std::string FiguresKey(const Keys& keys, const std::string& node_id);
std::string StragglersKey(const Keys& keys);

// One put of a node's figures.
struct NodeFigures {
  int round = 0;
  std::vector<rdzv::ComputeSample> figures;
};
std::string EncodeFigures(const NodeFigures& f);
StatusOr<NodeFigures> DecodeFigures(const std::string& node_id, const std::string& text);

struct SlowVerdicts {
  int round = -1;
  std::vector<rdzv::msg::StragglerVerdict> named;    // named now
  std::vector<rdzv::msg::StragglerVerdict> cleared;  // named in this round, cleared since
};
std::string EncodeVerdicts(const SlowVerdicts& v);
StatusOr<SlowVerdicts> DecodeVerdicts(const std::string& text);

// The decider's detector.
class FigureJudge {
 public:
  explicit FigureJudge(rdzv::StragglerSettings settings) : settings_(settings) {}

  // Follows `doc`'s running round (who runs which ranks, on which host); a new round starts
  // over, with no verdict. Outside a running round nothing is judged.
  void Follow(const JobDoc& doc);
  // Node `node_id`'s put: the figures of its own ranks in the round followed are judged, the
  // rest dropped. True when the verdicts changed (write them).
  bool Fold(const std::string& node_id, const NodeFigures& put);
  const SlowVerdicts& verdicts() const { return verdicts_; }

 private:
  rdzv::StragglerSettings settings_;
  bool running_ = false;
  rdzv::StragglerState state_;
  rdzv::RankOwners owners_;
  std::map<std::string, std::string> hosts_;  // node id -> host
  SlowVerdicts verdicts_;
};

// What an agent in round `round` says of `v`: each rank named that it has not said (`said`,
// the ranks it has said are slow, is updated), and each it said that was cleared since.
// Verdicts of another round say nothing.
std::vector<rdzv::msg::StragglerVerdict> NewVerdicts(const SlowVerdicts& v, int round,
                                                     std::set<int>& said);

// The ranks named slow now on each node of `v`'s round `round`, by node id (crun status).
std::map<std::string, std::vector<rdzv::StragglerChange>> NamedByNode(const SlowVerdicts& v,
                                                                      const JobDoc& doc);

}  // namespace crun::etcd
