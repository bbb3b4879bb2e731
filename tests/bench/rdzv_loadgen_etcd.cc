#include "tests/bench/rdzv_loadgen_etcd.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include <unistd.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "agent/failures/report_format.h"
#include "agent/rendezvous/etcd_rendezvous.h"
#include "rendezvous/etcd/client.h"
#include "rendezvous/etcd/job.h"
#include "tests/bench/loadgen_util.h"

namespace crun::bench {
namespace {

using Clock = std::chrono::steady_clock;
using Millis = std::chrono::milliseconds;
namespace asio = boost::asio;

struct SimAgent final : agent::RendezvousEvents {
  int index = 0;
  std::unique_ptr<agent::Rendezvous> rdzv;
  Tally* assigned = nullptr;
  Tally* told = nullptr;
  Tally* finished = nullptr;
  std::atomic<int>* errors = nullptr;
  std::atomic<int> round{-1};
  agent::GroupAssignment first;  // of the first round, for the checks
  bool has_first = false;

  void OnAssignment(const agent::GroupAssignment& g) override {
    if (!has_first) {
      first = g;
      has_first = true;
    }
    round.store(g.round);
    assigned->Hit();
  }
  void OnStopAndRejoin(const std::string&, bool) override {
    told->Hit();
    rdzv->Join({});  // re-join at once
  }
  void OnFinished(const agent::JobOutcome& out) override {
    if (!out.success) {
      std::fprintf(stderr, "rdzv_loadgen: agent %d: the job ended: %s\n", index,
                   out.reason.c_str());
      errors->fetch_add(1);
    }
    finished->Hit();
  }
  void OnStacksRequest(std::uint64_t, const std::string&) override {}
};

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string part; std::getline(in, part, ',');) {
    if (!part.empty()) out.push_back(part);
  }
  return out;
}

// Counts the decider's writes of the job document and their sizes, from a watch of its own.
struct JobWatch {
  std::mutex mu;
  int writes = 0;
  std::size_t max_bytes = 0;
  std::size_t total_bytes = 0;
};

}  // namespace

int RunEtcdLoad(const EtcdLoad& load) {
  spdlog::set_level(spdlog::level::warn);  // a thousand agents' "round 0 (group rank 7)" lines
  const auto limit = Millis(load.phase_timeout_ms);
  const auto endpoints = Split(load.endpoints);
  nlohmann::json out{{"agents", load.agents},
                     {"nproc", load.nproc},
                     {"etcd_members", endpoints.size()},
                     {"backend", "etcd-v3"}};
  out["service_idle_rss_mib"] = ReadProcs(load.service_pids).rss_mib;

  etcd::ClientOptions co;
  co.endpoints = endpoints;
  auto observer = etcd::Client::Connect(co, Clock::now() + Millis(10'000));
  if (!observer.ok()) {
    std::fprintf(stderr, "rdzv_loadgen: %s\n", observer.status().message().c_str());
    return 1;
  }
  const etcd::Keys keys(etcd::kDefaultRoot, load.run_id);
  auto existing = (*observer)->GetPrefix(keys.prefix, Clock::now() + Millis(10'000));
  if (!existing.ok() || !existing->kvs.empty()) {
    std::fprintf(stderr, "rdzv_loadgen: run '%s' already has keys under %s: use a fresh run id\n",
                 load.run_id.c_str(), keys.prefix.c_str());
    return 1;
  }
  JobWatch jobs;
  auto job_watch = (*observer)->WatchPrefix(
      keys.job(), existing->revision + 1,
      [&jobs](std::vector<etcd::WatchEvent> events, std::int64_t) {
        std::lock_guard lock(jobs.mu);
        for (const auto& e : events) {
          if (e.deleted) continue;
          ++jobs.writes;
          jobs.max_bytes = std::max(jobs.max_bytes, e.kv.value.size());
          jobs.total_bytes += e.kv.value.size();
        }
      },
      [](const Status& s) {
        std::fprintf(stderr, "rdzv_loadgen: the job watch ended: %s\n", s.message().c_str());
      },
      Millis(60'000));

  asio::io_context io;
  auto work = asio::make_work_guard(io);
  std::vector<std::thread> loop;
  for (int t = 0; t < 2; ++t) loop.emplace_back([&io] { io.run(); });

  Tally assigned, told, finished;
  std::atomic<int> errors{0};
  std::vector<std::unique_ptr<SimAgent>> agents;
  for (int i = 0; i < load.agents; ++i) {
    auto a = std::make_unique<SimAgent>();
    a->index = i;
    a->assigned = &assigned;
    a->told = &told;
    a->finished = &finished;
    a->errors = &errors;
    agent::EtcdRendezvousOptions o;
    o.endpoints = endpoints;
    o.run_id = load.run_id;
    o.node_id = "sim-" + std::to_string(i);
    o.host = "sim-host-" + std::to_string(i);
    o.addresses = {"127.0.0.1"};
    o.advertise_addr = "127.0.0.1";
    o.nproc = load.nproc;
    o.settings.min_nodes = load.agents;
    o.settings.max_nodes = load.agents;
    o.settings.max_restarts = 1;
    o.settings.join_timeout = limit;
    o.settings.last_call_timeout = Millis(1'000);
    // Generous (the lease's TTL): the agents share two cores with etcd.
    o.settings.heartbeat_timeout = Millis(30'000);
    o.connect_timeout = limit;
    o.outage_timeout = limit;
    a->rdzv = agent::MakeEtcdRendezvous(io, o);
    agents.push_back(std::move(a));
  }
  const auto self = ReadProc(static_cast<int>(::getpid()));

  auto phase = [&](const char* name, Tally& tally, auto&& start) {
    tally.Reset(load.agents);
    const ProcStat before = ReadProcs(load.service_pids);
    const ProcStat agents_before = ReadProc(static_cast<int>(::getpid()));
    const auto t0 = Clock::now();
    start();
    const int reached = tally.Wait(limit);
    const double ms = std::chrono::duration<double, Millis::period>(Clock::now() - t0).count();
    const ProcStat after = ReadProcs(load.service_pids);
    const double agents_cpu_s = ReadProc(static_cast<int>(::getpid())).cpu_s - agents_before.cpu_s;
    if (reached < load.agents) {
      std::fprintf(stderr, "rdzv_loadgen: phase '%s': only %d of %d agents within %d ms\n", name,
                   reached, load.agents, load.phase_timeout_ms);
      std::fflush(stderr);
      std::_Exit(1);  // a thousand agents' threads are not worth unwinding here
    }
    // The agents' CPU: on one machine here, where a real job has one agent a machine.
    out[name] = {{"ms", ms},
                 {"service_cpu_s", after.cpu_s - before.cpu_s},
                 {"agents_cpu_s", agents_cpu_s},
                 {"service_rss_mib", after.rss_mib}};
    std::fprintf(stderr,
                 "rdzv_loadgen: %-8s %d agents: %.1f ms (etcd CPU %.3f s, RSS %.1f MiB; the "
                 "agents' CPU %.3f s)\n",
                 name, load.agents, ms, after.cpu_s - before.cpu_s, after.rss_mib, agents_cpu_s);
  };

  // Every agent starts (connects, takes its lease, writes its node key, reads the prefix,
  // watches it) and joins at once, as crun does.
  phase("form", assigned, [&] {
    for (auto& a : agents) {
      a->rdzv->Start(a.get());
      a->rdzv->Join({});
    }
  });
  {
    std::vector<int> by_rank(static_cast<std::size_t>(load.agents), -1);
    std::set<std::string> stores;
    for (auto& a : agents) {
      const auto& g = a->first;
      const auto r = static_cast<std::size_t>(g.group_rank);
      if (g.group_world_size != load.agents || r >= by_rank.size() || by_rank[r] != -1 ||
          g.world_size != load.agents * load.nproc || g.base_rank != g.group_rank * load.nproc) {
        std::fprintf(stderr, "rdzv_loadgen: agent %d got a bad assignment (group rank %d of %d)\n",
                     a->index, g.group_rank, g.group_world_size);
        std::_Exit(1);
      }
      by_rank[r] = a->index;
      stores.insert(g.master_addr + ":" + std::to_string(g.master_port));
    }
    if (stores.size() != 1) {
      std::fprintf(stderr, "rdzv_loadgen: the agents were given %zu stores\n", stores.size());
      std::_Exit(1);
    }
  }

  // Steady state: the agents keep their leases alive (TTL / 3) and nothing else happens.
  {
    const ProcStat before = ReadProcs(load.service_pids);
    const auto t0 = Clock::now();
    std::this_thread::sleep_for(Millis(load.steady_ms));  // measuring an interval
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    const ProcStat after = ReadProcs(load.service_pids);
    out["steady"] = {{"s", s},
                     {"service_cpu_percent", s > 0 ? 100 * (after.cpu_s - before.cpu_s) / s : 0},
                     {"service_rss_mib", after.rss_mib}};
    std::fprintf(stderr, "rdzv_loadgen: steady   %.1f s: etcd CPU %.1f%%\n", s,
                 out["steady"]["service_cpu_percent"].get<double>());
  }

  const auto failed_at = Clock::now();
  phase("told", told, [&] {
    assigned.Reset(load.agents);
    crun::report::FailureReport r;
    r.host = "sim-host-0";
    auto& f = r.failures.emplace_back();
    f.exit_code = 1;
    f.time_unix_ms = agent::NowUnixMs();
    agents[0]->rdzv->ReportFailure(r);
  });
  if (const int n = assigned.Wait(limit); n < load.agents) {
    std::fprintf(stderr, "rdzv_loadgen: only %d of %d agents re-assigned\n", n, load.agents);
    std::_Exit(1);
  }
  const double reformed_ms =
      std::chrono::duration<double, Millis::period>(Clock::now() - failed_at).count();
  out["reformed"] = {{"ms", reformed_ms}};
  std::fprintf(stderr, "rdzv_loadgen: failure -> all re-assigned: %.1f ms\n", reformed_ms);
  for (auto& a : agents) {
    if (a->round.load() != a->first.round + 1) {
      std::fprintf(stderr, "rdzv_loadgen: agent %d is in round %d after the restart\n", a->index,
                   a->round.load());
      std::_Exit(1);
    }
  }

  phase("finish", finished, [&] {
    for (auto& a : agents) a->rdzv->ReportSuccess();
  });
  out["service_hwm_mib"] = ReadProcs(load.service_pids).hwm_mib;
  out["loadgen_rss_mib"] = ReadProc(static_cast<int>(::getpid())).rss_mib;
  out["loadgen_rss_before_start_mib"] = self.rss_mib;
  {
    std::lock_guard lock(jobs.mu);
    out["job_writes"] = jobs.writes;
    out["job_max_bytes"] = jobs.max_bytes;
    // Every agent's watch receives every write of the document.
    out["job_bytes_to_watchers"] = jobs.total_bytes * static_cast<std::size_t>(load.agents);
  }
  job_watch.reset();

  // Each agent leaves (revokes its lease) from a few threads at once.
  {
    std::atomic<std::size_t> next{0};
    std::vector<std::thread> leavers;
    for (int t = 0; t < 8; ++t) {
      leavers.emplace_back([&] {
        for (std::size_t i; (i = next.fetch_add(1)) < agents.size();) agents[i]->rdzv.reset();
      });
    }
    for (auto& t : leavers) t.join();
  }
  work.reset();
  for (auto& t : loop) t.join();
  out["errors"] = errors.load();
  std::printf("%s\n", out.dump().c_str());
  return errors.load() == 0 ? 0 : 1;
}

}  // namespace crun::bench
