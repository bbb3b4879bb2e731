#include "agent/failure_report.h"

#include "agent/hangs/hang_watch.h"

#include <ctime>
#include <fstream>
#include <set>
#include <sstream>

namespace crun::agent {
namespace {

std::string IsoTime(std::chrono::system_clock::time_point t) {
  const std::time_t secs = std::chrono::system_clock::to_time_t(t);
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count() % 1000;
  std::tm tm{};
  ::gmtime_r(&secs, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  char out[80];
  std::snprintf(out, sizeof out, "%s.%03lldZ", buf, static_cast<long long>(ms));
  return out;
}

std::string Indent(const std::string& text, const std::string& pad) {
  std::stringstream in(text);
  std::string line, out;
  while (std::getline(in, line)) out += pad + line + "\n";
  return out;
}

void AppendBlock(std::string& out, const FailureRecord& f, const ReportContext& c) {
  out += "  time      : " + IsoTime(f.when) + "\n";
  out += "  host      : " + (f.host.empty() ? c.host : f.host) + "\n";
  out += "  rank      : " + std::to_string(f.rank) + " (local rank " +
         std::to_string(f.local_rank) + ", role " + c.role + ")\n";
  out += "  pid       : " + std::to_string(f.pid) + "\n";
  if (!f.hang.empty()) out += "  hang      : " + f.hang + "\n";
  out += "  exit      : " + f.exit.Describe() + (f.hang.empty() ? "" : " (stopped by crun)") +
         (f.oom.empty() ? "" : ": " + f.oom) + "\n";
  const auto& error = f.error;
  out += "  error file: " + (error ? f.error_file : std::string("<none written>")) + "\n";
  if (error) {
    out += "  error     : " + error->message + "\n";
    if (!error->traceback.empty()) out += "  traceback :\n" + Indent(error->traceback, "    ");
  } else if (!f.stderr_tail.empty()) {
    out += "  last stderr lines:\n";
    for (const auto& line : f.stderr_tail) out += "    " + line + "\n";
  }
}

}  // namespace

std::optional<ErrorFileContent> ReadErrorFile(const std::string& path) {
  if (path.empty()) return std::nullopt;
  std::ifstream in(path);
  if (!in) return std::nullopt;
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("message")) return std::nullopt;
  ErrorFileContent c;
  c.raw = j;
  const auto& m = j["message"];
  if (m.is_object()) {  // {"message": {"message": "...", "extraInfo": {"py_callstack": ...}}}
    if (m.contains("message") && m["message"].is_string()) c.message = m["message"];
    if (m.contains("extraInfo") && m["extraInfo"].is_object() &&
        m["extraInfo"].contains("py_callstack") && m["extraInfo"]["py_callstack"].is_string()) {
      c.traceback = m["extraInfo"]["py_callstack"];
    }
  } else if (m.is_string()) {  // the newer flat format
    c.message = m;
  }
  return c;
}

namespace {

// The module a Python worker failed to import ("No module named 'torch'"), if that is how the
// record reads.
std::optional<std::string> MissingModule(const FailureRecord& f) {
  static const std::string kMarker = "No module named '";
  auto find = [](const std::string& text) -> std::optional<std::string> {
    const auto at = text.find(kMarker);
    if (at == std::string::npos) return std::nullopt;
    const auto start = at + kMarker.size();
    const auto end = text.find('\'', start);
    if (end == std::string::npos) return std::nullopt;
    return text.substr(start, end - start);
  };
  if (f.error) {
    if (auto m = find(f.error->message)) return m;
  }
  for (auto it = f.stderr_tail.rbegin(); it != f.stderr_tail.rend(); ++it) {
    if (auto m = find(*it)) return m;
  }
  return std::nullopt;
}

}  // namespace

std::string FormatReport(const ReportContext& c, const std::vector<FailureRecord>& failures) {
  const std::string rule(72, '=');
  std::string out = rule + "\n";
  out += "crun: " + c.entrypoint + " FAILED (run " + c.run_id + ", attempt " +
         std::to_string(c.attempt) + ", " + std::to_string(c.max_restarts) + " restarts allowed)\n";
  out += std::string(72, '-') + "\nRoot cause (first failure):\n";
  if (!failures.empty()) AppendBlock(out, failures.front(), c);
  if (const auto module = failures.empty() || c.interpreter.empty()
                              ? std::nullopt
                              : MissingModule(failures.front())) {
    const std::string top = module->substr(0, module->find('.'));
    out +=
        "  hint      : the workers ran " + c.interpreter + ", which cannot import '" + top +
        "'; set PYTHON_EXEC to the Python that has it (e.g. PYTHON_EXEC=$VIRTUAL_ENV/bin/python) "
        "or activate its environment before crun\n";
  }
  if (c.hang != nullptr) out += std::string(72, '-') + "\n" + FormatHang(*c.hang);
  out += std::string(72, '-') + "\nOther failures:";
  if (failures.size() <= 1) out += " none";
  out += "\n";
  for (std::size_t i = 1; i < failures.size(); ++i) {
    const auto& f = failures[i];
    out += "  rank " + std::to_string(f.rank) + " on " + (f.host.empty() ? c.host : f.host) +
           " (local rank " + std::to_string(f.local_rank) + ", pid " + std::to_string(f.pid) +
           "): " + (f.hang.empty() ? "" : "hung, " + f.hang + "; ") + f.exit.Describe() +
           (f.oom.empty() ? "" : ": " + f.oom) + " at " + IsoTime(f.when) + "\n";
  }
  return out + rule + "\n";
}

nlohmann::json ReportJson(const ReportContext& c, const std::vector<FailureRecord>& failures) {
  nlohmann::json j;
  j["run_id"] = c.run_id;
  j["host"] = c.host;
  j["role"] = c.role;
  j["entrypoint"] = c.entrypoint;
  j["attempt"] = c.attempt;
  j["max_restarts"] = c.max_restarts;
  j["failures"] = nlohmann::json::array();
  for (const auto& f : failures) {
    nlohmann::json e;
    e["time"] = IsoTime(f.when);
    e["host"] = f.host.empty() ? c.host : f.host;
    e["rank"] = f.rank;
    e["local_rank"] = f.local_rank;
    e["pid"] = f.pid;
    e["exit_code"] = f.exit.signaled ? nlohmann::json(nullptr) : nlohmann::json(f.exit.value);
    e["signal"] =
        f.exit.signaled ? nlohmann::json(SignalName(f.exit.value)) : nlohmann::json(nullptr);
    e["error_file"] = f.error_file;
    if (!f.hang.empty()) e["hang"] = f.hang;
    if (!f.oom.empty()) e["oom"] = f.oom;
    if (const auto& err = f.error) {
      e["message"] = err->message;
      e["traceback"] = err->traceback;
    } else {
      e["stderr_tail"] = f.stderr_tail;
    }
    j["failures"].push_back(e);
  }
  if (c.hang != nullptr) j["hang"] = HangJson(*c.hang);
  return j;
}

report::FailureReport ToReport(const std::string& node_id,
                               const std::vector<FailureRecord>& failures) {
  report::FailureReport r;
  r.node_id = node_id;
  if (!failures.empty()) r.host = failures.front().host;
  for (const auto& f : failures) {
    report::WorkerFailure w;
    w.time_unix_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(f.when.time_since_epoch()).count();
    w.rank = f.rank;
    w.local_rank = f.local_rank;
    w.pid = f.pid;
    if (f.exit.signaled) {
      w.signal = f.exit.value;
    } else {
      w.exit_code = f.exit.value;
    }
    if (f.error) {
      w.message = f.error->message;
      w.traceback = f.error->traceback;
    }
    w.stderr_tail = f.stderr_tail;
    w.error_file = f.error_file;
    w.hang = f.hang;
    w.oom = f.oom;
    r.failures.push_back(std::move(w));
  }
  return r;
}

std::vector<FailureRecord> FromReport(const report::FailureReport& r) {
  std::vector<FailureRecord> out;
  for (const auto& w : r.failures) {
    FailureRecord f;
    f.host = r.host;
    f.rank = w.rank;
    f.local_rank = w.local_rank;
    f.pid = w.pid;
    f.exit = w.signal ? ExitStatus{true, *w.signal} : ExitStatus{false, w.exit_code.value_or(0)};
    f.when = std::chrono::system_clock::time_point(std::chrono::milliseconds(w.time_unix_ms));
    f.error_file = w.error_file;
    f.hang = w.hang;
    f.oom = w.oom;
    if (!w.message.empty() || !w.traceback.empty()) {
      ErrorFileContent e;
      e.message = w.message;
      e.traceback = w.traceback;
      f.error = std::move(e);
    }
    f.stderr_tail = w.stderr_tail;
    out.push_back(std::move(f));
  }
  return out;
}

}  // namespace crun::agent
