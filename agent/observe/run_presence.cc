#include "agent/observe/run_presence.h"

#include <unistd.h>

#include <filesystem>

#include <spdlog/spdlog.h>

#include "agent/hangs/python_hook.h"
#include "base/files.h"

namespace crun::agent {

const char* PythonWorkerModuleSource();  // generated from worker_sdk/python/crun_worker.py

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
  const std::string sdk = log_dir_ + "/python-sdk";
  if (std::filesystem::create_directories(sdk, ec);
      !ec && WriteWholeFile(sdk + "/crun_worker.py", PythonWorkerModuleSource())) {
    python_sdk_dir_ = sdk;
  } else {
    spdlog::warn("cannot write {}/crun_worker.py: Python workers cannot import crun_worker", sdk);
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
  if (!python_sdk_dir_.empty()) std::filesystem::remove_all(python_sdk_dir_, ec);
}

}  // namespace crun::agent
