// The goodput ledgers as JSON: --goodput-file, the etcd key a node writes its ledger to, the
// daemon's /goodput.json, and what `crun timeline FILE` reads back. Times are wall
// milliseconds, exact; seconds are for people and are not read back.
//
//   {"summary": "...", "job": {<the job's ledger>}, "nodes": [{<a node's ledger>}, ...]}
//
// A file is read back from its nodes alone: the job's ledger is combined again (job_ledger.h).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "rendezvous/goodput/job_ledger.h"

namespace crun::goodput {

nlohmann::ordered_json ToJson(const NodeLedger& node);
StatusOr<NodeLedger> NodeFromJson(const nlohmann::json& j);
// The same from its text (a ledger as a node sent or put it): its node is `node_id`, whatever
// the text says, where that is given.
StatusOr<NodeLedger> NodeFromText(const std::string& text, const std::string& node_id = "");
// The job's element of a file ("job" below), its nodes left out.
nlohmann::ordered_json JobJson(const JobLedger& job);
// The job's element of a file ("job" below), read back without its nodes: what a node is
// handed where the job's ledger is combined elsewhere (etcd's decider, rendezvous/etcd/goodput.h).
StatusOr<JobLedger> JobFromJson(const nlohmann::json& j);

// The whole file: the job (when `job` is combined from more than one node, or known to be the
// job's) and every node.
nlohmann::ordered_json FileJson(const JobLedger& job);
// The nodes of a file; `what` names it in an error ("goodput.json").
StatusOr<std::vector<NodeLedger>> NodesFromFile(const std::string& text, const std::string& what);

}  // namespace crun::goodput
