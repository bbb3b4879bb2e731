#include "rendezvous/channel/channel.h"

#include <algorithm>
#include <cstdint>

#include <absl/synchronization/mutex.h>

namespace crun::rdzv {

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target, const ChannelOptions& o) {
  // Debian's abseil is built without NDEBUG, so every absl::Mutex that gRPC takes also records
  // the lock order for deadlock detection: about 5 % of the agents' CPU while 1,000 of them
  // form through etcd (the service turns it off as well). Process-wide; crun's processes
  // that dial are crun's.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 20);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, static_cast<int>(o.min_connect.count()));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, static_cast<int>(o.max_backoff.count()));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, static_cast<int>(o.keepalive_interval.count()));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, static_cast<int>(o.keepalive_timeout.count()));
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, o.ping_when_idle ? 1 : 0);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  // Names are never resolved through a proxy; the service is dialed directly.
  args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);
  if (o.own_connection) args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (o.security.tls()) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = o.security.ca_pem;  // empty: gRPC's default roots
    ssl.pem_private_key = o.security.key_pem;
    ssl.pem_cert_chain = o.security.cert_pem;
    credentials = grpc::SslCredentials(ssl);
  }
  return grpc::CreateCustomChannel(target, credentials, args);
}

bool GaveUpConnecting(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::UNAVAILABLE &&
         s.error_message().find("Connection refused") == std::string::npos;
}

}  // namespace crun::rdzv
