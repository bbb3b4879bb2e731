// Rendezvous load generator: N simulated agents, each a real crun.v1 Session stream (the
// agent's own SessionClient), spread over a few HTTP/2 connections, against one running
// rendezvous service. Phases, each timed and checked:
//
//   form     every agent sends Join (min = max = N): until every agent holds its assignment
//            (group ranks a permutation of 0..N-1, base ranks contiguous, one store)
//   steady   every agent heartbeats each --heartbeat-ms for --steady-ms: the service's CPU
//   failure  one agent reports a failed worker: until every agent was told to stop and
//            re-join, then (each re-joins at once) until every agent holds the next round
//   finish   every agent reports success: until every agent got the outcome
//
// With --service-pid, the service's CPU time (user + system, /proc/PID/stat) over each phase
// and its RSS are measured too. Prints one JSON object. Exit 1 when a phase does not complete
// within --phase-timeout-ms, naming it and how many agents were still missing.
//
//   rdzv_loadgen --endpoint 127.0.0.1:29400 --agents 10000 [--channels 16] [--nproc 8]
//                [--service-pid PID] [--run-id bench]
//
// With --etcd host:port,... instead of --endpoint, the same phases run through etcd, each
// agent the agent's own etcd rendezvous (rdzv_loadgen_etcd.h); --service-pid once per member.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include "agent/rendezvous/session_client.h"
#include "tests/bench/loadgen_util.h"
#include "tests/bench/rdzv_loadgen_etcd.h"

namespace {

using Clock = std::chrono::steady_clock;
using crun::agent::SessionClient;
using crun::bench::ProcStat;
using crun::bench::ReadProcs;
using crun::bench::Tally;
namespace v1 = crun::v1;

struct Agent {
  int index = 0;
  std::unique_ptr<SessionClient> session;
  std::atomic<int> round{-1};
  v1::RoundAssignment assignment;  // of the first round, for the checks
};

struct Options {
  std::string endpoint;
  int agents = 1000;
  int channels = 16;
  int nproc = 8;
  int heartbeat_ms = 1000;
  int steady_ms = 3000;
  int phase_timeout_ms = 120'000;
  std::vector<int> service_pids;
  std::string run_id = "bench";
  std::string etcd;  // endpoints: the etcd mode (rdzv_loadgen_etcd.h)
};

v1::AgentMessage JoinMessage(const Options& o, int index, const std::string& service_host) {
  v1::AgentMessage m;
  auto* j = m.mutable_join();
  j->set_protocol_version(crun::kProtocolVersion);
  j->set_run_id(o.run_id);
  j->set_service_host(service_host);
  auto* n = j->mutable_node();
  n->set_node_id("sim-" + std::to_string(index));
  n->set_host("sim-host-" + std::to_string(index));
  n->set_nproc(o.nproc);
  auto* s = j->mutable_settings();
  s->set_min_nodes(o.agents);
  s->set_max_nodes(o.agents);
  s->set_max_restarts(1);
  s->set_join_timeout_ms(o.phase_timeout_ms);
  s->set_last_call_timeout_ms(1000);
  // Generous: the load generator shares two cores with the service.
  s->set_heartbeat_timeout_ms(std::max(30'000, 10 * o.heartbeat_ms));
  return m;
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
  app.add_option("--nproc", o.nproc)->check(CLI::Range(1, 1024));
  app.add_option("--heartbeat-ms", o.heartbeat_ms)->check(CLI::Range(10, 60'000));
  app.add_option("--steady-ms", o.steady_ms)->check(CLI::Range(0, 600'000));
  app.add_option("--phase-timeout-ms", o.phase_timeout_ms)->check(CLI::Range(100, 3'600'000));
  app.add_option("--service-pid", o.service_pids,
                 "the service's process (repeat: the sum over etcd's members)");
  app.add_option("--run-id", o.run_id);
  CLI11_PARSE(app, argc, argv);
  // The agents' log goes to stderr: spdlog's default logger writes to stdout, where this
  // program's JSON goes (one etcd warning there broke the bench's reading).
  spdlog::set_default_logger(spdlog::stderr_logger_mt("rdzv_loadgen"));
  if (!o.etcd.empty()) {
    crun::bench::EtcdLoad e;
    e.endpoints = o.etcd;
    e.agents = o.agents;
    e.nproc = o.nproc;
    e.steady_ms = o.steady_ms;
    e.phase_timeout_ms = o.phase_timeout_ms;
    e.service_pids = o.service_pids;
    e.run_id = o.run_id;
    return crun::bench::RunEtcdLoad(e);
  }
  if (o.endpoint.empty()) {
    std::fprintf(stderr, "rdzv_loadgen: --endpoint or --etcd is required\n");
    return 2;
  }
  const std::string service_host = o.endpoint.substr(0, o.endpoint.rfind(':'));
  const auto limit = std::chrono::milliseconds(o.phase_timeout_ms);
  nlohmann::json out{{"agents", o.agents}, {"channels", o.channels}, {"nproc", o.nproc}};
  const ProcStat idle = ReadProcs(o.service_pids);
  out["service_idle_rss_mib"] = idle.rss_mib;

  std::vector<std::shared_ptr<grpc::Channel>> channels;
  std::vector<std::unique_ptr<v1::Rendezvous::Stub>> stubs;
  crun::agent::ChannelOptions co;
  co.keepalive_interval = std::chrono::milliseconds(10'000);
  co.keepalive_timeout = std::chrono::milliseconds(30'000);
  for (int c = 0; c < o.channels; ++c) {
    channels.push_back(crun::agent::MakeChannel(o.endpoint, co));
    if (!channels.back()->WaitForConnected(std::chrono::system_clock::now() +
                                           std::chrono::seconds(10))) {
      std::fprintf(stderr, "rdzv_loadgen: cannot connect to %s\n", o.endpoint.c_str());
      return 1;
    }
    stubs.push_back(v1::Rendezvous::NewStub(channels.back()));
  }

  Tally assigned, told, finished;
  std::atomic<int> errors{0};
  std::vector<std::unique_ptr<Agent>> agents;
  agents.reserve(static_cast<std::size_t>(o.agents));
  for (int i = 0; i < o.agents; ++i) agents.push_back(std::make_unique<Agent>());
  for (int i = 0; i < o.agents; ++i) {
    Agent* a = agents[static_cast<std::size_t>(i)].get();
    a->index = i;
    auto on_message = [&, a](v1::ServiceMessage m) {
      if (m.has_assignment()) {
        if (a->round.load() < 0) a->assignment = m.assignment();
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
    auto on_done = [&errors](const crun::Status& s) {
      if (!s.ok()) errors.fetch_add(1);
    };
    a->session = std::make_unique<SessionClient>(*stubs[static_cast<std::size_t>(i % o.channels)],
                                                 on_message, on_done);
  }
  out["service_rss_connected_mib"] = ReadProcs(o.service_pids).rss_mib;

  auto phase = [&](const char* name, Tally& tally, auto&& start) {
    tally.Reset(o.agents);
    const ProcStat before = ReadProcs(o.service_pids);
    const auto t0 = Clock::now();
    start();
    const int reached = tally.Wait(limit);
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    const ProcStat after = ReadProcs(o.service_pids);
    if (reached < o.agents) {
      std::fprintf(stderr, "rdzv_loadgen: phase '%s': only %d of %d agents within %d ms\n", name,
                   reached, o.agents, o.phase_timeout_ms);
      std::exit(1);
    }
    out[name] = {{"ms", ms},
                 {"service_cpu_s", after.cpu_s - before.cpu_s},
                 {"service_rss_mib", after.rss_mib}};
    std::fprintf(stderr,
                 "rdzv_loadgen: %-8s %d agents: %.1f ms (service CPU %.3f s, RSS %.1f MiB)\n", name,
                 o.agents, ms, after.cpu_s - before.cpu_s, after.rss_mib);
  };

  phase("form", assigned, [&] {
    for (auto& a : agents) a->session->Send(JoinMessage(o, a->index, service_host));
  });
  // The round is well formed: ranks a permutation, global ranks contiguous per node.
  {
    std::vector<int> by_rank(static_cast<std::size_t>(o.agents), -1);
    for (auto& a : agents) {
      const auto& as = a->assignment;
      const auto r = static_cast<std::size_t>(as.group_rank());
      if (as.group_world_size() != o.agents || r >= by_rank.size() || by_rank[r] != -1 ||
          as.world_size() != o.agents * o.nproc || as.base_rank() != as.group_rank() * o.nproc) {
        std::fprintf(stderr,
                     "rdzv_loadgen: agent %d got a bad assignment: group rank %d of %d, "
                     "base rank %d of %d\n",
                     a->index, as.group_rank(), as.group_world_size(), as.base_rank(),
                     as.world_size());
        return 1;
      }
      by_rank[r] = a->index;
    }
  }

  // Steady state: heartbeats spread evenly over each interval from one thread.
  {
    const ProcStat before = ReadProcs(o.service_pids);
    const auto t0 = Clock::now();
    const auto end = t0 + std::chrono::milliseconds(o.steady_ms);
    const auto gap = std::chrono::nanoseconds(std::chrono::milliseconds(o.heartbeat_ms)) / o.agents;
    std::uint64_t seq = 0;
    auto next = t0;
    for (std::size_t i = 0; Clock::now() < end; i = (i + 1) % agents.size()) {
      v1::AgentMessage m;
      m.mutable_heartbeat()->set_sequence(++seq);
      agents[i]->session->Send(std::move(m));
      next += gap;
      std::this_thread::sleep_until(next);  // pacing the load, not synchronisation
    }
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    const ProcStat after = ReadProcs(o.service_pids);
    out["steady"] = {{"s", s},
                     {"heartbeats", seq},
                     {"service_cpu_percent", s > 0 ? 100 * (after.cpu_s - before.cpu_s) / s : 0},
                     {"service_rss_mib", after.rss_mib}};
    std::fprintf(stderr, "rdzv_loadgen: steady   %llu heartbeats in %.1f s: service CPU %.1f%%\n",
                 static_cast<unsigned long long>(seq), s,
                 out["steady"]["service_cpu_percent"].get<double>());
  }

  // A worker fails on one agent: everyone is told, re-joins, and holds the next round.
  const auto failed_at = Clock::now();
  phase("told", told, [&] {
    assigned.Reset(o.agents);
    v1::AgentMessage m;
    auto* r = m.mutable_workers_failed();
    r->set_host("sim-host-0");
    r->set_node_id("sim-0");
    auto* f = r->add_failures();
    f->set_rank(0);
    f->set_exit_code(1);
    f->set_message("rdzv_loadgen: simulated failure");
    agents[0]->session->Send(std::move(m));
  });
  if (const int n = assigned.Wait(limit); n < o.agents) {
    std::fprintf(stderr, "rdzv_loadgen: only %d of %d agents re-assigned\n", n, o.agents);
    return 1;
  }
  const double reformed_ms =
      std::chrono::duration<double, std::milli>(Clock::now() - failed_at).count();
  out["reformed"] = {{"ms", reformed_ms}};
  std::fprintf(stderr, "rdzv_loadgen: failure -> all re-assigned: %.1f ms\n", reformed_ms);
  for (auto& a : agents) {
    if (a->round.load() != static_cast<int>(a->assignment.round()) + 1) {
      std::fprintf(stderr, "rdzv_loadgen: agent %d is in round %d after the restart\n", a->index,
                   a->round.load());
      return 1;
    }
  }

  phase("finish", finished, [&] {
    for (auto& a : agents) {
      v1::AgentMessage m;
      m.mutable_workers_succeeded();
      a->session->Send(std::move(m));
    }
  });
  out["service_hwm_mib"] = ReadProcs(o.service_pids).hwm_mib;
  for (auto& a : agents) a->session->Close(std::chrono::milliseconds(2000));
  out["errors"] = errors.load();
  std::printf("%s\n", out.dump().c_str());
  return errors.load() == 0 ? 0 : 1;
}
