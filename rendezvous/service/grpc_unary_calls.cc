// The unary calls (grpc_front.h): Status and Stacks, answered from the engine's thread (a
// Stacks call held until the engine's answer), and the standard health service.
#include "rendezvous/service/grpc_front.h"

namespace crun::rdzv::grpc_front {
namespace {

using StatusCall = UnaryCall<ServiceBase, v1::StatusRequest, v1::StatusResponse>;

const StatusCall::Method kStatusMethod{"Status", &ServiceBase::RequestStatus,
                                       [](Core* core, StatusCall* call) {
                                         asio::post(core->io, [core, call] {
                                           if (core->engine) {
                                             *call->response() = ToProto(
                                                 core->engine->Status(call->request().run_id(),
                                                                      Clock::now()));
                                           }
                                           call->Answer(grpc::Status::OK);
                                         });
                                       }};

const StacksCall::Method kStacksMethod{
    "Stacks", &ServiceBase::RequestStacks, [](Core* core, StacksCall* call) {
      asio::post(core->io, [core, call] {
        if (!core->engine || core->stopping) {
          return call->Answer(
              grpc::Status(grpc::StatusCode::UNAVAILABLE, "the service is stopping"));
        }
        const std::uint64_t query = core->next_stacks_call++;
        core->stacks_calls[query] = call;
        const auto& r = call->request();
        const auto asked =
            core->engine->AskStacks(r.run_id(), query, Millis(r.timeout_ms()), Clock::now());
        if (!asked.ok()) {
          core->stacks_calls.erase(query);
          call->Answer(grpc::Status(grpc::StatusCode::NOT_FOUND, asked.message()));
        }
        core->Rearm();
      });
    }};

std::optional<health::HealthCheckResponse::ServingStatus> HealthOf(const Core* core,
                                                                   const std::string& service) {
  if (!service.empty() && service != v1::Rendezvous::service_full_name()) return std::nullopt;
  return core->shutting_down.load() ? health::HealthCheckResponse::NOT_SERVING
                                    : health::HealthCheckResponse::SERVING;
}

const HealthCall::Method kHealthCheck{"Health/Check", &HealthService::RequestCheck,
                                      [](Core* core, HealthCall* call) {
                                        const std::string& name = call->request().service();
                                        const auto status = HealthOf(core, name);
                                        if (!status) {
                                          return call->Answer(
                                              grpc::Status(grpc::StatusCode::NOT_FOUND,
                                                           "this server has no service named '" +
                                                               name + "'"));
                                        }
                                        call->response()->set_status(*status);
                                        call->Answer(grpc::Status::OK);
                                      },
                                      true};

// Health/Watch: the status at once (SERVICE_UNKNOWN for a service this server does not have),
// then the stream is held until the caller ends it or the server stops.
class HealthWatch final : public Call {
 public:
  static void Await(Core* core, HealthService* service, grpc::ServerCompletionQueue* cq) {
    auto* w = new HealthWatch(core, service, cq);
    // Returned only if the call starts.
    w->context_.AsyncNotifyWhenDone(w->Issue(&w->tags_[kDone]));
    service->RequestWatch(&w->context_, &w->request_, &w->writer_, cq, cq,
                          w->Issue(&w->tags_[kArrived]));
  }

 private:
  enum Op { kArrived, kWritten, kDone };
  HealthWatch(Core* core, HealthService* service, grpc::ServerCompletionQueue* cq)
      : Call(core), service_(service), cq_(cq), writer_(&context_) {
    for (int i = 0; i <= kDone; ++i) tags_[i] = {this, i};
  }

  void On(int op, bool ok) override {
    if (op == kArrived) {
      if (!ok) {
        delete this;
        return;
      }
      if (!core_->shutting_down.load()) Await(core_, service_, cq_);
      outstanding_ = 2;  // the write and the done tag
      const auto status = HealthOf(core_, request_.service());
      response_.set_status(status ? *status : health::HealthCheckResponse::SERVICE_UNKNOWN);
      writer_.Write(response_, Issue(&tags_[kWritten]));
      return;
    }
    if (--outstanding_ == 0) delete this;
  }

  HealthService* service_;
  grpc::ServerCompletionQueue* cq_;
  grpc::ServerContext context_;
  health::HealthCheckRequest request_;
  health::HealthCheckResponse response_;
  grpc::ServerAsyncWriter<health::HealthCheckResponse> writer_;
  Tag tags_[3];
  int outstanding_ = 0;  // once arrived
};

}  // namespace

void Core::EndStacksCalls() {
  stopping = true;
  for (auto& [query, call] : stacks_calls) {
    call->Answer(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the service is stopping"));
  }
  stacks_calls.clear();
}

void AwaitUnaryCalls(Core* core, ServiceBase* service, HealthService* health,
                     grpc::ServerCompletionQueue* cq) {
  StatusCall::Await(core, service, cq, kStatusMethod);
  StacksCall::Await(core, service, cq, kStacksMethod);
  HealthCall::Await(core, health, cq, kHealthCheck);
  HealthWatch::Await(core, health, cq);
}

}  // namespace crun::rdzv::grpc_front
