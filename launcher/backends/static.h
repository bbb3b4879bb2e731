// --rdzv-backend static, and no rendezvous service at all: one node alone (--standalone, or one
// node with nothing else named), torchrun's static backend (fixed --node-rank; node 0 hosts the
// store at --master-addr:--master-port for every round), and one crun per Slurm task (task 0
// hosts the step's store). agent/rendezvous/static_rendezvous.h runs it.
#pragma once

#include "launcher/backends/backend.h"

namespace crun::launcher {

Backend StaticBackend();

// Whether a plan's static rendezvous spans several nodes (torchrun's static backend) rather
// than one; false for any other backend.
bool PlansStaticNodes(const LaunchPlan& plan);

}  // namespace crun::launcher
