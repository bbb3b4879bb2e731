// Rendezvous load generator: N simulated agents, each a real crun.v1 Session stream (the
// agent's own SessionClient), spread over a few HTTP/2 connections, against one running
// rendezvous service. Phases, each timed and checked:
//
//   form     every agent sends Join (min = max = N): until every agent holds its assignment
//            (group ranks a permutation of 0..N-1, base ranks contiguous, one store)
//   steady   every agent heartbeats each --heartbeat-ms for one interval (2 s at most), then
//            --steady-ms more, measured: the service's CPU. As crun's agent does, a beat is a
//            datagram where the service gave a ticket, read the service's acks and beat on the
//            stream too when they say so (AckWatch); --stream-beats keeps them on the stream
//   failure  one agent reports a failed worker: until every agent was told to stop and
//            re-join, then (each re-joins at once) until every agent holds the next round
//   finish   every agent reports success: until every agent got the outcome
//
// With --jobs J, the agents form J jobs of N/J each (run ids RUN-0 … RUN-(J-1), agent i in job
// i % J), all at once on the one service: "form" is until the last agent of every job holds its
// assignment, and each job's own time (its last agent's) is reported too. No failure phase
// then: a failure concerns one job.
//
// The agents live in --procs processes (shards), forked before any gRPC object exists, each
// holding every procs-th agent. One process cannot hold 100,000 sessions cheaply: Debian's
// gRPC is built with its debug checks, and each completion scans the list of every operation
// outstanding on the completion queue (cq_check_tag), one queue for all callback sessions, so a
// process's cost grows with the square of its sessions. This process coordinates: it tells the
// shards each phase over a pipe, and a phase ends when the last shard's last agent reached it
// (each shard reports the steady-clock time, the same clock in every process).
//
// With --service-pid, the service's CPU time (user + system, /proc/PID/stat) over each phase
// and its RSS are measured too. Prints one JSON object. Exit 1 when a phase does not complete
// within --phase-timeout-ms, naming it and how many agents were still missing.
//
//   rdzv_loadgen --endpoint 127.0.0.1:29400 --agents 10000 [--channels 16] [--nproc 8]
//                [--procs P] [--service-pid PID] [--run-id bench] [--tensorflow]
//
// With --etcd host:port,... instead of --endpoint, the same phases run through etcd, each
// agent the agent's own etcd rendezvous (rdzv_loadgen_etcd.h) in the same shards (a few
// descriptors an agent: 10,000 do not fit one process's 20,000 here); --service-pid once per
// member. The shards' own CPU (the agents') is reported for each phase too.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include "agent/rendezvous/beat_sender.h"
#include "agent/rendezvous/session_client.h"
#include "rendezvous/contracts/contract_set.h"
#include "rendezvous/rules/rules.h"
#include "tests/bench/loadgen_shards.h"
#include "tests/bench/loadgen_util.h"
#include "tests/bench/rdzv_loadgen_etcd.h"

namespace {

using Clock = std::chrono::steady_clock;
using crun::agent::SessionClient;
using crun::bench::Commands;
using crun::bench::NowNs;
using crun::bench::ProcStat;
using crun::bench::ReadProcs;
using crun::bench::Shards;
using crun::bench::Tally;
using crun::bench::WriteLine;
namespace v1 = crun::v1;

struct Agent {
  int index = 0;
  std::unique_ptr<SessionClient> session;
  std::optional<crun::rdzv::BeatTicket> ticket;  // heartbeats over UDP (the service's ticket)
  std::optional<crun::agent::AckWatch> watch;    // its acks, from the steady phase's start
  std::atomic<int> round{-1};
  v1::RoundAssignment assignment;  // of the first round, for the checks
  std::int64_t assigned_ns = 0;    // when the first round's assignment came
};

// Half-closes each session in turn and waits for the service to end it, all within `limit`
// (at least 2 s each). A service busy with the job's end may answer the first of 100,000
// half-closes later than one session's own grace: that is no failed session.
void CloseAll(std::vector<std::unique_ptr<Agent>>& agents, std::chrono::milliseconds limit) {
  const auto by = Clock::now() + limit;
  for (auto& a : agents) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(by - Clock::now());
    a->session->Close(std::max(left, std::chrono::milliseconds(2000)));
  }
}

struct Options {
  std::string endpoint;
  int agents = 1000;
  int channels = 16;
  int procs = 0;  // 0: one for every kAgentsPerProc agents
  int nproc = 8;
  int heartbeat_ms = 1000;
  int keepalive_ms = 10'000;  // each channel's HTTP/2 ping (an agent's: its heartbeat interval)
  int steady_ms = 3000;
  int phase_timeout_ms = 120'000;
  std::vector<int> service_pids;
  std::string run_id = "bench";
  int jobs = 1;      // the agents form this many jobs of agents / jobs each
  std::string etcd;  // endpoints: the etcd mode (rdzv_loadgen_etcd.h)
  // --contract tensorflow: each agent reserves a port a worker, and every assignment carries
  // the round's member list (O(agents) each).
  bool tensorflow = false;
  // Open every session, measure the server's memory, close them: no phase runs (against a
  // bare gRPC server, the memory baseline: bare_session_server.cc).
  bool open_only = false;
  bool stream_beats = false;  // beat on the streams even where the service gives a ticket
};

// Sessions a shard holds by default: the scan above stays a small share of a completion.
constexpr int kAgentsPerProc = 3125;
constexpr int kMaxProcs = 32;

v1::AgentMessage JoinMessage(const Options& o, int index, const std::string& service_host) {
  v1::AgentMessage m;
  auto* j = m.mutable_join();
  j->set_protocol_version(crun::kProtocolVersion);
  j->set_run_id(o.jobs > 1 ? o.run_id + "-" + std::to_string(index % o.jobs) : o.run_id);
  j->set_service_host(service_host);
  auto* n = j->mutable_node();
  n->set_node_id("sim-" + std::to_string(index));
  n->set_host("sim-host-" + std::to_string(index));
  n->set_nproc(o.nproc);
  auto* s = j->mutable_settings();
  if (o.tensorflow) {
    crun::ContractSet contracts;
    contracts.Add(crun::Contract::kTensorflow);
    s->set_contracts(contracts.bits());
    const crun::PortLayout layout(contracts, o.nproc);
    for (int p = 0; p < layout.count(); ++p) n->add_ports(static_cast<std::uint32_t>(20000 + p));
  }
  s->set_min_nodes(o.agents / o.jobs);
  s->set_max_nodes(o.agents / o.jobs);
  s->set_max_restarts(1);
  s->set_join_timeout_ms(o.phase_timeout_ms);
  s->set_last_call_timeout_ms(1000);
  // Generous: the load generator shares two cores with the service.
  s->set_heartbeat_timeout_ms(std::max(30'000, 10 * o.heartbeat_ms));
  return m;
}

// One shard: the agents index % procs == shard, driven by the coordinator's commands.
//   (at start)      -> "ready OPENED" once the server opened every session (or the limit)
//   close           -> "errors N" once every session closed (--open-only)
//   form            -> "form REACHED T_NS BAD" then "ranks R R ..." (their group ranks, each
//                      job's offset by its index times its size), "store HOST:PORT" (its first
//                      agent's), then with --jobs "jobs T_NS ..." (each job's last assignment
//                      in this shard, 0 for none)
//   steady FROM END -> "steady SENT HEARD STREAMED" (SENT from FROM on, until END)
//   arm             -> "armed" (the failure's tallies reset)
//   await FAIL      -> "told REACHED T_NS" then "reformed REACHED T_NS WRONG_ROUND"
//                      (FAIL 1: this shard's first agent reports the failed worker first)
//   finish          -> "finish REACHED T_NS" then, once every session closed, "errors N"
int RunShard(const Options& o, int shard, int cmd_fd, int reply_fd) {
  const std::string service_host = o.endpoint.substr(0, o.endpoint.rfind(':'));
  const auto limit = std::chrono::milliseconds(o.phase_timeout_ms);
  const int channels_here = std::max(1, o.channels / o.procs);
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  std::vector<std::unique_ptr<v1::Rendezvous::Stub>> stubs;
  crun::agent::ChannelOptions co;
  co.keepalive_interval = std::chrono::milliseconds(o.keepalive_ms);
  co.keepalive_timeout = std::chrono::milliseconds(30'000);
  for (int c = 0; c < channels_here; ++c) {
    channels.push_back(crun::agent::MakeChannel(o.endpoint, co));
    if (!channels.back()->WaitForConnected(std::chrono::system_clock::now() +
                                           std::chrono::seconds(10))) {
      std::fprintf(stderr, "rdzv_loadgen: cannot connect to %s\n", o.endpoint.c_str());
      return 1;
    }
    stubs.push_back(v1::Rendezvous::NewStub(channels.back()));
  }

  Tally opened, assigned, told, finished;
  std::atomic<int> errors{0};
  std::vector<std::unique_ptr<Agent>> agents;
  for (int i = shard; i < o.agents; i += o.procs) agents.push_back(std::make_unique<Agent>());
  const int n = static_cast<int>(agents.size());
  opened.Reset(n);
  for (int k = 0; k < n; ++k) {
    Agent* a = agents[static_cast<std::size_t>(k)].get();
    a->index = shard + k * o.procs;
    auto on_message = [&, a](v1::ServiceMessage m) {
      if (m.has_assignment()) {
        if (a->round.load() < 0) {
          a->assignment = m.assignment();
          a->assigned_ns = NowNs();
        }
        a->round.store(static_cast<int>(m.assignment().round()));
        assigned.Hit();
      } else if (m.has_stop_and_rejoin()) {
        told.Hit();
        a->session->Send(JoinMessage(o, a->index, service_host));  // re-join at once
      } else if (m.has_finished()) {
        finished.Hit();
      } else if (m.has_refused()) {
        std::fprintf(stderr, "rdzv_loadgen: agent %d refused: %s\n", a->index,
                     m.refused().reason().c_str());
        errors.fetch_add(1);
      }
    };
    auto on_done = [&errors, index = a->index](const crun::Status& s) {
      if (!s.ok() && errors.fetch_add(1) == 0) {
        std::fprintf(stderr, "rdzv_loadgen: agent %d's session ended: %s\n", index,
                     s.message().c_str());  // the first of this shard's
      }
    };
    a->session =
        std::make_unique<SessionClient>(*stubs[static_cast<std::size_t>(k % channels_here)],
                                        on_message, on_done, crun::agent::CallOptions{},
                                        [&opened] { opened.Hit(); });
  }
  // Ready once the server opened every session: its memory then holds them all.
  WriteLine(reply_fd, "ready " + std::to_string(opened.Wait(limit)));
  // Heartbeats over UDP, as crun's agent sends them: one socket carries this shard's.
  std::optional<crun::agent::BeatSocket> beat_socket;
  for (auto& a : agents) {
    a->ticket = a->session->beat_ticket();
    if (!a->ticket || o.stream_beats || beat_socket) continue;
    auto socket = crun::agent::BeatSocket::Connect(a->session->peer(), a->ticket->port);
    if (!socket.ok()) {
      std::fprintf(stderr, "rdzv_loadgen: %s\n", socket.status().message().c_str());
      return 1;
    }
    beat_socket.emplace(std::move(socket).value());
  }

  Commands commands(cmd_fd);
  std::string cmd;
  for (std::istringstream in; commands.Next(cmd, in);) {
    if (cmd == "form") {
      assigned.Reset(n);
      for (auto& a : agents) a->session->Send(JoinMessage(o, a->index, service_host));
      const int reached = assigned.Wait(limit);
      const std::int64_t t = NowNs();
      int bad = 0;
      std::string ranks = "ranks";
      const int size = o.agents / o.jobs;
      std::vector<std::int64_t> job_ns(static_cast<std::size_t>(o.jobs), 0);
      const auto store_of = [](const v1::RoundAssignment& as) {
        return as.master_addr() + ":" + std::to_string(as.master_port());
      };
      const std::string store = store_of(agents.front()->assignment);
      for (auto& a : agents) {
        const auto& as = a->assignment;
        auto& last = job_ns[static_cast<std::size_t>(a->index % o.jobs)];
        last = std::max(last, a->assigned_ns);
        if (as.group_world_size() != size || as.world_size() != size * o.nproc ||
            as.base_rank() != as.group_rank() * o.nproc || (o.jobs == 1 && store_of(as) != store)) {
          if (bad++ == 0) {
            std::fprintf(stderr,
                         "rdzv_loadgen: agent %d got a bad assignment: group rank %d of %d, "
                         "base rank %d of %d\n",
                         a->index, as.group_rank(), as.group_world_size(), as.base_rank(),
                         as.world_size());
          }
        }
        ranks += " " + std::to_string((a->index % o.jobs) * size + as.group_rank());
      }
      WriteLine(reply_fd, "form " + std::to_string(reached) + " " + std::to_string(t) + " " +
                              std::to_string(bad));
      WriteLine(reply_fd, ranks);
      WriteLine(reply_fd, "store " + store);
      if (o.jobs > 1) {
        std::string times = "jobs";
        for (const auto ns : job_ns) times += " " + std::to_string(ns);
        WriteLine(reply_fd, times);
      }
    } else if (cmd == "steady") {
      std::int64_t from_ns = 0, end_ns = 0;
      in >> from_ns >> end_ns;
      const auto from = Clock::time_point(std::chrono::nanoseconds(from_ns));
      const auto end = Clock::time_point(std::chrono::nanoseconds(end_ns));
      std::uint64_t counted = 0;   // sent from `from` on
      std::uint64_t streamed = 0;  // of those, also on the stream (acks missing)
      // Heartbeats spread evenly over each interval from one thread.
      const auto gap = std::chrono::nanoseconds(std::chrono::milliseconds(o.heartbeat_ms)) / n;
      std::unordered_map<std::uint64_t, Agent*> by_session;
      for (auto& a : agents) {
        if (!a->ticket) continue;
        by_session[a->ticket->session] = a.get();
        // As a session just opened: the service's heartbeat_timeout is the default.
        a->watch.emplace(std::chrono::milliseconds(o.heartbeat_ms),
                         crun::rdzv::kDefaultHeartbeatTimeout, Clock::now());
      }
      const auto take_acks = [&] {
        beat_socket->Receive([&](std::string_view d) {
          const auto session = crun::rdzv::AckSession(d);
          const auto it = session ? by_session.find(*session) : by_session.end();
          if (it == by_session.end()) return;
          if (const auto ack = crun::rdzv::OpenAck(it->second->ticket->key, d)) {
            it->second->watch->Acked(ack->sequence);
          }
        });
      };
      std::uint64_t seq = 0;
      auto next = Clock::now();
      for (std::size_t i = 0; Clock::now() < end; i = (i + 1) % agents.size()) {
        v1::AgentMessage m;
        m.mutable_heartbeat()->set_sequence(++seq);
        Agent& a = *agents[i];
        const auto now = Clock::now();
        const bool measured = now >= from;
        if (beat_socket && a.ticket) {
          if (i % 16 == 0) take_acks();
          const bool stream_too = a.watch->StreamToo(now);
          if (!beat_socket->Send(*a.ticket, m.heartbeat()).ok()) errors.fetch_add(1);
          a.watch->Sent(seq, now);
          if (stream_too) {
            a.session->Send(std::move(m));  // as the agent: the acks say the service may not hear
            if (measured) ++streamed;
          }
        } else {
          a.session->Send(std::move(m));
        }
        if (measured) ++counted;
        next += gap;
        std::this_thread::sleep_until(next);  // pacing the load, not synchronisation
      }
      if (beat_socket) take_acks();
      std::size_t heard = 0;
      for (const auto& a : agents) heard += a->watch && a->watch->heard() ? 1 : 0;
      WriteLine(reply_fd, "steady " + std::to_string(counted) + " " + std::to_string(heard) + " " +
                              std::to_string(streamed));
    } else if (cmd == "arm") {
      told.Reset(n);
      assigned.Reset(n);
      WriteLine(reply_fd, "armed");
    } else if (cmd == "await") {
      int fail = 0;
      in >> fail;
      if (fail != 0) {
        v1::AgentMessage m;
        auto* r = m.mutable_workers_failed();
        r->set_host("sim-host-" + std::to_string(agents[0]->index));
        r->set_node_id("sim-" + std::to_string(agents[0]->index));
        auto* f = r->add_failures();
        f->set_rank(0);
        f->set_exit_code(1);
        f->set_message("rdzv_loadgen: simulated failure");
        agents[0]->session->Send(std::move(m));
      }
      crun::bench::ReplyRestarted(
          reply_fd, told, assigned, limit, agents, [](const Agent& a) { return a.round.load(); },
          [](const Agent& a) { return static_cast<int>(a.assignment.round()); });
    } else if (cmd == "close") {
      CloseAll(agents, limit);
      WriteLine(reply_fd, "errors " + std::to_string(errors.load()));
      return 0;
    } else if (cmd == "finish") {
      finished.Reset(n);
      for (auto& a : agents) {
        v1::AgentMessage m;
        m.mutable_workers_succeeded();
        a->session->Send(std::move(m));
      }
      const int reached = finished.Wait(limit);
      WriteLine(reply_fd, "finish " + std::to_string(reached) + " " + std::to_string(NowNs()));
      CloseAll(agents, limit);
      WriteLine(reply_fd, "errors " + std::to_string(errors.load()));
      return 0;
    }
  }
  return 1;  // the coordinator went away
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"crun rendezvous load generator"};
  auto* endpoint = app.add_option("--endpoint", o.endpoint, "host:port of the rendezvous service");
  app.add_option("--etcd", o.etcd,
                 "host:port,... of an etcd cluster: agents rendezvous through it instead")
      ->excludes(endpoint);
  app.add_option("--agents", o.agents)->check(CLI::Range(1, 1'000'000));
  app.add_option("--channels", o.channels, "HTTP/2 connections the agents share")
      ->check(CLI::Range(1, 4096));
  app.add_option("--procs", o.procs,
                 "processes the agents are spread over (default: one per 3,125 agents, up to 32)")
      ->check(CLI::Range(1, 256));
  app.add_option("--nproc", o.nproc)->check(CLI::Range(1, 1024));
  app.add_option("--heartbeat-ms", o.heartbeat_ms)->check(CLI::Range(10, 600'000));
  app.add_option("--keepalive-ms", o.keepalive_ms,
                 "each channel's HTTP/2 keepalive ping interval (a real agent pings at its "
                 "heartbeat interval, on a connection of its own: --channels = --agents)")
      ->check(CLI::Range(100, 600'000));
  app.add_option("--steady-ms", o.steady_ms)->check(CLI::Range(0, 600'000));
  app.add_option("--phase-timeout-ms", o.phase_timeout_ms)->check(CLI::Range(100, 3'600'000));
  app.add_option("--service-pid", o.service_pids,
                 "the service's process (repeat: the sum over etcd's members)");
  app.add_option("--run-id", o.run_id);
  app.add_option("--jobs", o.jobs,
                 "the agents form this many jobs at once (run ids RUN-0 ...; --agents must be a "
                 "multiple): each job's forming time is reported; no failure phase")
      ->check(CLI::Range(1, 100'000));
  app.add_flag("--stream-beats", o.stream_beats,
               "heartbeats on the gRPC streams even where the service takes them over UDP");
  app.add_flag("--open-only", o.open_only,
               "open the sessions, measure the server's memory, close them (no phases)");
  app.add_flag("--tensorflow", o.tensorflow,
               "--contract tensorflow: every assignment carries the round's member list");
  CLI11_PARSE(app, argc, argv);
  // The agents' log goes to stderr: spdlog's default logger writes to stdout, where this
  // program's JSON goes (one etcd warning there broke the bench's reading).
  spdlog::set_default_logger(spdlog::stderr_logger_mt("rdzv_loadgen"));
  const bool etcd = !o.etcd.empty();
  if (!etcd && o.endpoint.empty()) {
    std::fprintf(stderr, "rdzv_loadgen: --endpoint or --etcd is required\n");
    return 2;
  }
  if (etcd && (o.jobs != 1 || o.tensorflow || o.open_only)) {
    std::fprintf(stderr, "rdzv_loadgen: --etcd takes none of --jobs, --tensorflow, --open-only\n");
    return 2;
  }
  if (o.agents % o.jobs != 0) {
    std::fprintf(stderr, "rdzv_loadgen: --agents %d is not a multiple of --jobs %d\n", o.agents,
                 o.jobs);
    return 2;
  }
  if (o.procs == 0) {
    o.procs = std::clamp((o.agents + kAgentsPerProc - 1) / kAgentsPerProc, 1, kMaxProcs);
  }
  o.procs = std::min(o.procs, o.agents);
  const auto limit = std::chrono::milliseconds(o.phase_timeout_ms);
  // A shard answers within its phase's limit; the margin covers its checks and its pipe.
  const auto reply_deadline = [&] { return Clock::now() + limit + std::chrono::seconds(30); };
  nlohmann::json out{{"agents", o.agents}, {"procs", o.procs}, {"nproc", o.nproc}};
  if (etcd) {
    out["backend"] = "etcd-v3";
    out["etcd_members"] = std::count(o.etcd.begin(), o.etcd.end(), ',') + 1;
  } else {
    out["channels"] = o.channels;
  }
  const ProcStat idle = ReadProcs(o.service_pids);
  out["service_idle_rss_mib"] = idle.rss_mib;

  crun::bench::EtcdLoad etcd_load;
  etcd_load.endpoints = o.etcd;
  etcd_load.agents = o.agents;
  etcd_load.procs = o.procs;
  etcd_load.nproc = o.nproc;
  etcd_load.phase_timeout_ms = o.phase_timeout_ms;
  etcd_load.run_id = o.run_id;
  Shards shards;
  const bool started = shards.Start(o.procs, [&](int shard, int cmd, int reply) {
    return etcd ? crun::bench::RunEtcdShard(etcd_load, shard, cmd, reply)
                : RunShard(o, shard, cmd, reply);
  });
  if (!started) return 1;
  // etcd: the coordinator's own watch of a/job (its gRPC objects after the fork).
  std::unique_ptr<crun::bench::JobDocWatch> job_watch;
  if (etcd && !(job_watch = crun::bench::JobDocWatch::Open(etcd_load))) return 1;
  std::vector<std::int64_t> f;
  int opened = 0;
  for (std::size_t s = 0; s < shards.size(); ++s) {
    if (!shards.Expect(s, "ready", f, reply_deadline()) || f.empty()) return 1;
    opened += static_cast<int>(f[0]);
  }
  if (opened < o.agents) {
    std::fprintf(stderr, "rdzv_loadgen: only %d of %d sessions opened within %d ms\n", opened,
                 o.agents, o.phase_timeout_ms);
    return 1;
  }
  out["service_rss_connected_mib"] = ReadProcs(o.service_pids).rss_mib;
  out["loadgen_rss_ready_mib"] = ReadProcs(shards.pids()).rss_mib;
  // Every shard's closing "errors" line, then the figures: the exit status.
  const auto finish = [&] {
    std::int64_t errors = 0;
    for (std::size_t s = 0; s < shards.size(); ++s) {
      if (!shards.Expect(s, "errors", f, reply_deadline()) || f.empty()) return 1;
      errors += f[0];
    }
    shards.Stop();
    if (job_watch) job_watch->Record(out, o.agents);
    out["errors"] = errors;
    std::printf("%s\n", out.dump().c_str());
    return errors == 0 ? 0 : 1;
  };
  // Steady state: every shard heartbeats its agents until the same moment (against the bare
  // server too: its cost per message is the floor of the daemon's per heartbeat).
  // The first interval (2 s at most) is not measured: every agent beats once first, and where
  // the service takes datagrams its acks start coming. Through etcd the agents keep their
  // leases alive on their own: the shards only wait.
  const auto steady = [&]() -> bool {
    const std::int64_t warm_ms = etcd ? 0 : std::min(o.heartbeat_ms, 2000);
    const std::int64_t from_ns = NowNs() + warm_ms * 1'000'000;
    const std::int64_t end_ns = from_ns + std::int64_t{o.steady_ms} * 1'000'000;
    shards.SendAll("steady " + std::to_string(from_ns) + " " + std::to_string(end_ns));
    const auto t0 = Clock::time_point(std::chrono::nanoseconds(from_ns));
    std::this_thread::sleep_until(t0);  // the measured window's start, not synchronisation
    const ProcStat before = ReadProcs(o.service_pids);
    std::fprintf(stderr, "rdzv_loadgen: steady   measured from now\n");
    std::uint64_t seq = 0, heard = 0, streamed = 0;
    for (std::size_t s = 0; s < shards.size(); ++s) {
      if (!shards.Expect(s, "steady", f, reply_deadline()) || f.size() < 3) return false;
      seq += static_cast<std::uint64_t>(f[0]);
      heard += static_cast<std::uint64_t>(f[1]);
      streamed += static_cast<std::uint64_t>(f[2]);
    }
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    const ProcStat after = ReadProcs(o.service_pids);
    out["steady"] = {{"s", secs},
                     {"service_cpu_percent",
                      secs > 0 ? 100 * (after.cpu_s - before.cpu_s) / secs : 0},
                     {"service_rss_mib", after.rss_mib}};
    if (!etcd) {
      out["steady"]["heartbeats"] = seq;
      out["steady"]["heard_over_udp"] = heard;
      out["steady"]["streamed_too"] = streamed;
    }
    std::fprintf(stderr, "rdzv_loadgen: steady   %llu heartbeats in %.1f s: %s CPU %.1f%%\n",
                 static_cast<unsigned long long>(seq), secs, etcd ? "etcd" : "service",
                 out["steady"]["service_cpu_percent"].get<double>());
    return true;
  };
  if (o.open_only) {
    if (o.steady_ms > 0 && !steady()) return 1;
    shards.SendAll("close");
    return finish();
  }

  // Sends `cmd` to every shard and reads each one's `word` reply: the sum of the agents that
  // reached it, and the time the last of them did. Exits naming the phase when some did not.
  const auto gather = [&](const char* name, const std::string& word, std::int64_t& last_ns,
                          std::vector<std::int64_t>* extra) {
    int reached = 0;
    last_ns = 0;
    for (std::size_t s = 0; s < shards.size(); ++s) {
      if (!shards.Expect(s, word, f, reply_deadline()) || f.size() < 2) std::exit(1);
      reached += static_cast<int>(f[0]);
      last_ns = std::max(last_ns, f[1]);
      if (extra != nullptr) extra->push_back(f.size() > 2 ? f[2] : 0);
    }
    if (reached < o.agents) {
      std::fprintf(stderr, "rdzv_loadgen: phase '%s': only %d of %d agents within %d ms\n", name,
                   reached, o.agents, o.phase_timeout_ms);
      std::exit(1);
    }
  };
  // The service's and the agents' (the shards') CPU and memory, at a phase's start and end.
  struct Usage {
    ProcStat service, agents;
  };
  const auto usage = [&] { return Usage{ReadProcs(o.service_pids), ReadProcs(shards.pids())}; };
  const auto record = [&](const char* name, std::int64_t t0_ns, std::int64_t last_ns,
                          const Usage& before) {
    const Usage after = usage();
    const double ms = static_cast<double>(last_ns - t0_ns) / 1e6;
    const double service_cpu = after.service.cpu_s - before.service.cpu_s;
    // The agents' CPU: on one machine here, where a real job has one agent a machine.
    const double agents_cpu = after.agents.cpu_s - before.agents.cpu_s;
    out[name] = {{"ms", ms},
                 {"service_cpu_s", service_cpu},
                 {"agents_cpu_s", agents_cpu},
                 {"service_rss_mib", after.service.rss_mib}};
    std::fprintf(stderr,
                 "rdzv_loadgen: %-8s %d agents: %.1f ms (%s CPU %.3f s, RSS %.1f MiB; the "
                 "agents' CPU %.3f s)\n",
                 name, o.agents, ms, etcd ? "etcd" : "service", service_cpu, after.service.rss_mib,
                 agents_cpu);
  };

  // Form; the round is well formed: ranks a permutation, global ranks contiguous per node.
  {
    const Usage before = usage();
    const std::int64_t t0 = NowNs();
    shards.SendAll("form");
    int reached = 0, bad = 0;
    std::int64_t last = 0;
    std::vector<char> seen(static_cast<std::size_t>(o.agents), 0);
    std::vector<std::int64_t> job_ns(static_cast<std::size_t>(o.jobs), 0);
    std::vector<std::string> stores;  // each shard's (one job: the same everywhere)
    for (std::size_t s = 0; s < shards.size(); ++s) {
      if (!shards.Expect(s, "form", f, reply_deadline()) || f.size() < 3) return 1;
      reached += static_cast<int>(f[0]);
      last = std::max(last, f[1]);
      bad += static_cast<int>(f[2]);
      std::string ranks;
      if (!shards.Expect(s, "ranks", f, reply_deadline(), &ranks)) return 1;
      std::istringstream in(ranks);
      for (long r; in >> r;) {
        if (r < 0 || r >= o.agents || seen[static_cast<std::size_t>(r)]++ != 0) ++bad;
      }
      std::string store;
      if (!shards.Expect(s, "store", f, reply_deadline(), &store)) return 1;
      if (o.jobs == 1 && !stores.empty() && store != stores.front()) ++bad;
      stores.push_back(store);
      if (o.jobs > 1) {
        if (!shards.Expect(s, "jobs", f, reply_deadline()) || f.size() != job_ns.size()) return 1;
        for (std::size_t j = 0; j < job_ns.size(); ++j) job_ns[j] = std::max(job_ns[j], f[j]);
      }
    }
    if (reached < o.agents) {
      std::fprintf(stderr, "rdzv_loadgen: phase 'form': only %d of %d agents within %d ms\n",
                   reached, o.agents, o.phase_timeout_ms);
      return 1;
    }
    record("form", t0, last, before);
    if (bad != 0) {
      std::fprintf(stderr,
                   "rdzv_loadgen: %d agents got a bad assignment, a rank twice or another "
                   "store\n",
                   bad);
      return 1;
    }
    if (o.jobs > 1) {
      std::vector<double> ms;
      for (const auto ns : job_ns) ms.push_back(static_cast<double>(ns - t0) / 1e6);
      std::sort(ms.begin(), ms.end());
      out["jobs"] = {{"count", o.jobs},
                     {"agents_each", o.agents / o.jobs},
                     {"form_ms_min", ms.front()},
                     {"form_ms_median", ms[ms.size() / 2]},
                     {"form_ms_max", ms.back()}};
      std::fprintf(stderr,
                   "rdzv_loadgen: %d jobs of %d: each formed in %.1f ms (median), "
                   "%.1f to %.1f ms\n",
                   o.jobs, o.agents / o.jobs, ms[ms.size() / 2], ms.front(), ms.back());
    }
  }

  if (o.steady_ms > 0 && !steady()) return 1;

  // A worker fails on one agent (shard 0's first, agent 0): everyone is told, re-joins, and
  // holds the next round. With several jobs, a failure concerns one: none.
  if (o.jobs == 1) {
    shards.SendAll("arm");
    for (std::size_t s = 0; s < shards.size(); ++s) {
      if (!shards.Expect(s, "armed", f, reply_deadline())) return 1;
    }
    const Usage before = usage();
    const std::int64_t t0 = NowNs();
    shards.Send(0, "await 1");
    for (std::size_t s = 1; s < shards.size(); ++s) shards.Send(s, "await 0");
    std::int64_t last = 0;
    gather("told", "told", last, nullptr);
    record("told", t0, last, before);
    std::vector<std::int64_t> wrong;
    gather("reformed", "reformed", last, &wrong);
    const double reformed_ms = static_cast<double>(last - t0) / 1e6;
    out["reformed"] = {{"ms", reformed_ms}};
    std::fprintf(stderr, "rdzv_loadgen: failure -> all re-assigned: %.1f ms\n", reformed_ms);
    for (const auto w : wrong) {
      if (w != 0) return 1;  // the shard named the agent
    }
  }

  {
    const Usage before = usage();
    const std::int64_t t0 = NowNs();
    shards.SendAll("finish");
    std::int64_t last = 0;
    gather("finish", "finish", last, nullptr);
    record("finish", t0, last, before);
  }
  out["service_hwm_mib"] = ReadProcs(o.service_pids).hwm_mib;
  out["loadgen_rss_mib"] = ReadProcs(shards.pids()).rss_mib;
  return finish();
}
