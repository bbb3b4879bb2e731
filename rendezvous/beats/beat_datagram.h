// Heartbeats over UDP (docs/rendezvous.md, "Heartbeats"): a beat on a session's gRPC stream
// costs the service gRPC's price for one message, about 40 µs of CPU on this project's build
// (a bare gRPC server pays the same: tests/bench/rdzv_bench.py), so 10,000 agents beating each
// second kept half a core busy. A datagram costs a few µs, read in batches.
//
// The service hands each session a ticket in the stream's initial metadata: the UDP port to
// beat to, the session's id and a random key of its own. A beat datagram is
//   "CRB1" | session id (8 bytes, big-endian) | payload (a crun.v1.Heartbeat's bytes) | tag
// where the tag is the first 16 bytes of HMAC-SHA256(key, everything before it): a datagram
// is taken only from whoever holds the session's key (the ticket travels in the stream, under
// its TLS when it has TLS), and the payload's sequence, which only grows, refuses a replay.
//
// The service answers each beat it takes with an ack to the address the beat came from:
//   "CRA1" | session id (8 bytes) | the beat's sequence (8 bytes, big-endian) | tag
// under the same key, so that only the service can say a beat was heard. An agent whose beats
// go unanswered beats on its stream too (agent/rendezvous/beat_sender.h, AckWatch).
// Plain C++ and OpenSSL; shared by the service (rendezvous/service) and the agent.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "base/status.h"

namespace crun::rdzv {

inline constexpr char kBeatTicketHeader[] = "x-crun-beat";
// A payload larger than this leaves room for the header and tag under a 1,280-byte IPv6 MTU;
// a larger beat goes on the gRPC stream.
inline constexpr std::size_t kMaxBeatPayload = 1'200;
inline constexpr std::size_t kBeatOverhead = 4 + 8 + 16;

using BeatKey = std::array<unsigned char, 32>;

struct BeatTicket {
  std::uint16_t port = 0;  // the service's UDP port (on the address the stream reached)
  std::uint64_t session = 0;
  BeatKey key{};
};

// A fresh key from the system's random source.
BeatKey NewBeatKey();
// "1 PORT SESSION KEYHEX": the metadata value.
std::string FormatBeatTicket(const BeatTicket& t);
// The value above; an error names what is wrong with it.
StatusOr<BeatTicket> ParseBeatTicket(std::string_view text);

inline constexpr std::size_t kBeatAckSize = 4 + 8 + 8 + 16;
using BeatAckDatagram = std::array<char, kBeatAckSize>;
struct BeatAck {
  std::uint64_t session = 0;
  std::uint64_t sequence = 0;
};

// The datagram for `payload` under the ticket (payload: at most kMaxBeatPayload bytes).
std::string SealBeat(const BeatTicket& t, std::string_view payload);
// The session a datagram claims, when it has the shape of one (not yet its key's proof).
std::optional<std::uint64_t> BeatSession(std::string_view datagram);
// The payload, when the datagram's tag is the key's (compared in constant time).
std::optional<std::string_view> OpenBeat(const BeatKey& key, std::string_view datagram);

// The service's answer to the beat `sequence` of `session`.
BeatAckDatagram SealAck(const BeatKey& key, std::uint64_t session, std::uint64_t sequence);
// The session an ack claims, when it has the shape of one (not yet its key's proof).
std::optional<std::uint64_t> AckSession(std::string_view datagram);
// The ack, when its tag is the key's.
std::optional<BeatAck> OpenAck(const BeatKey& key, std::string_view datagram);

}  // namespace crun::rdzv
