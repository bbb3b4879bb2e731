#include "tests/bench/loadgen_shards.h"

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <thread>

namespace crun::bench {

std::int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(LoadClock::now().time_since_epoch())
      .count();
}

void WriteLine(int fd, const std::string& line) {
  const std::string text = line + "\n";
  for (std::size_t done = 0; done < text.size();) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<std::size_t>(n);
  }
}

bool LineReader::Read(std::string& line, LoadClock::time_point deadline) {
  for (;;) {
    if (const auto nl = buf_.find('\n'); nl != std::string::npos) {
      line = buf_.substr(0, nl);
      buf_.erase(0, nl + 1);
      return true;
    }
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - LoadClock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd_, POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    char chunk[65536];
    const ssize_t n = ::read(fd_, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    buf_.append(chunk, static_cast<std::size_t>(n));
  }
}

bool Commands::Next(std::string& word, std::istringstream& args) {
  std::string line;
  if (!reader_.Read(line, LoadClock::now() + std::chrono::hours(1))) return false;
  args.clear();
  args.str(line);
  word.clear();
  args >> word;
  return true;
}

bool Shards::Start(int procs, const ShardMain& body) {
  std::fflush(nullptr);
  for (int s = 0; s < procs; ++s) {
    int cmd[2], reply[2];
    if (::pipe(cmd) != 0 || ::pipe(reply) != 0) {
      std::fprintf(stderr, "rdzv_loadgen: pipe: %s\n", std::strerror(errno));
      return false;
    }
    const pid_t pid = ::fork();
    if (pid < 0) {
      std::fprintf(stderr, "rdzv_loadgen: fork: %s\n", std::strerror(errno));
      return false;
    }
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // no shard outlives the coordinator
      if (::getppid() == 1) ::_exit(1);
      for (auto& sh : shards_) {
        ::close(sh.cmd);
        ::close(sh.reply.fd());
      }
      ::close(cmd[1]);
      ::close(reply[0]);
      ::_exit(body(s, cmd[0], reply[1]));
    }
    ::close(cmd[0]);
    ::close(reply[1]);
    shards_.push_back({pid, cmd[1], LineReader(reply[0])});
  }
  return true;
}

std::vector<int> Shards::pids() const {
  std::vector<int> out;
  for (const auto& sh : shards_) out.push_back(static_cast<int>(sh.pid));
  return out;
}

void Shards::Send(std::size_t s, const std::string& line) { WriteLine(shards_[s].cmd, line); }

void Shards::SendAll(const std::string& line) {
  for (auto& sh : shards_) WriteLine(sh.cmd, line);
}

bool Shards::Expect(std::size_t s, const std::string& word, std::vector<std::int64_t>& fields,
                    LoadClock::time_point deadline, std::string* rest) {
  std::string line;
  if (!shards_[s].reply.Read(line, deadline)) {
    std::fprintf(stderr, "rdzv_loadgen: shard %zu (pid %d) sent no '%s' in time\n", s,
                 static_cast<int>(shards_[s].pid), word.c_str());
    return false;
  }
  std::istringstream in(line);
  std::string got;
  in >> got;
  if (got != word) {
    std::fprintf(stderr, "rdzv_loadgen: shard %zu sent '%.80s', not '%s'\n", s, line.c_str(),
                 word.c_str());
    return false;
  }
  fields.clear();
  if (rest != nullptr) {
    std::getline(in, *rest);
    return true;
  }
  for (std::int64_t v; in >> v;) fields.push_back(v);
  return true;
}

void Shards::Stop() {
  for (auto& sh : shards_) {
    ::close(sh.cmd);
    ::close(sh.reply.fd());
  }
  const auto deadline = LoadClock::now() + std::chrono::seconds(10);
  for (auto& sh : shards_) {
    for (;;) {
      const pid_t r = ::waitpid(sh.pid, nullptr, WNOHANG);
      if (r == sh.pid || (r < 0 && errno != EINTR)) break;
      if (LoadClock::now() >= deadline) {
        ::kill(sh.pid, SIGKILL);
        ::waitpid(sh.pid, nullptr, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));  // polling a child's exit
    }
  }
  shards_.clear();
}

}  // namespace crun::bench
