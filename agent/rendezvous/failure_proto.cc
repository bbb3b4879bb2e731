#include "agent/rendezvous/failure_proto.h"

#include <charconv>
#include <nlohmann/json.hpp>

namespace crun::agent {

using nlohmann::json;
using Ordered = nlohmann::ordered_json;  // written in the .proto's field order, as protobuf does

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

namespace {

void PutText(Ordered& o, const char* name, const std::string& value) {
  if (!value.empty()) o[name] = value;
}

void PutNumber(Ordered& o, const char* name, std::int32_t value) {
  if (value != 0) o[name] = value;
}

// A JSON field that must have the type asked for; absent is the default.
template <typename T>
T Field(const json& o, const char* name) {
  const auto it = o.find(name);
  return it == o.end() ? T{} : it->template get<T>();
}

std::int64_t Int64Field(const json& o, const char* name) {
  const auto it = o.find(name);
  if (it == o.end()) return 0;
  if (!it->is_string()) return it->get<std::int64_t>();
  const auto& s = it->get_ref<const std::string&>();
  std::int64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) {
    throw std::invalid_argument(std::string(name) + " is not a whole number: " + s);
  }
  return v;
}

}  // namespace

std::string FailureReportToJson(const v1::FailureReport& r) {
  Ordered out = Ordered::object();
  PutText(out, "host", r.host());
  if (r.failures_size() > 0) {
    Ordered& failures = out["failures"] = Ordered::array();
    for (const auto& w : r.failures()) {
      Ordered f = Ordered::object();
      PutText(f, "time", w.time());
      PutNumber(f, "rank", w.rank());
      PutNumber(f, "local_rank", w.local_rank());
      PutNumber(f, "pid", w.pid());
      // A oneof member is written when set, even at 0: exit code 0 is not "no exit".
      if (w.exit_case() == v1::WorkerFailure::kExitCode) f["exit_code"] = w.exit_code();
      if (w.exit_case() == v1::WorkerFailure::kSignal) f["signal"] = w.signal();
      PutText(f, "message", w.message());
      PutText(f, "traceback", w.traceback());
      if (w.stderr_tail_size() > 0) {
        f["stderr_tail"] = std::vector<std::string>(w.stderr_tail().begin(), w.stderr_tail().end());
      }
      PutText(f, "error_file", w.error_file());
      if (w.time_unix_ms() != 0) f["time_unix_ms"] = std::to_string(w.time_unix_ms());
      PutText(f, "hang", w.hang());
      PutText(f, "oom", w.oom());
      failures.push_back(std::move(f));
    }
  }
  PutText(out, "node_id", r.node_id());
  return out.dump(-1, ' ', false, Ordered::error_handler_t::replace);
}

std::optional<v1::FailureReport> FailureReportFromJson(const std::string& text) {
  try {
    const json in = json::parse(text);
    if (!in.is_object()) return std::nullopt;
    v1::FailureReport r;
    r.set_host(Field<std::string>(in, "host"));
    r.set_node_id(Field<std::string>(in, "node_id"));
    if (const auto it = in.find("failures"); it != in.end()) {
      for (const auto& f : it->get_ref<const json::array_t&>()) {
        if (!f.is_object()) return std::nullopt;
        auto* w = r.add_failures();
        w->set_time(Field<std::string>(f, "time"));
        w->set_rank(Field<std::int32_t>(f, "rank"));
        w->set_local_rank(Field<std::int32_t>(f, "local_rank"));
        w->set_pid(Field<std::int32_t>(f, "pid"));
        if (f.contains("signal")) {
          w->set_signal(Field<std::int32_t>(f, "signal"));
        } else if (f.contains("exit_code")) {
          w->set_exit_code(Field<std::int32_t>(f, "exit_code"));
        }
        w->set_message(Field<std::string>(f, "message"));
        w->set_traceback(Field<std::string>(f, "traceback"));
        for (const auto& line : Field<std::vector<std::string>>(f, "stderr_tail")) {
          w->add_stderr_tail(line);
        }
        w->set_error_file(Field<std::string>(f, "error_file"));
        w->set_time_unix_ms(Int64Field(f, "time_unix_ms"));
        w->set_hang(Field<std::string>(f, "hang"));
        w->set_oom(Field<std::string>(f, "oom"));
      }
    }
    return r;
  } catch (const std::exception&) {  // not JSON, or a field of another type
    return std::nullopt;
  }
}

}  // namespace crun::agent
