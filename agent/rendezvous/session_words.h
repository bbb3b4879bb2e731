// Why a node's session with crun's rendezvous service failed, in the words its error gives: a
// refusal, a port held by a process that never answers, a TLS setup one side lacks, or an answer
// from something that is not a crun service. Every message names the endpoint, and where it
// helps the run, the node and the flags to check.
#pragma once

#include <cstdint>
#include <string>

#include "agent/rendezvous/service_rendezvous.h"

namespace crun::agent {

// "the rendezvous service at <target> refused this node (run '<run>', node '<node>'): <why>"
std::string RefusedMessage(const ServiceRendezvousOptions& o, const std::string& target,
                           const std::string& why);
// What to check when the endpoint never answered: on this host, the processes that hold the
// port and never answered as the service (a stopped or hung daemon, a stranger) are named.
std::string UnreachableHint(const ServiceRendezvousOptions& o);
// What to check when a session could not be set up: TLS on one side only, a certificate not
// trusted, or (plaintext) a port that is not a crun service.
std::string SetupHint(const ServiceRendezvousOptions& o);
// Whether a session's error is sure to come from talking to the wrong kind of server (TLS on
// one side only, a certificate refused, an HTTP/1 server). A closed socket is not: a
// restarting service closes it too.
bool MismatchSign(const std::string& error);

}  // namespace crun::agent
