// Heartbeat datagrams (rendezvous/beats/beat_datagram.h) and the agent's socket for them
// (agent/rendezvous/beat_sender.h): a datagram opens only under its session's key, whole; a
// ticket that is not the service's is refused naming what is wrong; a port nobody serves
// comes back as an error naming the address. The service's acks open only under the session's
// key, and AckWatch sends a beat to the stream exactly when the acks leave the service's
// heartbeat_timeout at risk.
#include <catch2/catch.hpp>

#include <boost/asio/io_context.hpp>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <string>
#include <vector>

#include "agent/rendezvous/beat_sender.h"
#include "rendezvous/beats/beat_datagram.h"
#include "rendezvous/service/beat_receiver.h"

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

TEST_CASE("beat ticket: round trip, a bad one names what is wrong", "[beats]") {
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

TEST_CASE("beat ack: sealed and opened under the session's key, nothing else opens", "[beats]") {
  const auto key = crun::rdzv::NewBeatKey();
  const auto d = crun::rdzv::SealAck(key, 0x0a0b0c0d0e0f1011ULL, 42);
  const std::string_view view(d.data(), d.size());
  REQUIRE(crun::rdzv::AckSession(view) == 0x0a0b0c0d0e0f1011ULL);
  const auto ack = crun::rdzv::OpenAck(key, view);
  REQUIRE(ack);
  CHECK(ack->session == 0x0a0b0c0d0e0f1011ULL);
  CHECK(ack->sequence == 42);
  CHECK_FALSE(crun::rdzv::OpenAck(crun::rdzv::NewBeatKey(), view));
  for (std::size_t i = 0; i < d.size(); ++i) {
    std::string bad(view);
    bad[i] = static_cast<char>(bad[i] ^ 0x01);
    INFO("byte " << i);
    CHECK_FALSE(crun::rdzv::OpenAck(key, bad));
  }
  CHECK_FALSE(crun::rdzv::OpenAck(key, view.substr(0, view.size() - 1)));
  CHECK_FALSE(crun::rdzv::OpenAck(key, std::string(view) + "x"));
  // A beat is not an ack, nor an ack a beat.
  const BeatTicket t{29400, 5, key};
  CHECK_FALSE(crun::rdzv::AckSession(SealBeat(t, std::string(8, 'x'))));
  CHECK_FALSE(BeatSession(view));
}

namespace {

using crun::agent::AckWatch;
using std::chrono::milliseconds;

// One tick of the agent's heartbeat: acks that came since the last, then the beat.
struct Tick {
  std::vector<std::uint64_t> acks;  // sequences the service acked before this tick
  bool stream_too;                  // what the beat due at this tick must do
};

// Beats every `interval` from the session's opening at 0, sequence = tick number.
void Play(milliseconds interval, milliseconds timeout, const std::vector<Tick>& ticks) {
  const AckWatch::Clock::time_point t0{};
  AckWatch w(interval, timeout, t0);
  for (std::size_t i = 0; i < ticks.size(); ++i) {
    const auto now = t0 + interval * static_cast<int>(i + 1);
    for (const auto s : ticks[i].acks) w.Acked(s);
    INFO("tick " << i + 1);
    CHECK(w.StreamToo(now) == ticks[i].stream_too);
    w.Sent(i + 1, now);
  }
}

}  // namespace

TEST_CASE("ack watch: a beat goes on the stream when the acks put the timeout at risk", "[beats]") {
  const milliseconds s1(1'000), s3(3'000);
  SECTION("acked every time: never") {
    Play(s1, s3, {{{}, false}, {{1}, false}, {{2}, false}, {{3}, false}, {{4}, false}});
  }
  SECTION("never acked (UDP blocked): from the second beat on, every beat") {
    // The opening counts as heard; the second beat, at 2 s, is the last that reaches the
    // service before 3 s when the first went unheard.
    Play(s1, s3, {{{}, false}, {{}, true}, {{}, true}, {{}, true}});
  }
  SECTION("one ack lost: one stream beat; then back") {
    Play(s1, s3, {{{}, false}, {{1}, false}, {{}, true}, {{3}, false}, {{4}, false}});
  }
  SECTION("acks that come late still count, for the beat they answer") {
    Play(s1, s3, {{{}, false}, {{}, true}, {{1, 2}, false}, {{3}, false}});
  }
  SECTION("UDP cut mid-session: stream until acks come again") {
    Play(s1, s3, {{{}, false}, {{1}, false}, {{}, true}, {{}, true}, {{}, true}, {{5}, false}});
  }
  SECTION("a long timeout tolerates more silence") {
    // 10 s: the newest ack may be 8.5 s old before a beat must go on the stream.
    Play(s1, milliseconds(10'000),
         {{{}, false},
          {{1}, false},
          {{}, false},
          {{}, false},
          {{}, false},
          {{}, false},
          {{}, false},
          {{}, false},
          {{}, false},
          {{}, true},
          {{}, true}});
  }
  SECTION("a timeout with no slack: every beat") {
    Play(s1, milliseconds(1'500), {{{}, true}, {{1}, true}, {{2}, true}});
  }
  SECTION("acks of beats never sent, or stale, say nothing") {
    Play(s1, s3, {{{}, false}, {{1}, false}, {{99}, true}, {{1}, true}, {{0}, true}, {{5}, false}});
  }
}

// Whatever order acks arrive in, duplicated or lost: the watch asks for the stream exactly when
// the newest beat acked was sent so long ago that the next one would come after the timeout.
TEST_CASE("ack watch: random ack orders agree with the rule", "[beats]") {
  std::mt19937 rng(20261129);
  const milliseconds interval(1'000), timeout(3'000);
  for (int round = 0; round < 200; ++round) {
    const AckWatch::Clock::time_point t0{};
    AckWatch w(interval, timeout, t0);
    std::vector<std::uint64_t> in_flight;
    std::uint64_t newest_heard = 0;  // the model: the newest sequence acked (0: the opening)
    for (std::uint64_t tick = 1; tick <= 30; ++tick) {
      std::shuffle(in_flight.begin(), in_flight.end(), rng);
      std::vector<std::uint64_t> kept;
      for (const auto s : in_flight) {
        if (tick - s > 4) continue;  // lost: the watch remembers the last 8 beats only
        switch (rng() % 4) {
          case 0:  // lost
            break;
          case 1:  // later
            kept.push_back(s);
            break;
          default:  // now, sometimes twice
            w.Acked(s);
            if (rng() % 5 == 0) w.Acked(s);
            newest_heard = std::max(newest_heard, s);
        }
      }
      in_flight = kept;
      const auto now = t0 + interval * static_cast<int>(tick);
      const auto heard_at = t0 + interval * static_cast<int>(newest_heard);
      INFO("round " << round << " tick " << tick);
      REQUIRE(w.StreamToo(now) == (now - heard_at + interval + interval / 2 >= timeout));
      w.Sent(tick, now);
      in_flight.push_back(tick);
    }
  }
}

// More beats than the receiver's buffer holds, sent before it reads any: what the kernel
// dropped is counted from SO_RXQ_OVFL, and with what was taken accounts for every beat sent.
// No sleeps: the engine runs until the beats it waits for have come.
TEST_CASE("beat receiver: datagrams the kernel dropped are counted", "[beats]") {
  boost::asio::io_context engine;
  auto opened =
      crun::rdzv::BeatReceiver::Open(engine, "127.0.0.1", 0, std::chrono::milliseconds(20));
  REQUIRE(opened.ok());
  auto& r = **opened;
  const std::uint64_t session = 77;
  const BeatTicket t{r.port(), session, r.Add(session)};
  auto socket = crun::agent::BeatSocket::Connect("127.0.0.1", t.port);
  REQUIRE(socket.ok());
  // Past 8 MiB of the kernel's accounting (about 1 KiB a datagram on loopback).
  constexpr std::uint64_t kSent = 30'000;
  crun::v1::Heartbeat beat;
  for (std::uint64_t i = 1; i <= kSent; ++i) {
    beat.set_sequence(i);
    REQUIRE(socket->Send(t, beat).ok());
  }
  std::uint64_t handed = 0, newest = 0;
  r.Start(
      [&](std::uint64_t, const crun::v1::Heartbeat& b) {
        ++handed;
        newest = b.sequence();
      },
      {}, {});
  const auto& c = r.counts();
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  const auto run_engine_until = [&](const auto& done) {
    while (!done() && std::chrono::steady_clock::now() < until) {
      engine.restart();
      engine.run_for(std::chrono::milliseconds(20));
    }
  };
  // A drain reads the socket empty and hands its beats over in one post: once any came, the
  // queue is empty. The kernel tells the drops on the datagrams queued after them: one more.
  run_engine_until([&] { return handed > 0; });
  const std::uint64_t sent = kSent + 1;
  beat.set_sequence(sent);
  REQUIRE(socket->Send(t, beat).ok());
  run_engine_until([&] { return newest == sent; });
  REQUIRE(newest == sent);
  r.Stop();
  CHECK(c.dropped.load() > 0);
  CHECK(c.taken.load() + c.dropped.load() == sent);
  CHECK(handed == c.taken.load());
  CHECK(c.forged.load() + c.stale.load() + c.unknown.load() + c.malformed.load() == 0);
}
