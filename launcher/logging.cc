#include "launcher/logging.h"

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

namespace crun::launcher {

void SetUpLogging(const std::string& command, const std::string& level) {
  auto logger = spdlog::stderr_logger_mt("crun");
  logger->set_pattern("[crun " + command + "] %Y-%m-%dT%H:%M:%S.%e %^%l%$: %v");
  logger->set_level(spdlog::level::from_str(level));
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
}

}  // namespace crun::launcher
