#include "agent/failures/report_format.h"

#include "agent/hangs/hang_watch.h"

#include <chrono>
#include <fstream>
#include <set>
#include <sstream>

namespace crun::agent {
namespace {

std::string Indent(const std::string& text, const std::string& pad) {
  std::stringstream in(text);
  std::string line, out;
  while (std::getline(in, line)) out += pad + line + "\n";
  return out;
}

void AppendBlock(std::string& out, const report::WorkerFailure& f, const std::string& host,
                 const ReportContext& c) {
  out += "  time      : " + report::IsoTime(f) + "\n";
  out += "  host      : " + host + "\n";
  out += "  rank      : " + std::to_string(f.rank) + " (local rank " +
         std::to_string(f.local_rank) + ", role " + c.role + ")\n";
  out += "  pid       : " + std::to_string(f.pid) + "\n";
  if (!f.hang.empty()) out += "  hang      : " + f.hang + "\n";
  if (!f.slow.empty()) out += "  slow      : " + f.slow + "\n";
  const bool stopped = !f.hang.empty() || !f.slow.empty();
  out += "  exit      : " + ExitOf(f).Describe() + (stopped ? " (stopped by crun)" : "") +
         (f.oom.empty() ? "" : ": " + f.oom) + "\n";
  const bool error = WroteErrorFile(f);
  out += "  error file: " + (error ? f.error_file : std::string("<none written>")) + "\n";
  if (error) {
    out += "  error     : " + f.message + "\n";
    if (!f.traceback.empty()) out += "  traceback :\n" + Indent(f.traceback, "    ");
  } else if (!f.stderr_tail.empty()) {
    out += "  last stderr lines:\n";
    for (const auto& line : f.stderr_tail) out += "    " + line + "\n";
  }
}

}  // namespace

ExitStatus ExitOf(const report::WorkerFailure& f) {
  return f.signal ? ExitStatus{true, *f.signal} : ExitStatus{false, f.exit_code.value_or(0)};
}

void SetExit(report::WorkerFailure& f, ExitStatus exit) {
  f.exit_code.reset();
  f.signal.reset();
  (exit.signaled ? f.signal : f.exit_code) = exit.value;
}

std::int64_t NowUnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

bool ReadErrorFile(const std::string& path, report::WorkerFailure& f) {
  if (path.empty()) return false;
  std::ifstream in(path);
  if (!in) return false;
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("message")) return false;
  f.message.clear();
  f.traceback.clear();
  const auto& m = j["message"];
  if (m.is_object()) {  // {"message": {"message": "...", "extraInfo": {"py_callstack": ...}}}
    if (m.contains("message") && m["message"].is_string()) f.message = m["message"];
    if (m.contains("extraInfo") && m["extraInfo"].is_object() &&
        m["extraInfo"].contains("py_callstack") && m["extraInfo"]["py_callstack"].is_string()) {
      f.traceback = m["extraInfo"]["py_callstack"];
    }
  } else if (m.is_string()) {  // the newer flat format
    f.message = m;
  }
  f.error_json = j.dump();
  return true;
}

namespace {

// The module a Python worker failed to import ("No module named 'torch'"), if that is how the
// record reads.
std::optional<std::string> MissingModule(const report::WorkerFailure& f) {
  static const std::string kMarker = "No module named '";
  auto find = [](const std::string& text) -> std::optional<std::string> {
    const auto at = text.find(kMarker);
    if (at == std::string::npos) return std::nullopt;
    const auto start = at + kMarker.size();
    const auto end = text.find('\'', start);
    if (end == std::string::npos) return std::nullopt;
    return text.substr(start, end - start);
  };
  if (auto m = find(f.message)) return m;
  for (auto it = f.stderr_tail.rbegin(); it != f.stderr_tail.rend(); ++it) {
    if (auto m = find(*it)) return m;
  }
  return std::nullopt;
}

// A CUDA out-of-memory error, from the worker's traceback: the exception line of its error
// file's message, else of its last stderr lines ("torch.OutOfMemoryError: CUDA out of memory.
// Tried to allocate ..."; PyTorch 1.13 raises it as a RuntimeError with the same words).
std::optional<std::string> CudaOutOfMemory(const report::WorkerFailure& f) {
  auto oom = [](const std::string& line) {
    return line.find("CUDA out of memory") != std::string::npos ||
           line.find("CUDA error: out of memory") != std::string::npos;
  };
  if (oom(f.message)) return f.message;
  for (auto it = f.stderr_tail.rbegin(); it != f.stderr_tail.rend(); ++it) {
    if (oom(*it)) return *it;
  }
  return std::nullopt;
}

}  // namespace

std::string FormatReport(const ReportContext& c, const report::FailureReport& report) {
  const auto& failures = report.failures;
  const std::string& host = report.host.empty() ? c.host : report.host;
  const std::string rule(72, '=');
  std::string out = rule + "\n";
  out += "crun: " + c.entrypoint + " FAILED (run " + c.run_id + ", attempt " +
         std::to_string(c.attempt) + ", " + std::to_string(c.max_restarts) + " restarts allowed)\n";
  out += std::string(72, '-') + "\nRoot cause (first failure):\n";
  if (!failures.empty()) AppendBlock(out, failures.front(), host, c);
  if (const auto module = failures.empty() || c.interpreter.empty()
                              ? std::nullopt
                              : MissingModule(failures.front())) {
    const std::string top = module->substr(0, module->find('.'));
    out +=
        "  hint      : the workers ran " + c.interpreter + ", which cannot import '" + top +
        "'; set PYTHON_EXEC to the Python that has it (e.g. PYTHON_EXEC=$VIRTUAL_ENV/bin/python) "
        "or activate its environment before crun\n";
  }
  if (const auto oom = failures.empty() ? std::nullopt : CudaOutOfMemory(failures.front())) {
    // PyTorch's message runs to several hundred characters: its first 160 (the size asked
    // for and the device's capacity) are the cause; the stderr lines above hold the rest.
    constexpr std::size_t kShown = 160;
    const std::string shown = oom->size() > kShown ? oom->substr(0, kShown) + " ..." : *oom;
    out += "  cause     : CUDA out of memory on its GPU (from its traceback: " + shown + ")\n";
  }
  if (c.hang != nullptr) out += std::string(72, '-') + "\n" + FormatHang(*c.hang);
  out += std::string(72, '-') + "\nOther failures:";
  if (failures.size() <= 1) out += " none";
  out += "\n";
  for (std::size_t i = 1; i < failures.size(); ++i) {
    const auto& f = failures[i];
    out += "  rank " + std::to_string(f.rank) + " on " + host + " (local rank " +
           std::to_string(f.local_rank) + ", pid " + std::to_string(f.pid) +
           "): " + (f.hang.empty() ? "" : "hung, " + f.hang + "; ") +
           (f.slow.empty() ? "" : "slow, " + f.slow + "; ") + ExitOf(f).Describe() +
           (f.oom.empty() ? "" : ": " + f.oom) + " at " + report::IsoTime(f) + "\n";
  }
  return out + rule + "\n";
}

nlohmann::json ReportJson(const ReportContext& c, const report::FailureReport& report) {
  nlohmann::json j;
  j["run_id"] = c.run_id;
  j["host"] = c.host;
  j["role"] = c.role;
  j["entrypoint"] = c.entrypoint;
  j["attempt"] = c.attempt;
  j["max_restarts"] = c.max_restarts;
  j["failures"] = report::FileJson(report, c.host);
  if (c.hang != nullptr) j["hang"] = HangJson(*c.hang);
  return j;
}

}  // namespace crun::agent
