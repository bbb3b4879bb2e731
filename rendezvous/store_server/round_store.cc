#include "rendezvous/store_server/round_store.h"

#include <algorithm>

#include "base/security.h"

namespace crun {

StoreServerOptions RoundStoreOptions(const RoundStoreSpec& spec) {
  StoreServerOptions o;
  o.host = spec.bind_host;
  o.port = spec.port;
  o.expected_connections = static_cast<std::size_t>(std::max(spec.world_size, 1));
  o.allowed_peers = RoundAllowList(spec.members, spec.host_runs_workers);
  o.max_connections_per_peer = spec.max_connections_per_peer;
  return o;
}

StatusOr<std::uint16_t> RoundStoreHost::Serve(int round, const RoundStoreSpec& spec) {
  if (serving() && round_ == round) return port();
  Stop();
  const StoreServerOptions options = RoundStoreOptions(spec);
  if (io_ != nullptr) {
    CRUN_ASSIGN_OR_RETURN(on_loop_, StoreServer::Start(*io_, options));
  } else {
    CRUN_ASSIGN_OR_RETURN(own_thread_, BackgroundStoreServer::Start(options));
  }
  round_ = round;
  return port();
}

void RoundStoreHost::Stop() {
  if (on_loop_) on_loop_->Stop();
  on_loop_.reset();
  own_thread_.reset();
  round_ = -1;
}

std::uint16_t RoundStoreHost::port() const {
  if (on_loop_) return on_loop_->port();
  return own_thread_ ? own_thread_->port() : 0;
}

}  // namespace crun
