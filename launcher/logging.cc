#include "launcher/logging.h"

#include <grpc/support/log.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "base/fd_writer.h"

namespace crun::launcher {
namespace {

// gRPC's own log lines (e.g. its bind attempts) are debug detail: crun reports the errors that
// matter in its own words.
void GrpcLog(gpr_log_func_args* args) {
  spdlog::debug("grpc: {} ({}:{})", args->message, args->file, args->line);
}

// 1234567 -> "1,234,567".
std::string Grouped(std::uint64_t n) {
  std::string digits = std::to_string(n);
  for (int i = static_cast<int>(digits.size()) - 3; i > 0; i -= 3) {
    digits.insert(static_cast<std::size_t>(i), ",");
  }
  return digits;
}

// crun's log goes through crun's stderr writer (base/fd_writer.h): a thread that logs never
// waits for a stalled reader of stderr, so that heartbeats, keep-alives and the agent's event
// loop go on. While the writer is full, warnings and lesser lines are dropped and counted, and
// the count is said once the reader catches up; errors are never dropped (they wait in the
// queue for the reader, as the failure report does).
class StderrSink final : public spdlog::sinks::base_sink<std::mutex> {
 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t buf;
    formatter_->format(msg, buf);
    const std::string_view line(buf.data(), buf.size());
    FdWriter& err = FdWriter::Stderr();
    if (dropped_ > 0) {
      const std::string note = "crun: " + Grouped(dropped_) + " log line" +
                               (dropped_ == 1 ? "" : "s") + " dropped while stderr was blocked\n";
      if (err.TryWrite(note)) {
        dropped_ = 0;
      } else if (msg.level < spdlog::level::err) {
        ++dropped_;
        return;
      }
    }
    if (msg.level >= spdlog::level::err) {
      err.Write(line);
    } else if (!err.TryWrite(line)) {
      ++dropped_;
    }
  }
  void flush_() override {}  // the writer writes as soon as it can; FdWriter::Flush waits

 private:
  std::uint64_t dropped_ = 0;
};

}  // namespace

void SetUpLogging(const std::string& command, const std::string& level) {
  auto logger = std::make_shared<spdlog::logger>("crun", std::make_shared<StderrSink>());
  logger->set_pattern("[crun " + command + "] %Y-%m-%dT%H:%M:%S.%e %^%l%$: %v");
  logger->set_level(spdlog::level::from_str(level));
  spdlog::set_default_logger(logger);
  gpr_set_log_function(GrpcLog);
}

void FlushOutput() {
  FdWriter::Stdout().Flush();
  FdWriter::Stderr().Flush();
}

}  // namespace crun::launcher
