#include "agent/failure_proto.h"

namespace crun::agent {

v1::FailureReport FailureReportToProto(const std::string& node_id,
                                       const std::vector<FailureRecord>& failures) {
  v1::FailureReport r;
  r.set_node_id(node_id);
  if (!failures.empty()) r.set_host(failures.front().host);
  for (const auto& f : failures) {
    auto* w = r.add_failures();
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(f.when.time_since_epoch()).count();
    w->set_time_unix_ms(ms);
    w->set_rank(f.rank);
    w->set_local_rank(f.local_rank);
    w->set_pid(f.pid);
    if (f.exit.signaled) {
      w->set_signal(f.exit.value);
    } else {
      w->set_exit_code(f.exit.value);
    }
    if (f.error) {
      w->set_message(f.error->message);
      w->set_traceback(f.error->traceback);
    }
    for (const auto& line : f.stderr_tail) w->add_stderr_tail(line);
    w->set_error_file(f.error_file);
    w->set_hang(f.hang);
    w->set_oom(f.oom);
  }
  return r;
}

std::vector<FailureRecord> FailureReportFromProto(const v1::FailureReport& r) {
  std::vector<FailureRecord> out;
  for (const auto& w : r.failures()) {
    FailureRecord f;
    f.host = r.host();
    f.rank = w.rank();
    f.local_rank = w.local_rank();
    f.pid = w.pid();
    f.exit = w.exit_case() == v1::WorkerFailure::kSignal ? ExitStatus{true, w.signal()}
                                                         : ExitStatus{false, w.exit_code()};
    f.when = std::chrono::system_clock::time_point(std::chrono::milliseconds(w.time_unix_ms()));
    f.error_file = w.error_file();
    f.hang = w.hang();
    f.oom = w.oom();
    if (!w.message().empty() || !w.traceback().empty()) {
      ErrorFileContent e;
      e.message = w.message();
      e.traceback = w.traceback();
      f.error = std::move(e);
    }
    f.stderr_tail.assign(w.stderr_tail().begin(), w.stderr_tail().end());
    out.push_back(std::move(f));
  }
  return out;
}

}  // namespace crun::agent
