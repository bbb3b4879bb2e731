// Each agent's Session stream (grpc_front.h): its messages queued for the engine's thread,
// the engine's answers encoded once and written back, and the job token checked on every call.
#include "rendezvous/service/grpc_front.h"

namespace crun::rdzv::grpc_front {

grpc::Status Core::Authorize(const grpc::ServerContextBase* context, const char* call) {
  const std::string& token = options.security.token;
  if (token.empty()) return grpc::Status::OK;
  const auto& md = context->client_metadata();
  const auto it = md.find(kTokenHeader);
  const bool given = it != md.end();
  if (given && TokenMatches(token, std::string_view(it->second.data(), it->second.size()))) {
    return grpc::Status::OK;
  }
  const auto n = refused_calls.fetch_add(1, std::memory_order_relaxed) + 1;
  const std::string why = given ? "a wrong job token" : "no job token";
  if (engine_metrics) engine_metrics->Refused(given ? kRefusedWrongToken : kRefusedNoToken);
  if (WorthLogging(n)) {
    spdlog::warn("refused {} call #{} from {}: {}", call, n, PeerIp(context->peer()), why);
  }
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                      given ? "the job token does not match the rendezvous service's"
                            : "the rendezvous service requires a job token: give every node "
                              "the job's token (--token-file, CRUN_TOKEN_FILE or CRUN_TOKEN)");
}

// One agent's Session stream, on gRPC's asynchronous API. The callback API puts every
// operation of the process on one completion queue, and Debian's gRPC (built without NDEBUG)
// scans that queue's outstanding operations at each completion: O(agents) per message, 45 % of
// the daemon's CPU at 30,000 agents. Here the sessions are spread over kSessionQueues queues,
// each drained by one thread that handles its completions itself (no hand-off to a pool).
//
// Each operation has a tag of its own. A read is pending for as long as the stream lasts: its
// failure is the stream's end, however it came (the agent closed its side, cancelled, or the
// connection broke). The session then finishes the call once no write is in flight, and lives
// until the finish is back: one outstanding operation per idle agent.
// Send comes from the engine's thread (under Core::mu); everything else from the queue's one
// thread. The session's mutex orders the two.
class AsyncSession final : public Call {
 public:
  AsyncSession(Core* core, ServiceBase* service, grpc::ServerCompletionQueue* cq)
      : Call(core), service_(service), cq_(cq), stream_(&context_) {
    for (int i = 0; i < kOps; ++i) tags_[i] = {this, i};
  }

  // Waits for the next agent to open a session on this queue.
  void Request() {
    service_->RequestSession(&context_, &stream_, cq_, cq_, Issue(&tags_[kRequest]));
  }

  void Send(const grpc::ByteBuffer& m) {
    std::lock_guard lock(mu_);
    if (closed_) return;
    queue_.push_back(m);  // the slices' references, not their bytes
    if (!writing_) WriteNext();
  }

 private:
  enum Op { kRequest, kMetadata, kRead, kWrite, kFinish, kOps };

  void On(int op, bool ok) override {
    if (op == kRequest) return Started(ok);
    bool ended = false;
    bool last = false;
    {
      std::lock_guard lock(mu_);
      if (op == kMetadata || op == kWrite) {
        writing_ = false;
        if (op == kWrite && !queue_.empty()) queue_.pop_front();
        if (!ok) Close();
        if (!queue_.empty() && !closed_) WriteNext();
      } else if (op == kRead && ok) {
        v1::AgentMessage m;
        const bool parsed = grpc::SerializationTraits<v1::AgentMessage>::Deserialize(&in_, &m).ok();
        in_.Clear();
        if (parsed) {
          core_->Received(id_, m, peer_ip_);
          Read();
        } else {
          // Bytes that are no AgentMessage: not crun's agent, or a broken one. The stream ends
          // as a failed read ends it (the typed API would have failed the call), and the
          // engine hears of a lost session; the peer is told why.
          Malformed();
          ended = true;
          Close();
        }
      } else if (op == kRead) {
        ended = true;
        Close();
      }
      // Closed (so no Send starts a write) before the call is finished.
      if (closed_ && !writing_ && !finished_) {
        finished_ = true;
        ++outstanding_;
        stream_.Finish(finish_status_, Issue(&tags_[kFinish]));
      }
      last = --outstanding_ == 0;
    }
    if (ended || last) End();
    if (last) delete this;
  }

  // A call arrived (ok), or the server is shutting down (not ok).
  void Started(bool ok) {
    if (!ok) {
      delete this;
      return;
    }
    if (!core_->shutting_down.load()) (new AsyncSession(core_, service_, cq_))->Request();
    if (core_->engine_metrics) core_->engine_metrics->sessions_total.With().Inc();
    {
      std::lock_guard lock(mu_);
      outstanding_ = 0;
      if (auto s = core_->Authorize(&context_, "Session"); !s.ok()) {
        closed_ = finished_ = true;
        ++outstanding_;
        stream_.Finish(s, Issue(&tags_[kFinish]));
        return;
      }
      id_ = core_->next_session++;
      peer_ip_ = PeerIp(context_.peer());
      registered_ = true;
      if (core_->beats) {
        const BeatTicket ticket{core_->beats->port(), id_, core_->beats->Add(id_)};
        context_.AddInitialMetadata(kBeatTicketHeader, FormatBeatTicket(ticket));
      }
      // At once, before any message: the agent then knows its session was open, so that
      // losing it is a lost service in every phase, gathering too (reconnect_timeout bounds
      // the wait).
      writing_ = true;
      ++outstanding_;
      stream_.SendInitialMetadata(Issue(&tags_[kMetadata]));
      Read();
    }
    // Visible to the engine's Send only now, outside the session's mutex: Send runs under
    // Core::mu and then takes the session's, so taking Core::mu under the session's would
    // invert that order (ThreadSanitizer: lock-order inversion). Nothing of this session
    // completes meanwhile: its operations complete on this same thread, after Started.
    core_->Register(id_, this);
  }

  void Read() {
    ++outstanding_;
    stream_.Read(&in_, Issue(&tags_[kRead]));
  }
  void WriteNext() {
    writing_ = true;
    ++outstanding_;
    stream_.Write(queue_.front(), Issue(&tags_[kWrite]));
  }
  void Malformed() {
    const auto n = core_->malformed_messages.fetch_add(1, std::memory_order_relaxed) + 1;
    if (core_->engine_metrics) core_->engine_metrics->Refused(kRefusedMalformed);
    if (WorthLogging(n)) {
      spdlog::warn("ended the session of {} (session {}): message #{} that is no AgentMessage",
                   peer_ip_, id_, n);
    }
    finish_status_ = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                  "a message on the Session stream does not parse as "
                                  "crun.v1.AgentMessage: the session is ended");
  }
  // No more writes: what is queued is dropped (the stream ended or failed).
  void Close() {
    closed_ = true;
    if (!writing_) queue_.clear();
  }
  // The stream's end, told once: no Send reaches the session after it, and the engine hears
  // of the end after the session's last message.
  void End() {
    if (!registered_) return;
    registered_ = false;
    core_->Unregister(id_);
    if (core_->beats) core_->beats->Remove(id_);
    core_->Closed(id_);
  }

  ServiceBase* service_;
  grpc::ServerCompletionQueue* cq_;
  grpc::ServerContext context_;
  grpc::ServerAsyncReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer> stream_;
  Tag tags_[kOps];
  SessionId id_ = 0;
  std::string peer_ip_;
  bool registered_ = false;  // the queue's thread only
  grpc::ByteBuffer in_;
  std::mutex mu_;  // the fields below
  // The front is being written while writing_. It may move while written (a push_back that
  // grows the vector): Write duplicates the buffer (its slices' references) when called.
  // SmallFifo, not std::deque: an idle session's queue holds no heap (a deque, about 600 B).
  SmallFifo<grpc::ByteBuffer> queue_;
  bool writing_ = false;
  bool closed_ = false;
  bool finished_ = false;
  grpc::Status finish_status_;  // OK unless the agent sent what does not parse
  int outstanding_ = 1;         // the request
};

void Core::SendTo(SessionId id, const msg::ServiceMessage& m) { SendWire(id, Encode(m)); }

void Core::SendWire(SessionId id, const grpc::ByteBuffer& wire) {
  std::lock_guard lock(mu);
  if (auto it = streams.find(id); it != streams.end()) it->second->Send(wire);
}

grpc::ByteBuffer Core::Encode(const msg::ServiceMessage& m) {
  const auto* a = std::get_if<msg::Assignment>(&m);
  if (a == nullptr || !a->members || a->members->empty()) {
    grpc::ByteBuffer out;
    bool own = false;
    (void)grpc::SerializationTraits<v1::ServiceMessage>::Serialize(ToProto(m), &out, &own);
    return out;
  }
  if (a->members != encoded_members) {
    encoded_members = a->members;
    encoded_members_bytes = grpc::Slice(EncodeMembers(*a->members));
  }
  grpc::Slice pieces[] = {grpc::Slice(EncodeAssignmentHead(*a, encoded_members_bytes.size())),
                          encoded_members_bytes};
  return grpc::ByteBuffer(pieces, 2);
}

void AwaitSession(Core* core, ServiceBase* service, grpc::ServerCompletionQueue* cq) {
  (new AsyncSession(core, service, cq))->Request();
}

}  // namespace crun::rdzv::grpc_front
