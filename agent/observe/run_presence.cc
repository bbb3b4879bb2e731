#include "agent/observe/run_presence.h"

#include <unistd.h>

#include <filesystem>

#include <spdlog/spdlog.h>

#include "agent/hangs/python_hook.h"
#include "base/files.h"

namespace crun::agent {

void RunPresence::WritePythonHook() {
  if (hook_tried_ || interpreter_.empty()) return;
  hook_tried_ = true;
  const std::string dir = log_dir_ + "/python";
  std::error_code ec;
  if (std::filesystem::create_directories(dir, ec);
      !ec && WriteWholeFile(dir + "/sitecustomize.py", PythonHookSource())) {
    python_dir_ = dir;
  } else {
    spdlog::warn("cannot write {}/sitecustomize.py: Python workers' stacks need py-spy", dir);
  }
}

void RunPresence::Announce(ControlServer::Handler handler) {
  if (announced_) return;
  announced_ = true;
  auto control = ControlServer::Listen(io_, std::move(handler));
  if (control.ok()) {
    control_ = std::move(control).value();
  } else {
    spdlog::warn("{}: `crun stacks {}` will not reach this crun", control.status().message(),
                 ::getpid());
  }
  if (!WriteWholeFile(log_dir_ + "/crun.pid", std::to_string(::getpid()) + "\n")) {
    spdlog::warn("cannot write {}/crun.pid", log_dir_);
  }
}

void RunPresence::Close() {
  control_.reset();
  std::error_code ec;
  std::filesystem::remove(log_dir_ + "/crun.pid", ec);
  if (!python_dir_.empty()) std::filesystem::remove_all(python_dir_, ec);
}

}  // namespace crun::agent
