// The agent's features, in the order their hooks are called. Adding one: its file in this
// folder (a JobFeature and its factory) and its line here.
#include "agent/features/job_feature.h"

namespace crun::agent {

std::unique_ptr<JobFeature> MakeWarmStart(AgentView&);        // warm_start.cc
std::unique_ptr<JobFeature> MakeFileTimer(AgentView&);        // file_timer_server.cc
std::unique_ptr<JobFeature> MakeMetricsEndpoint(AgentView&);  // metrics_endpoint.cc
std::unique_ptr<JobFeature> MakeEventLog(AgentView&);         // event_log.cc
std::unique_ptr<JobFeature> MakeHorovodServer(AgentView&);    // horovod_server.cc
std::unique_ptr<JobFeature> MakeOomWitness(AgentView&);       // oom_witness.cc
std::unique_ptr<JobFeature> MakeControlSocket(AgentView&);    // control_socket.cc
std::unique_ptr<JobFeature> MakeSnapshotStore(AgentView&);    // snapshot_store.cc
std::unique_ptr<JobFeature> MakeStragglerWatch(AgentView&);   // straggler_watch.cc
std::unique_ptr<JobFeature> MakeHealthGate(AgentView&);       // health_gate.cc
std::unique_ptr<JobFeature> MakeGoodputLedger(AgentView&);    // goodput_ledger.cc

std::vector<FeatureFactory> DefaultFeatures() {
  return {
      MakeWarmStart,      MakeFileTimer,  MakeMetricsEndpoint, MakeEventLog,
      MakeHorovodServer,  MakeOomWitness, MakeControlSocket,   MakeSnapshotStore,
      MakeStragglerWatch, MakeHealthGate, MakeGoodputLedger,
  };
}

JobFeatures::JobFeatures(const std::vector<FeatureFactory>& factories, AgentView& agent) {
  for (const FeatureFactory& make : factories) {
    if (auto f = make(agent)) list_.push_back(std::move(f));
  }
}

Status JobFeatures::Prepare() {
  for (auto& f : list_) {
    if (auto s = f->Prepare(); !s.ok()) return s;
  }
  return Status::Ok();
}

// How many hold the join; the opening itself is one, until every BeforeJoin has been heard.
struct JoinGate::Held {
  int count = 1;
  std::function<void()> join;
  void Release() {
    if (--count == 0) join();
  }
};

std::function<void()> JoinGate::Hold() {
  ++held_->count;
  return [held = held_] { held->Release(); };
}

void JobFeatures::BeforeJoin(std::function<void()> join) {
  auto held = std::make_shared<JoinGate::Held>();
  held->join = std::move(join);
  JoinGate gate(held);
  for (auto& f : list_) f->BeforeJoin(gate);
  if (held->count > 1) {
    for (auto& f : list_) f->OnJoinHeld();
  }
  held->Release();
}

std::string JobFeatures::KillerOf(const Worker& w, const ExitStatus& exit) {
  for (auto& f : list_) {
    if (auto killer = f->KillerOf(w, exit); !killer.empty()) return killer;
  }
  return "";
}

}  // namespace crun::agent
