// The etcd client's calls (client.h): connect, get, put, transactions and leases, each retried
// on the next member within its deadline. Its watches: watch.cc.
#include "rendezvous/etcd/client_impl.h"

namespace crun::etcd {
namespace {

void FillOp(const Op& op, pb::RequestOp* out) {
  switch (op.kind) {
    case Op::Kind::kPut: {
      auto* p = out->mutable_request_put();
      p->set_key(op.key);
      if (op.keep_value) {
        p->set_ignore_value(true);
      } else {
        p->set_value(op.value);
      }
      p->set_lease(op.lease);
      break;
    }
    case Op::Kind::kDelete:
      out->mutable_request_delete_range()->set_key(op.key);
      break;
    case Op::Kind::kDeletePrefix: {
      auto* d = out->mutable_request_delete_range();
      d->set_key(op.key);
      d->set_range_end(PrefixEnd(op.key));
      break;
    }
    case Op::Kind::kGet:
      out->mutable_request_range()->set_key(op.key);
      break;
    case Op::Kind::kGetPrefix: {
      auto* r = out->mutable_request_range();
      r->set_key(op.key);
      r->set_range_end(PrefixEnd(op.key));
      break;
    }
  }
}

}  // namespace

std::string PrefixEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    auto& last = end.back();
    if (static_cast<unsigned char>(last) < 0xff) {
      last = static_cast<char>(static_cast<unsigned char>(last) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

std::string Client::endpoints() const { return impl_->Endpoints(); }

std::size_t Client::member() const { return impl_->current.load(); }

StatusOr<std::shared_ptr<Client>> Client::Connect(ClientOptions options,
                                                  Clock::time_point deadline) {
  if (options.endpoints.empty()) return InvalidArgument("no etcd endpoint given");
  auto impl = std::make_unique<Impl>();
  impl->o = std::move(options);
  impl->current = impl->o.first_member % impl->o.endpoints.size();
  rdzv::ChannelOptions co;
  co.keepalive_timeout = impl->o.keepalive_timeout;
  // etcd's servers refuse pings more often than every 5 s (--grpc-keepalive-min-time) and
  // on a connection without a call (GOAWAY "too_many_pings"). A silent member is noticed by
  // the calls' own deadlines (kAttempt), and the watch leaves it with them (Rotate).
  co.keepalive_interval = std::chrono::seconds(10);
  co.ping_when_idle = false;
  // A connection gets gRPC's own 20 s to come up: a client too busy to finish its handshakes
  // within 2 s (a process of thousands of agents) cut them off and dialled again, and none
  // ever came up. A member that does not answer is left by the calls' deadlines, not this.
  co.min_connect = std::chrono::seconds(20);
  co.max_backoff = kAttempt;
  co.security = impl->o.security;
  for (const auto& e : impl->o.endpoints) {
    auto ch = rdzv::MakeChannel(e, co);
    impl->channels.push_back(ch);
    impl->kv.push_back(pb::KV::NewStub(ch));
    impl->lease.push_back(pb::Lease::NewStub(ch));
    impl->watch.push_back(pb::Watch::NewStub(ch));
    impl->auth.push_back(pb::Auth::NewStub(ch));
    impl->maintenance.push_back(pb::Maintenance::NewStub(ch));
  }
  std::shared_ptr<Client> client(new Client(std::move(impl)));
  // A read proves a member with quorum answers, with our credentials.
  if (!client->impl_->o.probe) return client;
  auto probe = client->Get("crun-connect-probe", deadline);
  if (!probe.ok()) return probe.status();
  return client;
}

StatusOr<RangeResult> Client::Get(const std::string& key, Clock::time_point deadline) {
  pb::RangeRequest req;
  req.set_key(key);
  pb::RangeResponse resp;
  CRUN_RETURN_IF_ERROR(impl_->Call("a read of " + key, deadline, [&](std::size_t m, auto& ctx) {
    return impl_->kv[m]->Range(&ctx, req, &resp);
  }));
  RangeResult out;
  out.revision = resp.header().revision();
  for (const auto& kv : resp.kvs()) out.kvs.push_back(FromPb(kv));
  return out;
}

StatusOr<RangeResult> Client::GetPrefix(const std::string& prefix, Clock::time_point deadline) {
  pb::RangeRequest req;
  req.set_key(prefix);
  req.set_range_end(PrefixEnd(prefix));
  pb::RangeResponse resp;
  CRUN_RETURN_IF_ERROR(
      impl_->Call("a read of " + prefix + "*", deadline,
                  [&](std::size_t m, auto& ctx) { return impl_->kv[m]->Range(&ctx, req, &resp); }));
  RangeResult out;
  out.revision = resp.header().revision();
  for (const auto& kv : resp.kvs()) out.kvs.push_back(FromPb(kv));
  return out;
}

StatusOr<std::int64_t> Client::Put(const std::string& key, const std::string& value,
                                   std::int64_t lease, Clock::time_point deadline) {
  pb::PutRequest req;
  req.set_key(key);
  req.set_value(value);
  req.set_lease(lease);
  pb::PutResponse resp;
  CRUN_RETURN_IF_ERROR(impl_->Call("a write of " + key, deadline, [&](std::size_t m, auto& ctx) {
    return impl_->kv[m]->Put(&ctx, req, &resp);
  }));
  return resp.header().revision();
}

StatusOr<TxnResult> Client::Txn(const std::vector<Compare>& compares, const std::vector<Op>& then,
                                const std::vector<Op>& otherwise, Clock::time_point deadline) {
  pb::TxnRequest req;
  for (const auto& c : compares) {
    auto* pc = req.add_compare();
    pc->set_key(c.key);
    pc->set_result(pb::Compare::EQUAL);
    switch (c.target) {
      case Compare::Target::kCreateRevision:
        pc->set_target(pb::Compare::CREATE);
        pc->set_create_revision(c.revision);
        break;
      case Compare::Target::kModRevision:
        pc->set_target(pb::Compare::MOD);
        pc->set_mod_revision(c.revision);
        break;
      case Compare::Target::kValue:
        pc->set_target(pb::Compare::VALUE);
        pc->set_value(c.value);
        break;
    }
  }
  for (const auto& op : then) FillOp(op, req.add_success());
  for (const auto& op : otherwise) FillOp(op, req.add_failure());
  pb::TxnResponse resp;
  const std::string what = "a transaction on " + (!compares.empty() ? compares.front().key
                                                  : !then.empty()   ? then.front().key
                                                                    : std::string("keys"));
  CRUN_RETURN_IF_ERROR(impl_->Call(what, deadline, [&](std::size_t m, auto& ctx) {
    return impl_->kv[m]->Txn(&ctx, req, &resp);
  }));
  TxnResult out;
  out.succeeded = resp.succeeded();
  out.revision = resp.header().revision();
  for (const auto& r : resp.responses()) {
    if (r.response_case() != pb::ResponseOp::kResponseRange) continue;
    std::vector<KeyValue> kvs;
    for (const auto& kv : r.response_range().kvs()) kvs.push_back(FromPb(kv));
    out.reads.push_back(std::move(kvs));
  }
  return out;
}

StatusOr<std::int64_t> Client::Grant(std::chrono::seconds ttl, Clock::time_point deadline) {
  pb::LeaseGrantRequest req;
  req.set_ttl(ttl.count());
  pb::LeaseGrantResponse resp;
  CRUN_RETURN_IF_ERROR(impl_->Call("a lease", deadline, [&](std::size_t m, auto& ctx) {
    return impl_->lease[m]->LeaseGrant(&ctx, req, &resp);
  }));
  if (!resp.error().empty()) return InternalError("etcd refused a lease: " + resp.error());
  return resp.id();
}

StatusOr<std::int64_t> Client::KeepAliveOnce(std::int64_t lease, Clock::time_point deadline) {
  std::int64_t ttl = 0;
  CRUN_RETURN_IF_ERROR(
      impl_->Call("a lease keep-alive", deadline, [&](std::size_t m, grpc::ClientContext& ctx) {
        auto stream = impl_->lease[m]->LeaseKeepAlive(&ctx);
        pb::LeaseKeepAliveRequest req;
        req.set_id(lease);
        pb::LeaseKeepAliveResponse resp;
        if (stream->Write(req) && stream->Read(&resp)) ttl = resp.ttl();
        stream->WritesDone();
        return stream->Finish();
      }));
  if (ttl <= 0) return NotFound("etcd lease " + std::to_string(lease) + " has expired");
  return ttl;
}

Status Client::Revoke(std::int64_t lease, Clock::time_point deadline) {
  pb::LeaseRevokeRequest req;
  req.set_id(lease);
  pb::LeaseRevokeResponse resp;
  return impl_->Call("a lease revocation", deadline, [&](std::size_t m, auto& ctx) {
    return impl_->lease[m]->LeaseRevoke(&ctx, req, &resp);
  });
}

}  // namespace crun::etcd
