#include "launcher/logging.h"

#include <grpc/support/log.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

namespace crun::launcher {
namespace {

// gRPC's own log lines (e.g. its bind attempts) are debug detail: crun reports the errors that
// matter in its own words.
void GrpcLog(gpr_log_func_args* args) {
  spdlog::debug("grpc: {} ({}:{})", args->message, args->file, args->line);
}

}  // namespace

void SetUpLogging(const std::string& command, const std::string& level) {
  auto logger = spdlog::stderr_logger_mt("crun");
  logger->set_pattern("[crun " + command + "] %Y-%m-%dT%H:%M:%S.%e %^%l%$: %v");
  logger->set_level(spdlog::level::from_str(level));
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
  gpr_set_log_function(GrpcLog);
}

}  // namespace crun::launcher
