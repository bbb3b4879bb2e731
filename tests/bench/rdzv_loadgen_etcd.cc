#include "tests/bench/rdzv_loadgen_etcd.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <sstream>
#include <thread>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <spdlog/spdlog.h>

#include "agent/failures/report_format.h"
#include "agent/rendezvous/etcd_rendezvous.h"
#include "rendezvous/etcd/job.h"
#include "tests/bench/loadgen_shards.h"
#include "tests/bench/loadgen_util.h"

namespace crun::bench {
namespace {

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
  std::atomic<bool> has_first{false};

  void OnAssignment(const agent::GroupAssignment& g) override {
    if (!has_first.load()) {
      first = g;
      has_first.store(true);
    }
    round.store(g.round);
    assigned->Hit();
  }
  void OnStopAndRejoin(const crun::agent::StopNotice&) override {
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

}  // namespace

int RunEtcdShard(const EtcdLoad& load, int shard, int cmd_fd, int reply_fd) {
  spdlog::set_level(spdlog::level::warn);  // a thousand agents' "round 0 (group rank 7)" lines
  const auto limit = Millis(load.phase_timeout_ms);
  const auto endpoints = Split(load.endpoints);
  asio::io_context io;
  auto work = asio::make_work_guard(io);
  std::vector<std::thread> loop;
  for (int t = 0; t < 2; ++t) loop.emplace_back([&io] { io.run(); });

  Tally assigned, told, finished;
  std::atomic<int> errors{0};
  std::vector<std::unique_ptr<SimAgent>> agents;
  for (int i = shard; i < load.agents; i += load.procs) {
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
  const int n = static_cast<int>(agents.size());
  // Each agent leaves (revokes its lease), from a few threads at once.
  const auto leave = [&] {
    std::atomic<std::size_t> next{0};
    std::vector<std::thread> leavers;
    for (int t = 0; t < 8; ++t) {
      leavers.emplace_back([&] {
        for (std::size_t i; (i = next.fetch_add(1)) < agents.size();) agents[i]->rdzv.reset();
      });
    }
    for (auto& t : leavers) t.join();
    work.reset();
    for (auto& t : loop) t.join();
  };
  WriteLine(reply_fd, "ready " + std::to_string(n));

  Commands commands(cmd_fd);
  std::string cmd;
  for (std::istringstream in; commands.Next(cmd, in);) {
    if (cmd == "form") {
      // Every agent starts (connects, takes its lease, writes its node key with its join,
      // reads what it needs, watches the prefix) and joins at once, as crun does.
      assigned.Reset(n);
      for (auto& a : agents) {
        a->rdzv->Start(a.get());
        a->rdzv->Join({});
      }
      const int reached = assigned.Wait(limit);
      const std::int64_t t = NowNs();
      int bad = 0;
      std::string ranks = "ranks";
      const agent::GroupAssignment* store_of = nullptr;
      for (auto& a : agents) {
        if (!a->has_first.load()) continue;  // counted as not reached
        const auto& g = a->first;
        const bool other_store = store_of != nullptr && (g.master_addr != store_of->master_addr ||
                                                         g.master_port != store_of->master_port);
        if (store_of == nullptr) store_of = &g;
        if (g.group_world_size != load.agents || g.world_size != load.agents * load.nproc ||
            g.base_rank != g.group_rank * load.nproc || other_store) {
          if (bad++ == 0) {
            std::fprintf(stderr,
                         "rdzv_loadgen: agent %d got a bad assignment: group rank %d of %d, "
                         "base rank %d of %d, store %s:%d\n",
                         a->index, g.group_rank, g.group_world_size, g.base_rank, g.world_size,
                         g.master_addr.c_str(), g.master_port);
          }
        }
        ranks += " " + std::to_string(g.group_rank);
      }
      WriteLine(reply_fd, "form " + std::to_string(reached) + " " + std::to_string(t) + " " +
                              std::to_string(bad));
      WriteLine(reply_fd, ranks);
      WriteLine(reply_fd,
                "store " + (store_of == nullptr ? std::string("-")
                                                : store_of->master_addr + ":" +
                                                      std::to_string(store_of->master_port)));
    } else if (cmd == "steady") {
      // The agents keep their leases alive (TTL / 3) on their own: nothing to send.
      std::int64_t from_ns = 0, end_ns = 0;
      in >> from_ns >> end_ns;
      std::this_thread::sleep_until(LoadClock::time_point(std::chrono::nanoseconds(end_ns)));
      WriteLine(reply_fd, "steady 0 0 0");
    } else if (cmd == "arm") {
      told.Reset(n);
      assigned.Reset(n);
      WriteLine(reply_fd, "armed");
    } else if (cmd == "await") {
      int fail = 0;
      in >> fail;
      if (fail != 0) {
        crun::report::FailureReport r;
        r.host = "sim-host-" + std::to_string(agents[0]->index);
        auto& f = r.failures.emplace_back();
        f.exit_code = 1;
        f.time_unix_ms = agent::NowUnixMs();
        r.node_id = agents[0]->rdzv->node_id();
        agents[0]->rdzv->ReportFailure(r);
      }
      ReplyRestarted(
          reply_fd, told, assigned, limit, agents, [](const SimAgent& a) { return a.round.load(); },
          [](const SimAgent& a) { return a.first.round; });
    } else if (cmd == "finish") {
      finished.Reset(n);
      for (auto& a : agents) a->rdzv->ReportSuccess();
      const int reached = finished.Wait(limit);
      WriteLine(reply_fd, "finish " + std::to_string(reached) + " " + std::to_string(NowNs()));
      leave();
      WriteLine(reply_fd, "errors " + std::to_string(errors.load()));
      return 0;
    }
  }
  std::_Exit(1);  // the coordinator went away: a thousand agents' threads are not worth unwinding
}

std::unique_ptr<JobDocWatch> JobDocWatch::Open(const EtcdLoad& load) {
  const auto deadline = [] { return LoadClock::now() + Millis(10'000); };
  etcd::ClientOptions co;
  co.endpoints = Split(load.endpoints);
  auto client = etcd::Client::Connect(co, deadline());
  if (!client.ok()) {
    std::fprintf(stderr, "rdzv_loadgen: %s\n", client.status().message().c_str());
    return nullptr;
  }
  const etcd::Keys keys(etcd::kDefaultRoot, load.run_id);
  auto existing = (*client)->GetPrefix(keys.prefix, deadline());
  if (!existing.ok()) {
    std::fprintf(stderr, "rdzv_loadgen: %s\n", existing.status().message().c_str());
    return nullptr;
  }
  if (!existing->kvs.empty()) {
    std::fprintf(stderr, "rdzv_loadgen: run '%s' already has keys under %s: use a fresh run id\n",
                 load.run_id.c_str(), keys.prefix.c_str());
    return nullptr;
  }
  std::unique_ptr<JobDocWatch> w(new JobDocWatch());
  w->client_ = std::move(client).value();
  JobDocWatch* self = w.get();
  w->watch_ = w->client_->WatchPrefix(
      keys.job(), existing->revision + 1,
      [self](std::vector<etcd::WatchEvent> events, std::int64_t) {
        std::lock_guard lock(self->mu_);
        for (const auto& e : events) {
          if (e.deleted) continue;
          ++self->writes_;
          self->max_bytes_ = std::max(self->max_bytes_, e.kv.value.size());
          self->total_bytes_ += e.kv.value.size();
        }
      },
      [](const Status& s) {
        std::fprintf(stderr, "rdzv_loadgen: the job watch ended: %s\n", s.message().c_str());
      },
      Millis(60'000));
  return w;
}

JobDocWatch::~JobDocWatch() = default;

void JobDocWatch::Record(nlohmann::json& out, int agents) {
  watch_.reset();
  std::lock_guard lock(mu_);
  out["job_writes"] = writes_;
  out["job_max_bytes"] = max_bytes_;
  out["job_bytes_to_watchers"] = total_bytes_ * static_cast<std::size_t>(agents);
}

}  // namespace crun::bench
