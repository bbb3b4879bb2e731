// Who may talk to the rendezvous service (docs/security.md).
//
// * A job token: a shared secret every gRPC call must carry (metadata `x-crun-token`) when the
//   service has one. It is read from --token-file, CRUN_TOKEN_FILE or CRUN_TOKEN, in that order;
//   a file keeps it out of `ps` and of the environment the workers inherit (crun removes
//   CRUN_TOKEN from the workers' environment either way).
// * TLS for the gRPC service: the service presents --tls-cert/--tls-key; with --tls-ca it also
//   requires and verifies client certificates (mutual TLS). Agents and `crun status` verify
//   the service against --tls-ca (the system's roots without it) and present --tls-cert/--tls-key
//   when given. CRUN_TLS_CERT, CRUN_TLS_KEY and CRUN_TLS_CA stand in for the flags. This file
//   loads and checks them; gRPC credentials are made from them where gRPC is used: the
//   service adapter (rendezvous/service) and the agent's client
//   (agent/rendezvous/session_client.h).
//
// Shared by the service and the agent, so it sits in the bottom layer; plain C++ and POSIX,
// and a library of its own (crun_security) beside crun_base, which the worker SDK installs.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace crun {

inline constexpr char kTokenHeader[] = "x-crun-token";

// The files as given on the command line; empty means "from the environment, if set".
struct SecurityFlags {
  std::string token_file;
  std::string tls_cert;
  std::string tls_key;
  std::string tls_ca;
};

// Loaded and checked: file contents, not paths.
struct Security {
  std::string token;         // empty: no token
  std::string token_source;  // "--token-file /etc/crun/token", "CRUN_TOKEN", for messages
  std::string cert_pem, key_pem, ca_pem;
  std::string cert_path, ca_path;  // for messages
  bool tls() const { return !cert_pem.empty() || !ca_pem.empty(); }
};

// Reads the token and the TLS files named by the flags or the environment. Errors name the
// flag or variable and the path: "--tls-key /x/key.pem: No such file or directory".
// `role` is "service" or "client": a service with TLS needs a certificate and its key; a
// client needs the key exactly when it has a certificate.
StatusOr<Security> LoadSecurity(const SecurityFlags& flags, std::string_view role);

// Compares in time independent of where the strings differ.
bool TokenMatches(std::string_view expected, std::string_view given);

// The IP address in a gRPC peer string: "ipv4:10.0.0.2:51234" -> "10.0.0.2",
// "ipv6:[::1]:5" -> "::1", "ipv6:%5B::1%5D:5" likewise; anything else is returned unchanged.
std::string PeerIp(std::string_view grpc_peer);

// Who may connect to a server of one round (its store, Horovod's rendezvous), the one builder
// every such server uses: the addresses of each member, as `members` lists them, plus loopback
// (`with_loopback`: the server's host runs members' workers, which may come over it). An empty
// list, which admits everyone, when any member's addresses are unknown (an empty entry): no
// list rather than a wrong one.
std::vector<std::string> RoundAllowList(const std::vector<std::vector<std::string>>& members,
                                        bool with_loopback);

}  // namespace crun
