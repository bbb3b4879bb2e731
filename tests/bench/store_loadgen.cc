// store_loadgen: a load generator speaking the c10d TCPStore wire protocol (1.13 or 2.x
// dialect), for comparing crun's store with PyTorch's servers in the same run.
//
// Closed loop: each connection has one operation in flight, like a real c10d client.
//   set   SET k v, then CHECK [k]   (SET has no reply; the CHECK acknowledges it)
//   get   GET k                     (keys written beforehand)
//   add   ADD k 1
//   wait  pairs of connections: the waiter sends WAIT [k] + GETNUMKEYS; once GETNUMKEYS is
//         answered the wait is registered, and the partner sends SET k; the latency is from
//         that SET to the waiter's STOP_WAITING. --clients counts pairs.
// Storm: opens --storm connections at once (spread over --sources addresses), each doing one
// handshake round trip, reports how many were held or refused and how long it took, prints
// "READY", and holds them until stdin closes (so the caller can measure the server).
// With --barrier, as ranks meet at a store: each connection sets a key of its own and waits on
// one shared key (WAIT, then GETNUMKEYS: its answer says the wait is registered), and counts
// as held once registered. Then, on "go" from stdin (several generators go together; the one
// told "go set" sets the shared key from one more connection): the time until every held
// connection was woken (STOP_WAITING) is the fan-out, reported in a second JSON line.
//
// Output: one JSON object on stdout.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <iostream>
#include <string>
#include <vector>

#include "rendezvous/store/wire.h"

namespace {

using crun::wire::Command;
using crun::wire::Dialect;
using crun::wire::MakeRequest;
using crun::wire::Request;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string host = "127.0.0.1";
  int port = 0;
  Dialect dialect = Dialect::kModern;
  std::string op = "add";
  int clients = 1;
  int warmup_ms = 300;
  int duration_ms = 2000;
  int value_bytes = 32;
  int storm = 0;
  int storm_timeout_ms = 60000;
  std::vector<std::string> sources;
  bool barrier = false;
  std::string barrier_key;  // the shared key (the same for every generator of a run)
};

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "store_loadgen: %s\n", what.c_str());
  std::exit(2);
}

enum class Reply : std::uint8_t { kFixed, kBytes };
struct Expect {
  Reply kind;
  std::size_t size;  // for kFixed
  bool ends_op;      // the op's latency is taken when this reply completes
};

struct Conn {
  int fd = -1;
  std::string out;
  std::string in;
  std::deque<Expect> expect;
  Clock::time_point started;
  std::uint64_t seq = 0;
  int partner = -1;  // wait mode: the setter of a waiter
  bool connected = false;
  bool done = false;   // storm: resolved (held or refused)
  bool woken = false;  // barrier: STOP_WAITING came
};

class LoadGen {
 public:
  explicit LoadGen(Options o) : o_(std::move(o)), epfd_(::epoll_create1(EPOLL_CLOEXEC)) {
    value_.assign(static_cast<std::size_t>(o_.value_bytes), 'v');
    // Wait keys must be new to the store, also when it has served earlier runs.
    run_tag_ =
        std::to_string(::getpid()) + "." + std::to_string(Clock::now().time_since_epoch().count());
  }

  int RunLoad() {
    const int n = o_.op == "wait" ? 2 * o_.clients : o_.clients;
    conns_.resize(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) ConnectBlocking(i);
    if (o_.op == "get") Preload();
    for (int i = 0; i < n; ++i) Watch(i);
    for (int i = 0; i < n; ++i) {
      if (o_.op == "wait") {
        if (i % 2 == 0) {
          conns_[static_cast<std::size_t>(i)].partner = i + 1;
          StartOp(i);
        }
      } else {
        StartOp(i);
      }
    }
    const auto begin = Clock::now();
    measure_from_ = begin + std::chrono::milliseconds(o_.warmup_ms);
    measure_to_ = measure_from_ + std::chrono::milliseconds(o_.duration_ms);
    Loop([&] { return Clock::now() >= measure_to_; }, measure_to_ + std::chrono::seconds(30));
    Report();
    return 0;
  }

  int RunStorm() {
    conns_.resize(static_cast<std::size_t>(o_.storm));
    const auto begin = Clock::now();
    for (int i = 0; i < o_.storm; ++i) ConnectAsync(i);
    const auto deadline = begin + std::chrono::milliseconds(o_.storm_timeout_ms);
    Loop([&] { return resolved_ == o_.storm; }, deadline);
    const double seconds = std::chrono::duration<double>(Clock::now() - begin).count();
    std::printf(
        "{\"mode\":\"storm\",\"attempted\":%d,\"held\":%d,\"refused\":%d,\"pending\":%d,"
        "\"seconds\":%.4f,\"connect_errors\":%d}\nREADY\n",
        o_.storm, held_, refused_, o_.storm - held_ - refused_, seconds, connect_errors_);
    std::fflush(stdout);
    std::string line;
    while (std::getline(std::cin, line)) {
      if (o_.barrier && (line == "go" || line == "go set")) {
        Go(line == "go set", Clock::now() + std::chrono::milliseconds(o_.storm_timeout_ms));
      }
    }
    return 0;
  }

 private:
  // Barrier, on "go": every held connection must be woken, timed from now; on "go set", one
  // more connection sets the shared key first (one generator of a run does).
  void Go(bool set, Clock::time_point deadline) {
    const auto t0 = Clock::now();
    if (set) {
      const int setter = static_cast<int>(conns_.size());
      conns_.emplace_back();
      ConnectBlocking(setter);
      crun::wire::EncodeRequest(o_.dialect, MakeRequest(Command::kSet, {o_.barrier_key, "go"}),
                                &conns_.back().out);
      Flush(setter);
    }
    Loop([&] { return woken_ == held_; }, deadline);
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    std::printf("{\"mode\":\"go\",\"woken\":%d,\"held\":%d,\"seconds\":%.4f}\n", woken_, held_,
                seconds);
    std::fflush(stdout);
  }

  void SetCommon(int fd) {
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }

  sockaddr_in Target() const {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(o_.port));
    if (::inet_pton(AF_INET, o_.host.c_str(), &a.sin_addr) != 1) Die("bad host " + o_.host);
    return a;
  }

  void ConnectBlocking(int i) {
    auto& c = conns_[static_cast<std::size_t>(i)];
    c.fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a = Target();
    if (::connect(c.fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      Die("connect " + o_.host + ":" + std::to_string(o_.port) + ": " + std::strerror(errno));
    }
    SetCommon(c.fd);
    c.connected = true;
    if (o_.dialect == Dialect::kModern) {
      Request v = MakeRequest(Command::kValidate);
      v.nonce = crun::wire::kValidationMagic;
      crun::wire::EncodeRequest(o_.dialect, v, &c.out);
    }
    Flush(i);
    ::fcntl(c.fd, F_SETFL, ::fcntl(c.fd, F_GETFL) | O_NONBLOCK);
  }

  void ConnectAsync(int i) {
    auto& c = conns_[static_cast<std::size_t>(i)];
    c.fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c.fd < 0) Die(std::string("socket: ") + std::strerror(errno));
    if (!o_.sources.empty()) {
      // The port is picked at connect, for the whole address pair: a source port still in
      // TIME_WAIT from an earlier run (to another server port) may serve again.
      const int one = 1;
      ::setsockopt(c.fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof one);
      sockaddr_in src{};
      src.sin_family = AF_INET;
      ::inet_pton(AF_INET, o_.sources[static_cast<std::size_t>(i) % o_.sources.size()].c_str(),
                  &src.sin_addr);
      if (::bind(c.fd, reinterpret_cast<sockaddr*>(&src), sizeof src) != 0) {
        Die(std::string("bind source: ") + std::strerror(errno));
      }
    }
    SetCommon(c.fd);
    sockaddr_in a = Target();
    const int rc = ::connect(c.fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    if (rc != 0 && errno != EINPROGRESS) {
      ++connect_errors_;
      Resolve(i, false);
      return;
    }
    // The handshake goes out once connected: one round trip proves the server serves us.
    if (o_.barrier) {
      if (o_.dialect == Dialect::kModern) {
        Request v = MakeRequest(Command::kValidate);
        v.nonce = crun::wire::kValidationMagic;
        crun::wire::EncodeRequest(o_.dialect, v, &c.out);
      }
      crun::wire::EncodeRequest(o_.dialect,
                                MakeRequest(Command::kSet,
                                            {"/storm/" + run_tag_ + "/" + std::to_string(i),
                                             value_}),
                                &c.out);
      crun::wire::EncodeRequest(o_.dialect, MakeRequest(Command::kWait, {o_.barrier_key}), &c.out);
      crun::wire::EncodeRequest(o_.dialect, MakeRequest(Command::kGetNumKeys), &c.out);
      c.expect.push_back({Reply::kFixed, 8, true});   // registered: held
      c.expect.push_back({Reply::kFixed, 1, false});  // woken
    } else if (o_.dialect == Dialect::kModern) {
      Request v = MakeRequest(Command::kValidate);
      v.nonce = crun::wire::kValidationMagic;
      crun::wire::EncodeRequest(o_.dialect, v, &c.out);
      Request p = MakeRequest(Command::kPing);
      p.nonce = 7;
      crun::wire::EncodeRequest(o_.dialect, p, &c.out);
      c.expect.push_back({Reply::kFixed, 4, true});
    } else {
      crun::wire::EncodeRequest(o_.dialect, MakeRequest(Command::kGetNumKeys), &c.out);
      c.expect.push_back({Reply::kFixed, 8, true});
    }
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP;
    ev.data.u32 = static_cast<std::uint32_t>(i);
    ::epoll_ctl(epfd_, EPOLL_CTL_ADD, c.fd, &ev);
  }

  void Watch(int i) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u32 = static_cast<std::uint32_t>(i);
    ::epoll_ctl(epfd_, EPOLL_CTL_ADD, conns_[static_cast<std::size_t>(i)].fd, &ev);
  }

  void Preload() {
    auto& c = conns_[0];
    ::fcntl(c.fd, F_SETFL, ::fcntl(c.fd, F_GETFL) & ~O_NONBLOCK);
    for (int i = 0; i < o_.clients; ++i) {
      crun::wire::EncodeRequest(o_.dialect, MakeRequest(Command::kSet, {Key(i), value_}), &c.out);
    }
    crun::wire::EncodeRequest(o_.dialect, MakeRequest(Command::kGetNumKeys), &c.out);
    Flush(0);
    char buf[8];
    std::size_t got = 0;
    while (got < 8) {
      const ssize_t n = ::recv(c.fd, buf + got, 8 - got, 0);
      if (n <= 0) Die("preload: connection closed");
      got += static_cast<std::size_t>(n);
    }
    ::fcntl(c.fd, F_SETFL, ::fcntl(c.fd, F_GETFL) | O_NONBLOCK);
  }

  std::string Key(int i) const { return "/bench/k" + std::to_string(i); }
  std::string WaitKey(int i) const {
    return "/bench/w/" + run_tag_ + "/" + std::to_string(i) + "/" +
           std::to_string(conns_[static_cast<std::size_t>(i)].seq);
  }

  void StartOp(int i) {
    auto& c = conns_[static_cast<std::size_t>(i)];
    c.started = Clock::now();
    if (o_.op == "set") {
      crun::wire::EncodeRequest(o_.dialect, MakeRequest(Command::kSet, {Key(i), value_}), &c.out);
      crun::wire::EncodeRequest(o_.dialect, MakeRequest(Command::kCheck, {Key(i)}), &c.out);
      c.expect.push_back({Reply::kFixed, 1, true});
    } else if (o_.op == "get") {
      crun::wire::EncodeRequest(o_.dialect, MakeRequest(Command::kGet, {Key(i)}), &c.out);
      c.expect.push_back({Reply::kBytes, 0, true});
    } else if (o_.op == "add") {
      crun::wire::EncodeRequest(o_.dialect,
                                MakeRequest(Command::kAdd, {"/bench/n" + std::to_string(i)}, 1),
                                &c.out);
      c.expect.push_back({Reply::kFixed, 8, true});
    } else {  // wait: this is the waiter
      crun::wire::EncodeRequest(o_.dialect, MakeRequest(Command::kWait, {WaitKey(i)}), &c.out);
      crun::wire::EncodeRequest(o_.dialect, MakeRequest(Command::kGetNumKeys), &c.out);
      c.expect.push_back({Reply::kFixed, 8, false});  // registered
      c.expect.push_back({Reply::kFixed, 1, true});   // woken
    }
    Flush(i);
  }

  // The waiter's wait is registered: its partner sets the key now; latency counts from here.
  void Wake(int waiter) {
    auto& w = conns_[static_cast<std::size_t>(waiter)];
    auto& s = conns_[static_cast<std::size_t>(w.partner)];
    crun::wire::EncodeRequest(o_.dialect, MakeRequest(Command::kSet, {WaitKey(waiter), "1"}),
                              &s.out);
    w.started = Clock::now();
    Flush(w.partner);
  }

  void Flush(int i) {
    auto& c = conns_[static_cast<std::size_t>(i)];
    while (!c.out.empty()) {
      const ssize_t n = ::send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL);
      if (n > 0) {
        c.out.erase(0, static_cast<std::size_t>(n));
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        epoll_event ev{};
        ev.events = EPOLLIN | EPOLLOUT;
        ev.data.u32 = static_cast<std::uint32_t>(i);
        ::epoll_ctl(epfd_, EPOLL_CTL_MOD, c.fd, &ev);
        return;
      }
      if (o_.storm > 0) {
        Resolve(i, false);
        return;
      }
      Die(std::string("send: ") + std::strerror(errno));
    }
  }

  void Resolve(int i, bool held) {
    auto& c = conns_[static_cast<std::size_t>(i)];
    if (c.done) return;
    c.done = true;
    ++resolved_;
    if (held) {
      ++held_;
      if (o_.barrier) return;  // still read: its wake-up comes later
      epoll_event ev{};
      ::epoll_ctl(epfd_, EPOLL_CTL_DEL, c.fd, &ev);
    } else {
      ++refused_;
      ::epoll_ctl(epfd_, EPOLL_CTL_DEL, c.fd, nullptr);
      ::close(c.fd);
      c.fd = -1;
    }
  }

  // Consumes complete replies; returns false when the connection broke.
  void OnReadable(int i) {
    auto& c = conns_[static_cast<std::size_t>(i)];
    char buf[65536];
    for (;;) {
      const ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
      if (n > 0) {
        c.in.append(buf, static_cast<std::size_t>(n));
        if (static_cast<std::size_t>(n) < sizeof buf) break;
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      if (o_.storm > 0 && !c.done) {
        Resolve(i, false);
        return;
      }
      if (o_.barrier) Die("barrier: the server closed held connection " + std::to_string(i));
      Die("server closed connection " + std::to_string(i) +
          (n == 0 ? std::string(" (EOF)") : ": " + std::string(std::strerror(errno))));
    }
    std::size_t pos = 0;
    while (!c.expect.empty()) {
      const Expect e = c.expect.front();
      std::size_t need = e.size;
      if (e.kind == Reply::kBytes) {
        if (c.in.size() - pos < 8) break;
        need = 8 + crun::wire::LoadU64(c.in.data() + pos);
      }
      if (c.in.size() - pos < need) break;
      pos += need;
      c.expect.pop_front();
      if (o_.barrier && !e.ends_op) {
        if (c.in[pos - 1] != 0) Die("barrier: expected STOP_WAITING (0)");
        c.woken = true;
        ++woken_;
        continue;
      }
      if (o_.storm > 0) {
        Resolve(i, true);
        continue;
      }
      if (o_.op == "wait" && !e.ends_op) {
        Wake(i);
        continue;
      }
      if (o_.op == "wait" && c.in[pos - 1] != 0) {
        Die("wait: expected STOP_WAITING (0), got byte " +
            std::to_string(static_cast<unsigned char>(c.in[pos - 1])));
      }
      if (e.ends_op) {
        ++total_ops_;
        const auto now = Clock::now();
        if (now >= measure_from_ && now < measure_to_) {
          ++ops_;
          lat_us_.push_back(static_cast<std::uint32_t>(
              std::chrono::duration_cast<std::chrono::microseconds>(now - c.started).count()));
        }
        ++c.seq;
        if (now < measure_to_) StartOp(i);
      }
    }
    c.in.erase(0, pos);
  }

  template <typename Done>
  void Loop(Done done, Clock::time_point hard_deadline) {
    std::vector<epoll_event> events(1024);
    while (!done()) {
      if (Clock::now() > hard_deadline) break;
      const int n = ::epoll_wait(epfd_, events.data(), static_cast<int>(events.size()), 50);
      for (int k = 0; k < n; ++k) {
        const int i = static_cast<int>(events[static_cast<std::size_t>(k)].data.u32);
        auto& c = conns_[static_cast<std::size_t>(i)];
        if (c.fd < 0 || (c.done && !o_.barrier)) continue;
        const auto ev = events[static_cast<std::size_t>(k)].events;
        if (ev & EPOLLOUT) {
          if (!c.connected) {
            int err = 0;
            socklen_t len = sizeof err;
            ::getsockopt(c.fd, SOL_SOCKET, SO_ERROR, &err, &len);
            if (err != 0) {
              ++connect_errors_;
              Resolve(i, false);
              continue;
            }
            c.connected = true;
          }
          epoll_event mod{};
          mod.events = EPOLLIN | EPOLLRDHUP;
          mod.data.u32 = static_cast<std::uint32_t>(i);
          ::epoll_ctl(epfd_, EPOLL_CTL_MOD, c.fd, &mod);
          Flush(i);
        }
        if ((!c.done || o_.barrier) && c.fd >= 0 &&
            (ev & (EPOLLIN | EPOLLRDHUP | EPOLLERR | EPOLLHUP))) {
          OnReadable(i);
        }
      }
    }
  }

  void Report() {
    std::sort(lat_us_.begin(), lat_us_.end());
    auto pct = [&](double p) -> double {
      if (lat_us_.empty()) return 0;
      return lat_us_[static_cast<std::size_t>(p * static_cast<double>(lat_us_.size() - 1))];
    };
    const double seconds = o_.duration_ms / 1000.0;
    std::printf(
        "{\"mode\":\"load\",\"op\":\"%s\",\"clients\":%d,\"ops\":%llu,\"total_ops\":%llu,"
        "\"ops_per_s\":%.1f,\"p50_us\":%.0f,\"p99_us\":%.0f}\n",
        o_.op.c_str(), o_.clients, static_cast<unsigned long long>(ops_),
        static_cast<unsigned long long>(total_ops_), static_cast<double>(ops_) / seconds, pct(0.50),
        pct(0.99));
  }

  Options o_;
  int epfd_;
  std::string run_tag_;
  std::string value_;
  std::vector<Conn> conns_;
  Clock::time_point measure_from_, measure_to_;
  std::uint64_t ops_ = 0;
  std::uint64_t total_ops_ = 0;  // warm-up included
  std::vector<std::uint32_t> lat_us_;
  int resolved_ = 0, held_ = 0, refused_ = 0, connect_errors_ = 0, woken_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) Die("missing value after " + a);
      return argv[++i];
    };
    if (a == "--host")
      o.host = next();
    else if (a == "--port")
      o.port = std::stoi(next());
    else if (a == "--dialect") {
      const std::string d = next();
      if (d == "legacy")
        o.dialect = Dialect::kLegacy;
      else if (d == "modern")
        o.dialect = Dialect::kModern;
      else
        Die("dialect must be legacy or modern, not " + d);
    } else if (a == "--op")
      o.op = next();
    else if (a == "--clients")
      o.clients = std::stoi(next());
    else if (a == "--warmup-ms")
      o.warmup_ms = std::stoi(next());
    else if (a == "--duration-ms")
      o.duration_ms = std::stoi(next());
    else if (a == "--value-bytes")
      o.value_bytes = std::stoi(next());
    else if (a == "--storm")
      o.storm = std::stoi(next());
    else if (a == "--storm-timeout-ms")
      o.storm_timeout_ms = std::stoi(next());
    else if (a == "--source")
      o.sources.push_back(next());
    else if (a == "--barrier") {
      o.barrier_key = next();
      o.barrier = true;
    } else
      Die("unknown argument " + a);
  }
  if (o.port <= 0 || o.port > 65535) Die("--port must be 1..65535");
  if (o.op != "set" && o.op != "get" && o.op != "add" && o.op != "wait") Die("bad --op " + o.op);
  LoadGen gen(o);
  return o.storm > 0 ? gen.RunStorm() : gen.RunLoad();
}
