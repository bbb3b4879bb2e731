#include "rendezvous/report/report.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <ctime>
#include <stdexcept>

#include "base/signals.h"

namespace crun::report {
namespace {

using nlohmann::json;
using Ordered = nlohmann::ordered_json;  // in the .proto's field order

// Where a report's JSON goes: the store (ToJson: protobuf's JSON mapping, a field at its
// default left out) or failure.json (FileJson: every key there, for users' tools).
enum class Layout { kStored, kFile };

// One failure as JSON: each field of WorkerFailure once, in the .proto's order, with how each
// layout writes it. `host` is the file's (the store keeps it once, on the report).
template <class Json>
Json EncodeFailure(const WorkerFailure& w, Layout layout, const std::string& host) {
  const bool file = layout == Layout::kFile;
  Json f = Json::object();
  const auto put = [&](const char* name, const auto& value, bool at_default) {
    if (file || !at_default) f[name] = value;
  };
  if (file) {
    f["time"] = IsoTime(w);
    f["host"] = host;
  } else {
    put("time", w.time, w.time.empty());
  }
  put("rank", w.rank, w.rank == 0);
  put("local_rank", w.local_rank, w.local_rank == 0);
  put("pid", w.pid, w.pid == 0);
  if (file) {  // one of the two null; "neither" reads as exit code 0, as ExitCodeOf does
    f["exit_code"] = w.signal ? Json(nullptr) : Json(w.exit_code.value_or(0));
    f["signal"] = w.signal ? Json(SignalName(*w.signal)) : Json(nullptr);
  } else {  // exit code 0 is written: it is not "no exit"
    if (w.exit_code) f["exit_code"] = *w.exit_code;
    if (w.signal) f["signal"] = *w.signal;
  }
  // The file gives the error file's words, or else the stderr lines: the one that says why.
  const bool error_file = WroteErrorFile(w);
  if (!file || error_file) {
    put("message", w.message, w.message.empty());
    put("traceback", w.traceback, w.traceback.empty());
  }
  if (!file || !error_file) put("stderr_tail", w.stderr_tail, w.stderr_tail.empty());
  put("error_file", w.error_file, w.error_file.empty());
  if (!file && w.time_unix_ms != 0) f["time_unix_ms"] = std::to_string(w.time_unix_ms);
  if (!w.hang.empty()) f["hang"] = w.hang;
  if (!w.oom.empty()) f["oom"] = w.oom;
  if (!w.slow.empty()) f["slow"] = w.slow;
  return f;
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
  w.slow = Field<std::string>(f, "slow");
  return w;
}

}  // namespace

int ExitCodeOf(const FailureReport& report) {
  if (report.failures.empty()) return 1;
  const auto& f = report.failures.front();
  if (f.signal) return 128 + *f.signal;
  return f.exit_code.value_or(0) != 0 ? *f.exit_code : 1;
}

std::string DescribeEnd(const WorkerFailure& f) {
  if (!f.hang.empty()) return "a hang: " + f.hang;
  if (!f.slow.empty()) return "a slow rank: " + f.slow;
  std::string how = DescribeExit(f.signal.has_value(), f.signal.value_or(f.exit_code.value_or(0)));
  if (!f.oom.empty()) how += " (" + f.oom + ")";
  return how;
}

std::string DescribeCause(const FailureReport& report) {
  const std::string on = report.host.empty() ? "" : " on " + report.host;
  if (report.failures.empty()) return "a worker" + on + " failed";
  const auto& f = report.failures.front();
  return "rank " + std::to_string(f.rank) + " (local rank " + std::to_string(f.local_rank) + ")" +
         on + " failed with " + DescribeEnd(f);
}

std::string Describe(const FailureReport& report) {
  std::string out = DescribeCause(report);
  if (!report.failures.empty() && !report.failures.front().message.empty()) {
    out += ": " + report.failures.front().message;
  }
  return out;
}

std::string LastTracebackLine(const WorkerFailure& f) {
  if (!f.message.empty()) return f.message;
  // Python ends a traceback with the exception's line, the first after it that is not indented.
  const auto& tail = f.stderr_tail;
  const auto start = std::find_if(tail.rbegin(), tail.rend(), [](const std::string& line) {
    return line.rfind("Traceback (most recent call last):", 0) == 0;
  });
  if (start == tail.rend()) return "";
  for (auto it = start.base(); it != tail.end(); ++it) {
    if (!it->empty() && it->front() != ' ' && it->front() != '\t') return *it;
  }
  return "";
}

std::string FailureWay(const FailureReport& report) {
  if (report.failures.empty()) return "";
  const auto& f = report.failures.front();
  // A hang's words carry how long it was silent, a slow rank's its ratio: each is one way,
  // whatever the figure.
  const std::string end = !f.hang.empty()   ? "a hang"
                          : !f.slow.empty() ? "a slow rank"
                                            : DescribeEnd(f);
  const std::string line = LastTracebackLine(f);
  return line.empty() ? end : end + ": " + line;
}

bool WroteErrorFile(const WorkerFailure& f) {
  return !f.error_json.empty() || !f.message.empty() || !f.traceback.empty();
}

std::string IsoTime(const WorkerFailure& f) {
  const std::time_t secs = static_cast<std::time_t>(f.time_unix_ms / 1000);
  const auto ms = f.time_unix_ms % 1000;
  std::tm tm{};
  ::gmtime_r(&secs, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  char out[80];
  std::snprintf(out, sizeof out, "%s.%03lldZ", buf, static_cast<long long>(ms));
  return out;
}

std::string ToJson(const FailureReport& report) {
  Ordered out = Ordered::object();
  if (!report.host.empty()) out["host"] = report.host;
  if (!report.failures.empty()) {
    Ordered& failures = out["failures"] = Ordered::array();
    for (const auto& w : report.failures) {
      failures.push_back(EncodeFailure<Ordered>(w, Layout::kStored, report.host));
    }
  }
  if (!report.node_id.empty()) out["node_id"] = report.node_id;
  if (report.before_progress) out["before_progress"] = true;
  return out.dump(-1, ' ', false, Ordered::error_handler_t::replace);
}

json FileJson(const FailureReport& report, const std::string& default_host) {
  const std::string& host = report.host.empty() ? default_host : report.host;
  json out = json::array();
  for (const auto& w : report.failures) out.push_back(EncodeFailure<json>(w, Layout::kFile, host));
  return out;
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
    r.before_progress = Field<bool>(in, "before_progress");
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
