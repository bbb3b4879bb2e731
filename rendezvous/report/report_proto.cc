#include "rendezvous/report/report_proto.h"

#include <utility>

namespace crun::report {

void ToProto(const FailureReport& r, v1::FailureReport* out) {
  out->set_host(r.host);
  out->set_node_id(r.node_id);
  out->set_before_progress(r.before_progress);
  for (const auto& f : r.failures) {
    auto* w = out->add_failures();
    w->set_time(f.time);
    w->set_rank(f.rank);
    w->set_local_rank(f.local_rank);
    w->set_pid(f.pid);
    if (f.exit_code) w->set_exit_code(*f.exit_code);
    if (f.signal) w->set_signal(*f.signal);
    w->set_message(f.message);
    w->set_traceback(f.traceback);
    for (const auto& line : f.stderr_tail) w->add_stderr_tail(line);
    w->set_error_file(f.error_file);
    w->set_time_unix_ms(f.time_unix_ms);
    w->set_hang(f.hang);
    w->set_oom(f.oom);
    w->set_slow(f.slow);
  }
}

FailureReport FromProto(const v1::FailureReport& r) {
  FailureReport out;
  out.host = r.host();
  out.node_id = r.node_id();
  out.before_progress = r.before_progress();
  out.failures.reserve(static_cast<std::size_t>(r.failures_size()));
  for (const auto& w : r.failures()) {
    WorkerFailure f;
    f.time = w.time();
    f.rank = w.rank();
    f.local_rank = w.local_rank();
    f.pid = w.pid();
    if (w.exit_case() == v1::WorkerFailure::kExitCode) f.exit_code = w.exit_code();
    if (w.exit_case() == v1::WorkerFailure::kSignal) f.signal = w.signal();
    f.message = w.message();
    f.traceback = w.traceback();
    f.stderr_tail.assign(w.stderr_tail().begin(), w.stderr_tail().end());
    f.error_file = w.error_file();
    f.time_unix_ms = w.time_unix_ms();
    f.hang = w.hang();
    f.oom = w.oom();
    f.slow = w.slow();
    out.failures.push_back(std::move(f));
  }
  return out;
}

}  // namespace crun::report
