#include "agent/rendezvous/session_words.h"

#include <unistd.h>

#include "base/host_addresses.h"
#include "base/proc.h"

namespace crun::agent {

std::string RefusedMessage(const ServiceRendezvousOptions& o, const std::string& target,
                           const std::string& why) {
  return "the rendezvous service at " + target + " refused this node (run '" + o.run_id +
         "', node '" + o.node_id + "'): " + why;
}

std::string UnreachableHint(const ServiceRendezvousOptions& o) {
  std::string holders;
  if (NamesThisHost(o.endpoint_host)) {
    for (const PortHolder& h : TcpPortHolderList(o.endpoint_port)) {
      if (h.pid == ::getpid()) continue;  // this crun's own (a self-connect): says nothing
      holders +=
          (holders.empty() ? "pid " : ", pid ") + std::to_string(h.pid) + " (" + h.name + ")";
    }
  }
  if (holders.empty()) {
    return "is `crun rendezvous` or the host node's crun running there, and is the port open?";
  }
  return "port " + std::to_string(o.endpoint_port) + " on this host is held by " + holders +
         ", which never answered as the service: is it stopped (SIGSTOP), hung, or not crun?";
}

std::string SetupHint(const ServiceRendezvousOptions& o) {
  if (!o.security.tls()) {
    return " (this node speaks plaintext: if the service uses TLS, give --tls-ca; or the port is "
           "not a crun rendezvous service)";
  }
  // Both sides named: the service's certificate, or (mutual TLS) this node's.
  std::string hint =
      " (this node uses TLS: does the service? Its certificate must be signed by --tls-ca and "
      "name '" +
      o.endpoint_host + "'";
  if (o.security.cert_pem.empty()) {
    return hint +
           "; a service that requires client certificates (mutual TLS) also needs --tls-cert and "
           "--tls-key on this node)";
  }
  return hint +
         "; with mutual TLS, this node's --tls-cert must be signed by a CA the service trusts (its "
         "--tls-ca))";
}

bool MismatchSign(const std::string& error) {
  for (const char* sign :
       {"Ssl handshake failed", "SSL_ERROR", "certificate", "http1.x", "Handshake failed"}) {
    if (error.find(sign) != std::string::npos) return true;
  }
  return false;
}

}  // namespace crun::agent
