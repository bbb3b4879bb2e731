#include "rendezvous/store_server/store_metrics.h"

#include <algorithm>
#include <cctype>
#include <string>

namespace crun {

void AddStoreMetrics(metrics::Registry& registry, std::function<StoreServerStats()> stats) {
  auto& open = registry.AddGauge("crun_store_connections", "Connections open to the store");
  auto& accepted =
      registry.AddCounter("crun_store_connections_accepted_total", "Connections accepted");
  auto& refused = registry.AddCounter(
      "crun_store_connections_refused_total",
      "Connections refused, by reason: limit (max connections or descriptors), per_peer "
      "(max connections of one address), stranger (an address not allowed)",
      {"reason"});
  auto& errors = registry.AddCounter("crun_store_protocol_errors_total",
                                     "Connections closed for a malformed or oversize request");
  auto& requests =
      registry.AddCounter("crun_store_requests_total",
                          "Requests handled, by operation (c10d's command names)", {"op"});
  auto& waits =
      registry.AddGauge("crun_store_waits_pending", "WAITs and BARRIERs not answered yet");
  auto& bytes = registry.AddGauge("crun_store_stored_bytes", "Keys plus values held");
  auto& pauses =
      registry
          .AddCounter("crun_store_read_pauses_total",
                      "Times a client's unread replies made the store stop reading its requests");
  // Every operation's series exists from the start (at 0), so that rate() sees the first.
  std::vector<metrics::Counter*> by_op;
  for (std::size_t i = 0; i < wire::kCommandCount; ++i) {
    std::string op(wire::CommandName(static_cast<wire::Command>(i)));
    std::transform(op.begin(), op.end(), op.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    by_op.push_back(&requests.With({op}));
  }
  registry.OnScrape([=, &open, &accepted, &refused, &errors, &waits, &bytes, &pauses] {
    const StoreServerStats s = stats();
    open.With().Set(static_cast<double>(s.open_connections));
    accepted.With().Mirror(static_cast<double>(s.accepted));
    refused.With({"limit"}).Mirror(static_cast<double>(s.refused));
    refused.With({"per_peer"}).Mirror(static_cast<double>(s.refused_per_peer));
    refused.With({"stranger"}).Mirror(static_cast<double>(s.refused_strangers));
    errors.With().Mirror(static_cast<double>(s.protocol_errors));
    for (std::size_t i = 0; i < wire::kCommandCount; ++i) {
      by_op[i]->Mirror(static_cast<double>(s.requests_by_command[i]));
    }
    waits.With().Set(static_cast<double>(s.pending_waits));
    bytes.With().Set(static_cast<double>(s.stored_bytes));
    pauses.With().Mirror(static_cast<double>(s.read_pauses));
  });
}

}  // namespace crun
