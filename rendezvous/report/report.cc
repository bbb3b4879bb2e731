#include "rendezvous/report/report.h"

#include <charconv>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace crun::report {
namespace {

using nlohmann::json;
using Ordered = nlohmann::ordered_json;  // in the .proto's field order

void PutText(Ordered& o, const char* name, const std::string& value) {
  if (!value.empty()) o[name] = value;
}

void PutNumber(Ordered& o, const char* name, int value) {
  if (value != 0) o[name] = value;
}

// A field that must have the type asked for; absent is the default. Throws json's type error.
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

WorkerFailure FailureFromJson(const json& f) {
  if (!f.is_object()) throw std::invalid_argument("a failure is not an object");
  WorkerFailure w;
  w.time = Field<std::string>(f, "time");
  w.rank = Field<int>(f, "rank");
  w.local_rank = Field<int>(f, "local_rank");
  w.pid = Field<int>(f, "pid");
  if (f.contains("signal")) {
    w.signal = Field<int>(f, "signal");
  } else if (f.contains("exit_code")) {
    w.exit_code = Field<int>(f, "exit_code");
  }
  w.message = Field<std::string>(f, "message");
  w.traceback = Field<std::string>(f, "traceback");
  w.stderr_tail = Field<std::vector<std::string>>(f, "stderr_tail");
  w.error_file = Field<std::string>(f, "error_file");
  w.time_unix_ms = Int64Field(f, "time_unix_ms");
  w.hang = Field<std::string>(f, "hang");
  w.oom = Field<std::string>(f, "oom");
  return w;
}

}  // namespace

int ExitCodeOf(const FailureReport& report) {
  if (report.failures.empty()) return 1;
  const auto& f = report.failures.front();
  if (f.signal) return 128 + *f.signal;
  return f.exit_code.value_or(0) != 0 ? *f.exit_code : 1;
}

std::string Describe(const FailureReport& report) {
  if (report.failures.empty()) return "a worker on " + report.host + " failed";
  const auto& f = report.failures.front();
  std::string how = f.signal ? "signal " + std::to_string(*f.signal)
                             : "exit code " + std::to_string(f.exit_code.value_or(0));
  if (!f.oom.empty()) how += " (" + f.oom + ")";
  if (!f.hang.empty()) how = "a hang: " + f.hang;
  std::string out = "rank " + std::to_string(f.rank) + " (local rank " +
                    std::to_string(f.local_rank) + ") on " + report.host + " failed with " + how;
  if (!f.message.empty()) out += ": " + f.message;
  return out;
}

std::string ToJson(const FailureReport& report) {
  Ordered out = Ordered::object();
  PutText(out, "host", report.host);
  if (!report.failures.empty()) {
    Ordered& failures = out["failures"] = Ordered::array();
    for (const auto& w : report.failures) {
      Ordered f = Ordered::object();
      PutText(f, "time", w.time);
      PutNumber(f, "rank", w.rank);
      PutNumber(f, "local_rank", w.local_rank);
      PutNumber(f, "pid", w.pid);
      if (w.exit_code) f["exit_code"] = *w.exit_code;
      if (w.signal) f["signal"] = *w.signal;
      PutText(f, "message", w.message);
      PutText(f, "traceback", w.traceback);
      if (!w.stderr_tail.empty()) f["stderr_tail"] = w.stderr_tail;
      PutText(f, "error_file", w.error_file);
      if (w.time_unix_ms != 0) f["time_unix_ms"] = std::to_string(w.time_unix_ms);
      PutText(f, "hang", w.hang);
      PutText(f, "oom", w.oom);
      failures.push_back(std::move(f));
    }
  }
  PutText(out, "node_id", report.node_id);
  return out.dump(-1, ' ', false, Ordered::error_handler_t::replace);
}

StatusOr<FailureReport> FromJson(std::string_view text) {
  const auto refused = [&](const std::string& why) {
    return InvalidArgument("not a failure report (" + why + "): '" +
                           std::string(text.substr(0, 200)) + "'");
  };
  const json in = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!in.is_object()) return refused("not a JSON object");
  try {
    FailureReport r;
    r.host = Field<std::string>(in, "host");
    r.node_id = Field<std::string>(in, "node_id");
    if (const auto it = in.find("failures"); it != in.end()) {
      for (const auto& f : it->get_ref<const json::array_t&>()) {
        r.failures.push_back(FailureFromJson(f));
      }
    }
    return r;
  } catch (const std::exception& e) {  // a field of another type
    return refused(e.what());
  }
}

}  // namespace crun::report
