// --rdzv-backend etcd-v3 (alias etcd): the rendezvous kept in etcd's v3 API at --rdzv-endpoint
// h1:2379,h2:2379,... (agent/rendezvous/etcd_rendezvous.h); no node hosts anything but the store
// of the rounds in which it is group rank 0. Its --rdzv-conf keys: etcd_prefix, etcd_user,
// etcd_password_file, etcd_retention. etcd-v2 is a name kept to be refused.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "launcher/backends/backend.h"
#include "rendezvous/etcd/job.h"

namespace crun::launcher {

Backend EtcdBackend();
Backend EtcdV2Refused();

// What a plan for etcd decided; null for a plan of another backend.
struct EtcdPlan {
  std::vector<Endpoint> endpoints;  // etcd's members
  std::string prefix;               // etcd_prefix; empty: the default root
  std::string user, password;       // etcd_user, and the first line of etcd_password_file
  // etcd_retention: how long a finished job's keys stay (rendezvous/etcd/job.h, Retention).
  std::chrono::seconds retention = etcd::kDefaultRetention;
};
const EtcdPlan* EtcdPlanOf(const LaunchPlan& plan);

}  // namespace crun::launcher
