// A real etcd server (Debian's etcd-server) for one test: its own data directory and loopback
// ports, started in a process group of its own and killed with it. Ready once a client read
// answers (never a sleep).
#pragma once

#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include "rendezvous/etcd/client.h"
#include "tests/unit/temp_dir.h"

namespace crun::testing {

// A port nobody listens on now (bound, read back, closed).
inline std::uint16_t FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) throw std::runtime_error("bind");
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

class EtcdProcess {
 public:
  EtcdProcess() : client_port_(FreePort()), peer_port_(FreePort()) { Start(); }
  ~EtcdProcess() { Kill(); }

  std::string endpoint() const { return "127.0.0.1:" + std::to_string(client_port_); }
  const std::string& data_dir() const { return dir_.path; }

  void Start() {
    const std::string client = "http://127.0.0.1:" + std::to_string(client_port_);
    const std::string peer = "http://127.0.0.1:" + std::to_string(peer_port_);
    std::vector<std::string> args = {"etcd",
                                     "--name=t",
                                     "--data-dir=" + dir_.path + "/data",
                                     "--listen-client-urls=" + client,
                                     "--advertise-client-urls=" + client,
                                     "--listen-peer-urls=" + peer,
                                     "--initial-advertise-peer-urls=" + peer,
                                     "--initial-cluster=t=" + peer,
                                     "--logger=zap",
                                     "--log-level=error",
                                     "--log-outputs=" + dir_.path + "/etcd.log"};
    pid_ = ::fork();
    if (pid_ == 0) {
      ::setpgid(0, 0);
      // A test killed at its deadline (no destructors run) takes its etcd with it.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execvp("etcd", argv.data());
      std::_Exit(127);
    }
    etcd::ClientOptions o;
    o.endpoints = {endpoint()};
    auto c = etcd::Client::Connect(o, etcd::Clock::now() + std::chrono::seconds(30));
    if (!c.ok()) {
      Kill();
      std::ifstream log(dir_.path + "/etcd.log");
      std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
      if (text.size() > 2000) text = text.substr(text.size() - 2000);
      throw std::runtime_error("etcd did not start (is etcd-server installed?): " +
                               c.status().message() + "\netcd's log:\n" + text);
    }
  }

  // SIGKILL and reaped: the data directory stays for a Start() again.
  void Kill() {
    if (pid_ <= 0) return;
    ::kill(-pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  TempDir dir_{"crun_etcd"};
  std::uint16_t client_port_;
  std::uint16_t peer_port_;
  pid_t pid_ = -1;
};

}  // namespace crun::testing
