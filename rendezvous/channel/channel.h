// gRPC client channels as crun dials them: to the rendezvous service (agents, `crun status`,
// `crun stacks`) and to etcd (rendezvous/etcd). Reconnects back off from 20 ms to at most 1 s,
// keepalive pings notice a silent peer within keepalive_timeout, no proxy is ever used, and
// TLS is used when the Security holds a certificate or a CA (base/security.h).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "base/security.h"

namespace crun::rdzv {

struct ChannelOptions {
  std::chrono::milliseconds keepalive_interval{1'000};
  std::chrono::milliseconds keepalive_timeout{3'000};
  // gRPC's floor for one connection attempt (TCP and HTTP/2 handshakes) and for the pause
  // after a failed one. A server that accepts connections before it serves them (etcd while
  // it boots) needs a floor longer than its start.
  std::chrono::milliseconds min_connect{100};
  // The longest pause between connection attempts (they start 20 ms apart and grow).
  std::chrono::milliseconds max_backoff{1'000};
  // Pings also while no call is open. etcd refuses that by default (its servers answer a
  // client that pings an idle connection, or more often than every 5 s, with GOAWAY
  // "too_many_pings").
  bool ping_when_idle = true;
  // A connection of its own (not shared with other channels to the same endpoint).
  bool own_connection = true;
  // TLS when it holds a certificate or a CA (security.h), else plaintext.
  Security security;
};

// "host:port" (IPv6 as "[::1]:29400").
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target,
                                           const ChannelOptions& options);

// Whether a fail-fast call gave up while connecting to something that listens: a channel drops a
// connection whose handshake takes over min_connect, as a busy or briefly stopped server's does.
// Such a call is worth making again with wait_for_ready, within its deadline. A refused
// connection is not (nothing listens).
bool GaveUpConnecting(const grpc::Status& s);

}  // namespace crun::rdzv
