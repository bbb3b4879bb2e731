// --rdzv-backend crun (alias c10d): crun's rendezvous service at --rdzv-endpoint, joined over
// gRPC (agent/rendezvous/service_rendezvous.h), and hosted in this crun when the endpoint names
// this node (unless is_host says otherwise, or a `crun rendezvous` daemon already serves it).
#pragma once

#include "launcher/backends/backend.h"

namespace crun::launcher {

Backend ServiceBackend();

// What a plan for crun's service decided; null for a plan of another backend.
struct ServicePlan {
  Endpoint endpoint;
  bool try_host = false;  // host the service here (or join the one already on its port)
};
const ServicePlan* ServicePlanOf(const LaunchPlan& plan);

}  // namespace crun::launcher
