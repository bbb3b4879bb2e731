// The memory baseline for the rendezvous service (issue 50): a bare gRPC server that accepts
// any streaming call, opens it (initial metadata) and keeps a read pending on it, the least a
// server holding that many idle streams can do, built the way `crun rendezvous` is (the same
// Debian gRPC, the asynchronous API, 16 completion queues with a thread each). rdzv_bench
// opens the same number of sessions against it as against the daemon, in the same run, and
// reports the daemon's memory per agent above it. Messages are read and dropped.
//
//   bare_session_server [--port 0]   prints "bare_session_server listening on 127.0.0.1:PORT"
#include <cstdio>
#include <memory>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>

namespace {

constexpr int kQueues = 16;

// One stream: accepted, opened, read until it ends, finished.
class Stream {
 public:
  Stream(grpc::AsyncGenericService* service, grpc::ServerCompletionQueue* cq)
      : service_(service), cq_(cq), stream_(&context_) {
    service_->RequestCall(&context_, &stream_, cq_, cq_, &accepted_);
  }

  static void Handle(void* tag, bool ok) {
    auto* t = static_cast<Tag*>(tag);
    t->stream->On(t->op, ok);
  }

 private:
  enum Op { kAccepted, kOpened, kRead, kFinished };
  struct Tag {
    Stream* stream;
    Op op;
  };

  void On(Op op, bool ok) {
    switch (op) {
      case kAccepted:
        if (!ok) {  // the server is shutting down
          delete this;
          return;
        }
        new Stream(service_, cq_);  // the next call on this queue
        ++pending_;
        stream_.SendInitialMetadata(&opened_);
        Read();
        return;
      case kOpened:
        break;
      case kRead:
        if (ok) {
          in_.Clear();
          Read();
        } else {
          ++pending_;
          stream_.Finish(grpc::Status::OK, &finished_);
        }
        break;
      case kFinished:
        break;
    }
    if (--pending_ == 0) delete this;
  }

  void Read() {
    ++pending_;
    stream_.Read(&in_, &read_);
  }

  grpc::AsyncGenericService* service_;
  grpc::ServerCompletionQueue* cq_;
  grpc::GenericServerContext context_;
  grpc::GenericServerAsyncReaderWriter stream_;
  grpc::ByteBuffer in_;
  Tag accepted_{this, kAccepted}, opened_{this, kOpened}, read_{this, kRead},
      finished_{this, kFinished};
  int pending_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  int port = 0;
  CLI::App app{"bare gRPC server: the memory baseline of idle streams"};
  app.add_option("--port", port)->check(CLI::Range(0, 65535));
  CLI11_PARSE(app, argc, argv);
  grpc::AsyncGenericService service;
  grpc::ServerBuilder builder;
  int selected = 0;
  builder.AddListeningPort("127.0.0.1:" + std::to_string(port), grpc::InsecureServerCredentials(),
                           &selected);
  builder.RegisterAsyncGenericService(&service);
  std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> queues;
  for (int i = 0; i < kQueues; ++i) queues.push_back(builder.AddCompletionQueue());
  auto server = builder.BuildAndStart();
  if (!server || selected == 0) {
    std::fprintf(stderr, "bare_session_server: cannot listen on 127.0.0.1:%d\n", port);
    return 1;
  }
  std::vector<std::thread> threads;
  for (auto& q : queues) {
    new Stream(&service, q.get());
    threads.emplace_back([cq = q.get()] {
      void* tag = nullptr;
      bool ok = false;
      while (cq->Next(&tag, &ok)) Stream::Handle(tag, ok);
    });
  }
  std::printf("bare_session_server listening on 127.0.0.1:%d\n", selected);
  std::fflush(stdout);
  server->Wait();  // until killed: a benchmark's process
  return 0;
}
