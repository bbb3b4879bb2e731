// Heartbeat datagrams (rendezvous/beats/beat_datagram.h) and the agent's socket for them
// (agent/rendezvous/beat_sender.h): a datagram opens only under its session's key, whole; a
// ticket that is not the service's is refused naming what is wrong; a port nobody serves
// comes back as an error naming the address.
#include <catch2/catch.hpp>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "agent/rendezvous/beat_sender.h"
#include "rendezvous/beats/beat_datagram.h"

namespace {

using crun::rdzv::BeatSession;
using crun::rdzv::BeatTicket;
using crun::rdzv::OpenBeat;
using crun::rdzv::SealBeat;

BeatTicket Ticket(std::uint64_t session) {
  return BeatTicket{29400, session, crun::rdzv::NewBeatKey()};
}

}  // namespace

TEST_CASE("beat datagram: sealed and opened whole under its session's key", "[beats]") {
  const auto t = Ticket(0x0102030405060708ULL);
  const std::string payload = GENERATE(std::string(), std::string("\x08\x2a"),
                                       std::string(crun::rdzv::kMaxBeatPayload, 'x'));
  const std::string d = SealBeat(t, payload);
  CHECK(d.size() == payload.size() + crun::rdzv::kBeatOverhead);
  REQUIRE(BeatSession(d) == t.session);
  const auto opened = OpenBeat(t.key, d);
  REQUIRE(opened);
  CHECK(*opened == payload);
}

TEST_CASE("beat datagram: another key, a flipped bit or a cut one does not open", "[beats]") {
  const auto t = Ticket(7);
  const std::string d = SealBeat(t, "\x08\x01 a beat");
  CHECK_FALSE(OpenBeat(crun::rdzv::NewBeatKey(), d));
  for (std::size_t i = 0; i < d.size(); ++i) {
    std::string bad = d;
    bad[i] = static_cast<char>(bad[i] ^ 0x10);
    INFO("byte " << i);
    CHECK_FALSE(OpenBeat(t.key, bad));
  }
  CHECK_FALSE(OpenBeat(t.key, d.substr(0, d.size() - 1)));
  CHECK_FALSE(BeatSession(d.substr(0, crun::rdzv::kBeatOverhead - 1)));
  CHECK_FALSE(BeatSession("XXXX" + d.substr(4)));
  // The session claimed is another: the tag covers it.
  std::string moved = d;
  moved[11] = static_cast<char>(moved[11] + 1);
  REQUIRE(BeatSession(moved) == 8);
  CHECK_FALSE(OpenBeat(t.key, moved));
}

TEST_CASE("beat ticket: round trip; a bad one names what is wrong", "[beats]") {
  const auto t = Ticket(123456789);
  const auto parsed = crun::rdzv::ParseBeatTicket(crun::rdzv::FormatBeatTicket(t));
  REQUIRE(parsed.ok());
  CHECK(parsed->port == t.port);
  CHECK(parsed->session == t.session);
  CHECK(parsed->key == t.key);
  const std::string key(64, 'a');
  const std::pair<std::string, std::string> cases[] = {
      {"", "fewer than 4 fields"},
      {"1 29400 5", "fewer than 4 fields"},
      {"1 29400 5 " + key + " extra", "more than 4 fields"},
      {"2 29400 5 " + key, "version"},
      {"1 0 5 " + key, "no UDP port"},
      {"1 70000 5 " + key, "no UDP port"},
      {"1 29400 x " + key, "names no session"},
      {"1 29400 5 abcd", "wrong length"},
      {"1 29400 5 " + std::string(63, 'a') + "g", "not hex"},
  };
  for (const auto& [text, why] : cases) {
    INFO(text);
    const auto bad = crun::rdzv::ParseBeatTicket(text);
    REQUIRE_FALSE(bad.ok());
    CHECK_THAT(bad.status().message(), Catch::Contains(why));
  }
}

TEST_CASE("beat socket: a port nobody serves is an error naming it", "[beats]") {
  // A port just freed on loopback: the kernel answers a datagram to it with ICMP port
  // unreachable, which a connected socket returns on the send after.
  const int probe = socket(AF_INET, SOCK_DGRAM, 0);
  sockaddr_in at{};
  at.sin_family = AF_INET;
  at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(bind(probe, reinterpret_cast<sockaddr*>(&at), sizeof at) == 0);
  socklen_t len = sizeof at;
  REQUIRE(getsockname(probe, reinterpret_cast<sockaddr*>(&at), &len) == 0);
  const auto port = ntohs(at.sin_port);
  close(probe);
  auto s = crun::agent::BeatSocket::Connect("ipv4:127.0.0.1:29400", port);
  REQUIRE(s.ok());
  const auto t = Ticket(1);
  crun::v1::Heartbeat beat;
  beat.set_sequence(1);
  (void)s->Send(t, beat);  // the ICMP comes back for this one
  beat.set_sequence(2);
  const auto refused = s->Send(t, beat);
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(refused.message(), Catch::Contains("udp 127.0.0.1:" + std::to_string(port)));
  CHECK_THAT(refused.message(), Catch::Contains("refused"));
  // A beat too large for a datagram is said to be so (it goes on the stream).
  auto ok = crun::agent::BeatSocket::Connect("127.0.0.1", port);
  REQUIRE(ok.ok());
  for (int r = 0; r < 200; ++r) {
    auto* f = beat.add_compute();
    f->set_rank(r);
    f->set_window(1'000'000);
    f->set_compute_us(123'456);
  }
  const auto big = ok->Send(t, beat);
  CHECK(big.code() == crun::StatusCode::kInvalidArgument);
  CHECK_THAT(big.message(), Catch::Contains("does not fit a datagram"));
}
