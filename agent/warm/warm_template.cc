#include "agent/warm/warm_template.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "base/files.h"

namespace crun::agent {

// agent/warm/template.py, compiled in (warm_template_source.cc, generated).
extern const char* const kWarmTemplateSource;

namespace {

namespace asio = boost::asio;

// The template's own boot: its file runs as a module of its own, so that __main__ stays free
// for the worker's script.
constexpr char kBoot[] = "import runpy, sys; runpy.run_path(sys.argv[1], run_name='__crun_warm__')";
constexpr std::size_t kMaxReply = 1 << 16;      // the template's answers are a line of JSON
constexpr std::size_t kEnvironRoom = 16 << 10;  // see Launch()

// The environment variables that name descriptor `fd` ("CRUN_STACKS_FD=9").
std::vector<std::string> NamesOfFd(const std::vector<std::string>& envp, int fd) {
  std::vector<std::string> names;
  const std::string value = "=" + std::to_string(fd);
  for (const auto& e : envp) {
    const auto eq = e.find('=');
    if (eq == std::string::npos || e.compare(eq, std::string::npos, value) != 0) continue;
    if (eq >= 3 && e.compare(eq - 3, 3, "_FD") == 0) names.push_back(e.substr(0, eq));
  }
  return names;
}

nlohmann::json EnvJson(const std::vector<std::string>& envp) {
  nlohmann::json env = nlohmann::json::array();
  for (const auto& e : envp) {
    const auto eq = e.find('=');
    if (eq != std::string::npos) env.push_back({e.substr(0, eq), e.substr(eq + 1)});
  }
  return env;
}

// Sends `message` with descriptors `fds` (SCM_RIGHTS) on a SOCK_SEQPACKET socket.
Status SendWithFds(int sock, const std::string& message, const std::vector<int>& fds) {
  iovec iov{const_cast<char*>(message.data()), message.size()};
  std::vector<char> control(CMSG_SPACE(sizeof(int) * fds.size()));
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control.data();
  msg.msg_controllen = control.size();
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
  std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  ssize_t n;
  do {
    n = ::sendmsg(sock, &msg, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return PosixError("cannot write to the warm template", errno);
  return Status::Ok();
}

// One message from the template, waiting at most `timeout`.
StatusOr<nlohmann::json> Receive(int sock, std::chrono::milliseconds timeout) {
  pollfd p{sock, POLLIN, 0};
  int ready;
  do {
    ready = ::poll(&p, 1, static_cast<int>(timeout.count()));
  } while (ready < 0 && errno == EINTR);
  if (ready == 0) {
    return TimeoutError("the warm template did not answer within " +
                        std::to_string(timeout.count()) + " ms");
  }
  std::string buffer(kMaxReply, '\0');
  const ssize_t n = ::recv(sock, buffer.data(), buffer.size(), MSG_DONTWAIT);
  if (n < 0) return PosixError("cannot read from the warm template", errno);
  if (n == 0) return Aborted("the warm template closed its socket");
  buffer.resize(static_cast<std::size_t>(n));
  auto j = nlohmann::json::parse(buffer, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return ProtocolError("the warm template sent something that is not a JSON object");
  }
  return j;
}

Status MoveIntoCgroup(const std::string& dir, pid_t pid) {
  const int fd = ::open((dir + "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC);
  const std::string text = std::to_string(pid);
  const bool ok =
      fd >= 0 && ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  const int err = errno;
  if (fd >= 0) ::close(fd);
  if (!ok) return PosixError("cannot move pid " + text + " into the cgroup " + dir, err);
  return Status::Ok();
}

}  // namespace

std::vector<std::string> DefaultWarmModules() {
  // Each where the interpreter has it: workers that do not use torch start warm too.
  return {"torch?", "torch.distributed?", "torch.nn.parallel?", "torch._dynamo?"};
}

WarmTemplate::WarmTemplate(asio::io_context& io, WarmOptions options, const WorkerCgroup* cgroup,
                           GroupGuard* guard, ChildRegistry& children)
    : io_(io),
      options_(std::move(options)),
      cgroup_(cgroup),
      guard_(guard),
      children_(children),
      ready_deadline_(io) {}

WarmTemplate::~WarmTemplate() {
  socket_.reset();  // the template reads EOF and ends; SIGKILL makes sure
  watcher_.reset();
  if (pid_ > 0) {
    guard_->Forget(pid_);
    KillAndReap(pid_, children_);
  }
  if (!source_.empty()) ::unlink(source_.c_str());  // crun's own file; its log stays
}

void WarmTemplate::Start() {
  source_ = options_.dir + "/crun_warm.py";
  if (!WriteWholeFile(source_, kWarmTemplateSource)) {
    spdlog::warn("warm starts are off: cannot write {}; workers start cold", source_);
    state_ = State::kOff;
    return;
  }
  if (cgroup_ != nullptr) {
    auto c = AttemptCgroup::Create(*cgroup_, std::string("warm"));
    if (c.ok()) {
      own_cgroup_ = std::move(c).value();
    } else {
      spdlog::info("{}: the warm template runs in crun's cgroup", c.status().message());
    }
  }
  Launch();
}

void WarmTemplate::Launch() {
  state_ = State::kStarting;
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
    return Broken(PosixError("socketpair", errno).message(), true);
  }
  const int log =
      ::open(options_.log_file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  ProcessSpec spec;
  // Room for a forked worker's command line in the argument strings it inherits
  // (template.py, set_cmdline): a last argument of spaces, as long as the workers' command
  // line could be, "${local_rank}" and all.
  std::size_t room = 64;
  for (const auto& a : options_.worker_argv) room += a.size() + 1;
  spec.argv = {options_.python, "-u", "-c", kBoot, source_, std::string(room, ' ')};
  spec.envp = options_.envp;
  // Room for a forked worker's environment in the environment strings it inherits
  // (template.py, set_environ): what a worker adds to the environment every worker shares
  // (its ranks, the store, the attempt) takes a few hundred bytes.
  spec.envp.push_back("CRUN_WARM_ROOM=" + std::string(kEnvironRoom, ' '));
  spec.envp.push_back("CRUN_WARM_FD=" + std::to_string(sv[1]));
  spec.envp.push_back(fmt::format("CRUN_WARM_MODULES={}", fmt::join(options_.modules, ",")));
  spec.envp.push_back(fmt::format("CRUN_WARM_SPARES={}", options_.spares));
  spec.stdout_fd = spec.stderr_fd = log;
  spec.inherit_fds = {sv[1]};
  if (own_cgroup_) {
    spec.cgroup_fd = own_cgroup_->fd();
    spec.cgroup_dir = own_cgroup_->dir();
  }
  auto pid = SpawnProcess(spec, children_);
  ::close(sv[1]);
  if (log >= 0) ::close(log);
  if (!pid.ok()) {
    ::close(sv[0]);
    return Broken(pid.status().message(), true);
  }
  pid_ = *pid;
  guard_->Add(pid_);
  socket_ = std::make_unique<asio::posix::stream_descriptor>(io_, sv[0]);
  auto watcher = ExitWatcher::Watch(io_, pid_, children_, [this](ExitStatus s) { OnExit(s); });
  if (!watcher.ok()) return Broken(watcher.status().message(), true);
  watcher_ = std::move(watcher).value();
  spdlog::info("warm template (pid {}) importing {}", pid_, fmt::join(options_.modules, ", "));
  WaitForHello();
}

void WarmTemplate::WaitForHello() {
  socket_->async_wait(asio::posix::stream_descriptor::wait_read,
                      [this](const boost::system::error_code& ec) {
                        if (!ec) OnHello();
                      });
}

void WarmTemplate::OnHello() {
  auto hello = Receive(socket_->native_handle(), std::chrono::milliseconds(0));
  if (!hello.ok()) return Broken(hello.status().message(), false);
  if (!hello->value("ready", false)) {
    spdlog::warn("warm starts are off: module '{}' failed in the template: {}; workers start cold",
                 hello->value("module", std::string("?")), hello->value("error", std::string()));
    return Broken("", true);
  }
  state_ = State::kReady;
  failed_starts_ = 0;
  const auto imported = hello->value("imported", std::vector<std::string>{});
  spdlog::info("warm template (pid {}) ready: {} {}, with {}", pid_,
               hello->value("executable", std::string()), hello->value("version", std::string()),
               imported.empty() ? std::string("nothing imported")
                                : fmt::format("{}", fmt::join(imported, ", ")));
  Settle();
}

void WarmTemplate::OnExit(ExitStatus status) {
  watcher_.reset();
  guard_->Forget(pid_);
  pid_ = -1;
  if (state_ == State::kOff) return;
  Broken("the warm template ended with " + status.Describe(), false);
}

void WarmTemplate::Broken(const std::string& why, bool off) {
  const bool was_starting = state_ == State::kStarting;
  socket_.reset();
  unanswered_ = 0;
  watcher_.reset();
  if (pid_ > 0) {
    guard_->Forget(pid_);
    KillAndReap(pid_, children_);
    pid_ = -1;
  }
  if (was_starting && ++failed_starts_ >= kWarmMaxFailedStarts && !off) {
    spdlog::warn(
        "warm starts are off: {} ({} templates in a row were never ready); workers "
        "start cold",
        why, failed_starts_);
    off = true;
  } else if (off && !why.empty()) {
    spdlog::warn("warm starts are off: {}; workers start cold", why);
  } else if (!off) {
    spdlog::warn("{}; workers start cold until a new one is ready", why);
  }
  if (off) {
    state_ = State::kOff;
    Settle();
    return;
  }
  Launch();
}

void WarmTemplate::WhenSettled(std::function<void()> done) {
  // Only the first template is waited for: cold workers would spend the same time importing.
  // One started again after a death is not: those attempts start cold.
  if (state_ != State::kStarting || !first_start_) return done();
  waiting_.push_back(std::move(done));
  if (waiting_.size() > 1) return;
  ready_deadline_.expires_after(kWarmReadyTimeout);
  ready_deadline_.async_wait([this](const boost::system::error_code& ec) {
    if (ec || waiting_.empty()) return;
    spdlog::warn("the warm template is not ready after {} s; this attempt starts cold",
                 kWarmReadyTimeout.count() / 1000);
    first_start_ = false;
    auto waiting = std::move(waiting_);
    waiting_.clear();
    for (auto& w : waiting) w();
  });
}

void WarmTemplate::Settle() {
  first_start_ = false;
  ready_deadline_.cancel();
  auto waiting = std::move(waiting_);
  waiting_.clear();
  for (auto& w : waiting) w();
}

StatusOr<PendingProcess> WarmTemplate::Fork(const ProcessSpec& spec, const std::string& hook) {
  auto ticket = Request(spec, hook);
  if (!ticket.ok()) return ticket.status();
  return Collect(*ticket);
}

WarmTemplate::Ticket::Ticket(Ticket&& other) noexcept
    : spec(std::move(other.spec)), go(std::exchange(other.go, -1)) {}

WarmTemplate::Ticket::~Ticket() {
  if (go >= 0) ::close(go);
}

StatusOr<WarmTemplate::Ticket> WarmTemplate::Request(const ProcessSpec& spec,
                                                     const std::string& hook) {
  if (state_ != State::kReady) return Aborted("the warm template is not ready");
  if (spec.argv.size() < 3 || spec.argv[0] != options_.python || spec.argv[1] != "-u") {
    return Aborted(fmt::format("'{}' is not run by the template's interpreter {}",
                               fmt::join(spec.argv, " "), options_.python));
  }
  int go[2];
  if (::pipe2(go, O_CLOEXEC) != 0) return PosixError("pipe", errno);
  Ticket t;
  t.go = go[1];
  t.spec = spec;
  const Status sent = Send(spec, hook, go[0]);
  ::close(go[0]);
  if (!sent.ok()) return sent;
  ++unanswered_;
  return t;
}

StatusOr<PendingProcess> WarmTemplate::Collect(Ticket& ticket) {
  if (state_ != State::kReady || unanswered_ == 0) {
    return Aborted("the warm template is not ready");
  }
  --unanswered_;
  auto reply = Receive(socket_->native_handle(), kWarmReplyTimeout);
  if (!reply.ok()) {
    Broken(reply.status().message(), false);
    return reply.status();
  }
  if (!reply->contains("pid") || !(*reply)["pid"].is_number_integer()) {
    const std::string error = reply->value("error", std::string("no pid in its answer"));
    if (error.find("threads") != std::string::npos) Broken("the warm template: " + error, true);
    return Aborted("the warm template could not fork: " + error);
  }
  PendingProcess p;
  p.pid = (*reply)["pid"].get<pid_t>();
  children_.Own(p.pid);  // before anything could reap it as an orphan
  p.report_fd = std::exchange(ticket.go, -1);
  p.spec = std::move(ticket.spec);
  p.warm = true;
  p.children = &children_;
  // The spare that forked it moved itself into the attempt's cgroup first when it could.
  if (!p.spec.cgroup_dir.empty() && !reply->value("in_cgroup", false)) {
    if (auto moved = MoveIntoCgroup(p.spec.cgroup_dir, p.pid); !moved.ok()) {
      ::close(p.report_fd);
      KillAndReap(p.pid, children_);
      return moved;
    }
  }
  return p;
}

// Sends a request; a template that cannot take it is broken.
Status WarmTemplate::Send(const ProcessSpec& spec, const std::string& hook, int go_fd) {
  std::vector<int> fds{go_fd, spec.stdout_fd >= 0 ? spec.stdout_fd : STDOUT_FILENO,
                       spec.stderr_fd >= 0 ? spec.stderr_fd : STDERR_FILENO};
  nlohmann::json fd_env = nlohmann::json::array();
  for (int fd : spec.inherit_fds) {
    const auto names = NamesOfFd(spec.envp, fd);
    if (names.size() != 1) {
      return Aborted("descriptor " + std::to_string(fd) +
                     " is not named by exactly one *_FD variable");
    }
    fds.push_back(fd);
    fd_env.push_back(names[0]);
  }
  char cwd[4096];
  if (::getcwd(cwd, sizeof cwd) == nullptr) return PosixError("getcwd", errno);
  const nlohmann::json request{{"argv", spec.argv},
                               {"env", EnvJson(spec.envp)},
                               {"cwd", cwd},
                               {"cpus", spec.cpus},
                               {"mems", spec.mem_nodes},
                               {"crun", ::getpid()},
                               {"fd_env", fd_env},
                               {"hook", hook},
                               {"cgroup", spec.cgroup_dir}};
  std::string text;
  try {
    text = request.dump();
  } catch (const nlohmann::json::type_error&) {
    // JSON carries text: a value that is not UTF-8 would not reach the worker as it is.
    return Aborted("the worker's command line or environment is not UTF-8");
  }
  if (auto sent = SendWithFds(socket_->native_handle(), text, fds); !sent.ok()) {
    Broken(sent.message(), false);
    return sent;
  }
  return Status::Ok();
}

}  // namespace crun::agent
