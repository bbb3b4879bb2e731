// libFuzzer target: the rendezvous service's message handlers (rendezvous/service/engine.h),
// which take every crun.v1 AgentMessage a gRPC session delivers, fed hostile messages through
// the gRPC adapter's conversions (rendezvous/service/proto_messages.h), both ways.
//
// The input is a script of events for up to eight sessions: a message (built field by field
// from the input, so always valid protobuf, with hostile content: negative or huge node
// counts, nproc, ranks and timeouts, empty or enormous ids, thousands of failures; or, now
// and then, raw input bytes parsed as an AgentMessage), a session closing, or time passing
// (OnTick at the engine's own NextWake or at an arbitrary later time). After every event:
// nothing crashed, leaked or hit undefined behaviour; every message sent reaches the wire and
// parses back (an agent's gRPC would drop one that does not); every assignment sent names a
// rank range inside its world; at the end Status() answers with a message that serializes,
// and the metrics page renders with series of the jobs still held only.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <set>
#include <string>

#include <google/protobuf/stubs/logging.h>

#include "metrics/registry.h"
#include "rendezvous/service/engine.h"
#include "rendezvous/service/proto_messages.h"

namespace {

using crun::rdzv::Engine;
using crun::rdzv::TimePoint;
namespace v1 = crun::v1;
namespace msg = crun::rdzv::msg;

class NullStore final : public crun::rdzv::RoundStore {
 public:
  std::uint16_t port() const override { return 29500; }
};

[[noreturn]] void Broken(const std::string& what) {
  std::fprintf(stderr, "rendezvous_engine_fuzz: %s\n", what.c_str());
  std::abort();
}

void CheckSent(const msg::ServiceMessage& sent) {
  std::string wire;
  v1::ServiceMessage m;
  if (!crun::rdzv::ToProto(sent).SerializeToString(&wire) || !m.ParseFromString(wire)) {
    Broken("a message sent does not survive the wire");
  }
  if (m.has_stacks_result() && static_cast<std::size_t>(m.stacks_result().ByteSizeLong()) >
                                   Engine::kMaxStacksBytes + (std::size_t{1} << 20)) {
    Broken("a stacks answer past its bound: " + std::to_string(m.stacks_result().ByteSizeLong()));
  }
  if (!m.has_assignment()) return;
  const auto& a = m.assignment();
  if (a.spare()) return;
  if (a.world_size() <= 0 || a.group_world_size() <= 0 || a.group_rank() < 0 ||
      a.group_rank() >= a.group_world_size() || a.base_rank() < 0 ||
      a.base_rank() >= a.world_size()) {
    Broken("an assignment outside its world: group rank " + std::to_string(a.group_rank()) +
           " of " + std::to_string(a.group_world_size()) + ", base rank " +
           std::to_string(a.base_rank()) + " of " + std::to_string(a.world_size()));
  }
}

// (An exhausted input reads as zeros: the rare, costly choices sit at the top of each range.)
// Numbers a hostile agent would send: small ones mostly (so that rounds form), the edges too.
std::int64_t HostileNumber(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange(0, 3)) {
    case 0:
      return in.ConsumeIntegralInRange<std::int64_t>(-2, 4);
    case 1:
      return in.PickValueInArray<std::int64_t>(
          {0, -1, INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN, 1LL << 31, 1000000});
    default:
      return in.ConsumeIntegral<std::int64_t>();
  }
}

int HostileInt(FuzzedDataProvider& in) { return static_cast<int>(HostileNumber(in)); }

std::string HostileString(FuzzedDataProvider& in) {
  if (in.ConsumeBool()) return in.PickValueInArray<std::string>({"a", "b", "c", "job", ""});
  if (in.ConsumeIntegralInRange(0, 63) == 63) return std::string(70000, 'x');
  return in.ConsumeRandomLengthString(64);
}

v1::AgentMessage Message(FuzzedDataProvider& in) {
  v1::AgentMessage m;
  switch (in.ConsumeIntegralInRange(0, 7)) {
    case 0: {
      auto* j = m.mutable_join();
      j->set_protocol_version(in.ConsumeBool() ? 1 : static_cast<std::uint32_t>(HostileNumber(in)));
      j->set_run_id(in.ConsumeBool() ? "job" : HostileString(in));
      j->set_service_host(HostileString(in));
      auto* n = j->mutable_node();
      n->set_node_id(HostileString(in));
      n->set_host(HostileString(in));
      n->set_nproc(in.ConsumeBool() ? in.ConsumeIntegralInRange(1, 8) : HostileInt(in));
      for (int i = in.ConsumeIntegralInRange(0, 3); i > 0; --i) n->add_addresses(HostileString(in));
      if (in.ConsumeBool()) n->set_requested_rank(HostileInt(in));
      auto* s = j->mutable_settings();
      const bool sane = in.ConsumeBool();
      s->set_min_nodes(sane ? in.ConsumeIntegralInRange(1, 3) : HostileInt(in));
      s->set_max_nodes(sane ? in.ConsumeIntegralInRange(1, 4) : HostileInt(in));
      s->set_max_restarts(sane ? in.ConsumeIntegralInRange(0, 3) : HostileInt(in));
      s->set_join_timeout_ms(sane ? 60000 : HostileNumber(in));
      s->set_last_call_timeout_ms(sane ? 100 : HostileNumber(in));
      s->set_heartbeat_timeout_ms(sane ? 3000 : HostileNumber(in));
      break;
    }
    case 1:
      m.mutable_heartbeat()->set_sequence(in.ConsumeIntegral<std::uint64_t>());
      break;
    case 2: {
      auto* r = m.mutable_workers_failed();
      r->set_host(HostileString(in));
      r->set_node_id(HostileString(in));
      const int n = in.ConsumeIntegralInRange(0, 63) == 63 ? 5000 : in.ConsumeIntegralInRange(0, 3);
      for (int i = 0; i < n; ++i) {
        auto* f = r->add_failures();
        f->set_rank(HostileInt(in));
        f->set_local_rank(HostileInt(in));
        f->set_pid(HostileInt(in));
        if (in.ConsumeBool()) {
          f->set_signal(HostileInt(in));
        } else {
          f->set_exit_code(HostileInt(in));
        }
        f->set_message(HostileString(in));
        f->set_time_unix_ms(HostileNumber(in));
        for (int k = in.ConsumeIntegralInRange(0, 2); k > 0; --k) {
          f->add_stderr_tail(HostileString(in));
        }
      }
      break;
    }
    case 3:
      m.mutable_workers_succeeded();
      break;
    case 4:
      m.mutable_leave()->set_reason(HostileString(in));
      break;
    case 5: {
      auto* w = m.mutable_stacks_wanted();
      w->set_request_id(in.ConsumeIntegral<std::uint64_t>());
      w->set_reason(HostileString(in));
      w->set_timeout_ms(HostileNumber(in));
      break;
    }
    case 6: {
      // An answer to one of the first requests (ids count from 1), or to none; large ones too.
      auto* r = m.mutable_stacks_reply();
      r->set_request_id(in.ConsumeBool() ? in.ConsumeIntegralInRange<std::uint64_t>(1, 4)
                                         : in.ConsumeIntegral<std::uint64_t>());
      r->mutable_node()->set_node_id(HostileString(in));
      const int ranks =
          in.ConsumeIntegralInRange(0, 63) == 63 ? 2 : in.ConsumeIntegralInRange(0, 2);
      for (int i = 0; i < ranks; ++i) {
        auto* rs = r->mutable_node()->add_ranks();
        rs->set_rank(HostileInt(in));
        rs->set_error(ranks == 2 && i == 1 ? std::string(1 << 20, 'e') : HostileString(in));
      }
      break;
    }
    default: {
      // Raw bytes: whatever they parse to (unknown fields, an empty oneof, mixtures).
      const std::string raw = in.ConsumeRandomLengthString(256);
      m.ParseFromString(raw);
      break;
    }
  }
  return m;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Strings that are not UTF-8 are part of the game; protobuf's complaint about each is not.
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  int sends = 0;
  std::set<std::uint64_t> asked, answered;  // the Stacks call's queries
  crun::rdzv::EngineHooks hooks;
  hooks.send = [&sends](crun::rdzv::SessionId, const msg::ServiceMessage& m) {
    ++sends;
    CheckSent(m);
  };
  hooks.start_store = [&in](const std::string&, int, int,
                            const std::vector<std::vector<std::string>>&)
      -> crun::StatusOr<std::unique_ptr<crun::rdzv::RoundStore>> {
    if (in.remaining_bytes() > 0 && in.ConsumeIntegralInRange(0, 15) == 0) {
      return crun::Unavailable("no free port");  // the store can fail to start, too
    }
    return std::unique_ptr<crun::rdzv::RoundStore>(std::make_unique<NullStore>());
  };
  hooks.stacks_done = [&](std::uint64_t query, const msg::StacksResult& r) {
    if (!asked.count(query) || !answered.insert(query).second) Broken("a stacks answer twice");
    CheckSent(r);
  };
  // The metrics are counted throughout (hostile run ids become label values).
  crun::metrics::Registry registry;
  crun::rdzv::EngineMetrics metrics(registry);
  crun::rdzv::EngineOptions options;
  options.keep_finished_jobs = 2;
  options.metrics = &metrics;
  Engine engine(std::move(hooks), options);
  TimePoint now{};
  for (int step = 0; step < 200 && in.remaining_bytes() > 0; ++step) {
    const auto session = in.ConsumeIntegralInRange<crun::rdzv::SessionId>(1, 8);
    switch (in.ConsumeIntegralInRange(0, 9)) {
      case 0:
        engine.OnSessionClosed(session, now);
        break;
      case 1:
        if (auto wake = engine.NextWake(); wake && *wake > now) now = *wake;
        engine.OnTick(now);
        break;
      case 2:
        now += std::chrono::milliseconds(in.ConsumeIntegralInRange<std::int64_t>(0, 1LL << 30));
        engine.OnTick(now);
        break;
      case 3: {
        const std::uint64_t query = asked.size() + 1;
        const auto timeout = std::chrono::milliseconds(HostileNumber(in));
        if (engine.AskStacks(in.ConsumeBool() ? "job" : HostileString(in), query, timeout, now)
                .ok()) {
          asked.insert(query);
        }
        break;
      }
      default: {
        // Through the wire as gRPC carries it: what does not parse (a string that is not
        // UTF-8, say) never reaches the service's handlers.
        std::string wire;
        v1::AgentMessage m;
        if (!Message(in).SerializeToString(&wire) || !m.ParseFromString(wire)) break;
        auto message = crun::rdzv::FromProto(m);  // nullopt: the adapter drops it
        const std::string peer = in.ConsumeBool() ? "10.0.0." + std::to_string(session) : "";
        if (message) engine.OnMessage(session, *message, now, peer);
        break;
      }
    }
  }
  // Every Stacks call is answered by its deadline (at most 120 s).
  now += std::chrono::seconds(121);
  engine.OnTick(now);
  if (answered != asked) Broken("a Stacks call never answered");
  // What `crun status` would show: every job, serializable.
  const auto status = crun::rdzv::ToProto(engine.Status("", now));
  std::string wire;
  if (!status.SerializeToString(&wire)) Broken("Status does not serialize");
  // The page renders; the jobs no longer held have no series left.
  engine.RefreshMetrics(now);
  const std::string page = registry.Render();
  if (page.find("crun_rendezvous_jobs{") == std::string::npos) Broken("no jobs on the page");
  if (metrics.held_runs() > static_cast<std::size_t>(status.jobs_size()))
    Broken("series of a forgotten job remain");
  (void)sends;
  return 0;
}
