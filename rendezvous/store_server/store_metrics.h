// The store's statistics (StoreServerStats) as Prometheus metrics, crun_store_* in
// docs/observability.md: registered once, copied from `stats` at each scrape. `stats` runs
// where the page is rendered: on the store's event loop for `crun store`, through
// BackgroundStoreServer::stats() elsewhere.
#pragma once

#include <functional>

#include "metrics/registry.h"
#include "rendezvous/store_server/store_server.h"

namespace crun {

void AddStoreMetrics(metrics::Registry& registry, std::function<StoreServerStats()> stats);

}  // namespace crun
