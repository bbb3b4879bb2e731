#include "crun/worker/snapshot.h"

#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "base/numbers.h"
#include "crun/worker/env_names.h"

namespace crun::worker {
namespace {

namespace snap = crun::snapshot;
constexpr auto kAnswerTimeout = std::chrono::seconds(60);

std::string RankWord(const WorkerEnv& env) { return "rank " + std::to_string(env.rank); }

std::uint64_t NowUnixNs() {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::system_clock::now().time_since_epoch())
                                        .count());
}

std::string JoinSteps(const std::vector<std::uint64_t>& steps) {
  std::string s;
  for (auto v : steps) s += (s.empty() ? "" : ",") + std::to_string(v);
  return s;
}

std::vector<std::uint64_t> SplitSteps(std::string_view text) {
  std::vector<std::uint64_t> out;
  while (!text.empty()) {
    const auto comma = text.find(',');
    const auto v = ParseInteger(text.substr(0, comma), 0, INT64_MAX);
    if (v) out.push_back(static_cast<std::uint64_t>(*v));
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
  return out;
}

}  // namespace

struct SnapshotStore::Buffer {
  int fd = -1;
  void* base = nullptr;
  std::uint64_t capacity = 0;
  ~Buffer() {
    if (base != nullptr) ::munmap(base, snap::kHeaderBytes + capacity);
    if (fd >= 0) ::close(fd);
  }
  snap::BufferHeader& header() const { return *static_cast<snap::BufferHeader*>(base); }
  unsigned char* payload() const { return static_cast<unsigned char*>(base) + snap::kHeaderBytes; }
};

const snapshot::Item* LoadedSnapshot::Find(std::string_view name) const {
  for (const auto& i : items) {
    if (i.name == name) return &i;
  }
  return nullptr;
}

const unsigned char* LoadedSnapshot::DataOf(std::string_view name) const {
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (items[i].name == name) return data[i];
  }
  return nullptr;
}

std::optional<std::uint64_t> AgreeStep(const std::vector<std::vector<std::uint64_t>>& held) {
  if (held.empty()) return std::nullopt;
  std::optional<std::uint64_t> best;
  for (std::uint64_t candidate : held[0]) {
    const bool everywhere = std::all_of(held.begin() + 1, held.end(), [&](const auto& steps) {
      return std::find(steps.begin(), steps.end(), candidate) != steps.end();
    });
    if (everywhere && (!best || candidate > *best)) best = candidate;
  }
  return best;
}

StatusOr<std::unique_ptr<SnapshotStore>> SnapshotStore::Connect(const WorkerEnv& env) {
  const char* name = std::getenv(env::kCrunSnapshotSocket);
  if (name == nullptr || name[0] != '@' || name[1] == '\0') {
    return NotFound(std::string("no snapshot store: ") + env::kCrunSnapshotSocket +
                    " is not set (the worker was not started by crun, or with --snapshots off)");
  }
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return PosixError("socket", errno);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::size_t n = std::min(std::strlen(name), sizeof(addr.sun_path));
  std::memcpy(addr.sun_path, name, n);
  addr.sun_path[0] = '\0';
  const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + n);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), len) != 0) {
    const int err = errno;
    ::close(fd);
    return PosixError(std::string("cannot reach crun's snapshot store at ") + name, err,
                      StatusCode::kUnavailable);
  }
  return std::unique_ptr<SnapshotStore>(new SnapshotStore(env, fd));
}

SnapshotStore::SnapshotStore(WorkerEnv env, int sock) : env_(std::move(env)), sock_(sock) {
  const char* commit = std::getenv(env::kCrunSnapshotCommit);
  commit_ = commit != nullptr && std::string_view(commit) == "1";
}

SnapshotStore::~SnapshotStore() {
  if (unsettled_ >= 0) {
    std::vector<int> fds;
    (void)Ask("settle " + std::to_string(env_.local_rank) + " " + std::to_string(unsettled_),
              &fds);  // crun gone: nothing to wait for
    for (int fd : fds) ::close(fd);
  }
  ::close(sock_);
}

StatusOr<std::string> SnapshotStore::Ask(const std::string& request, std::vector<int>* fds) {
  const std::string line = request + "\n";
  if (::send(sock_, line.data(), line.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(line.size())) {
    return PosixError("crun's snapshot store", errno, StatusCode::kUnavailable);
  }
  if (fds == nullptr) return std::string();
  std::string answer;
  const auto deadline = std::chrono::steady_clock::now() + kAnswerTimeout;
  while (answer.empty() || answer.back() != '\n') {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd p{sock_, POLLIN, 0};
    const int ready = left.count() > 0 ? ::poll(&p, 1, static_cast<int>(left.count())) : 0;
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) return TimeoutError("crun's snapshot store did not answer '" + request + "'");
    char buf[512];
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)];
    iovec iov{buf, sizeof buf};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    const ssize_t n = ::recvmsg(sock_, &msg, MSG_CMSG_CLOEXEC);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Unavailable("crun's snapshot store closed the connection");
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (std::size_t i = 0; i < count; ++i) {
        int got;
        std::memcpy(&got, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        fds->push_back(got);
      }
    }
    answer.append(buf, static_cast<std::size_t>(n));
  }
  answer.pop_back();
  if (answer.rfind("error ", 0) == 0) {
    for (int fd : *fds) ::close(fd);
    fds->clear();
    return ResourceExhausted(answer.substr(6));
  }
  if (answer.rfind("ok", 0) != 0) {
    return ProtocolError("crun's snapshot store answered '" + answer + "'");
  }
  return answer.size() > 3 ? answer.substr(3) : std::string();
}

Status SnapshotStore::MapBuffer(int index, int fd, std::uint64_t capacity) {
  auto b = std::make_unique<Buffer>();
  b->fd = fd;
  b->capacity = capacity;
  b->base =
      ::mmap(nullptr, snap::kHeaderBytes + capacity, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (b->base == MAP_FAILED) {
    b->base = nullptr;
    return PosixError("mapping a snapshot buffer", errno);
  }
  buffers_[index] = std::move(b);
  return Status::Ok();
}

// Asks crun for the slot's buffers ("open": as they are; "load": checked, their checksums) and
// maps them; each one's verdict.
StatusOr<std::array<std::string, 2>> SnapshotStore::TakeSlot(const std::string& verb) {
  std::vector<int> fds;
  auto answer = Ask(verb + " " + std::to_string(env_.local_rank), &fds);
  if (!answer.ok()) return answer.status();
  std::istringstream in(*answer);
  std::array<std::string, 2> verdict;
  std::uint64_t capacity[2] = {0, 0};
  in >> verdict[0] >> capacity[0] >> verdict[1] >> capacity[1];
  const std::size_t wanted = (capacity[0] > 0 ? 1 : 0) + (capacity[1] > 0 ? 1 : 0);
  if (!in || fds.size() != wanted) {
    for (int fd : fds) ::close(fd);
    return ProtocolError("crun's snapshot store answered '" + verb + "' with '" + *answer +
                         "' and " + std::to_string(fds.size()) + " buffers");
  }
  std::size_t next = 0;
  Status result = Status::Ok();
  for (int i = 0; i < 2; ++i) {
    buffers_[i].reset();
    if (capacity[i] == 0) continue;
    if (Status s = MapBuffer(i, fds[next++], capacity[i]); !s.ok()) result = s;
  }
  opened_ = true;
  if (!result.ok()) return result;
  return verdict;
}

Status SnapshotStore::Save(std::uint64_t step, const std::vector<SnapshotItem>& items,
                           snapshot::Layout layout) {
  if (!opened_) {
    auto slot = TakeSlot("open");
    if (!slot.ok()) return slot.status();
  }
  std::vector<snap::Item> toc;
  toc.reserve(items.size());
  for (const auto& i : items) toc.push_back({i.name, i.dtype, i.shape, 0, i.bytes});
  const std::uint64_t payload = snap::PlaceItems(toc);
  const int target = snap::TargetBuffer(buffers_[0] ? &buffers_[0]->header() : nullptr,
                                        buffers_[1] ? &buffers_[1]->header() : nullptr);
  if (!buffers_[target] || buffers_[target]->capacity < payload) {
    std::vector<int> fds;
    auto answer = Ask("reserve " + std::to_string(env_.local_rank) + " " + std::to_string(target) +
                          " " + std::to_string(payload),
                      &fds);
    if (!answer.ok()) return answer.status();
    const auto capacity = ParseInteger(*answer, 1, INT64_MAX);
    if (!capacity || fds.size() != 1) {
      for (int fd : fds) ::close(fd);
      return ProtocolError("crun's snapshot store answered a reserve with '" + *answer + "'");
    }
    CRUN_RETURN_IF_ERROR(MapBuffer(target, fds[0], static_cast<std::uint64_t>(*capacity)));
  }
  const int other = 1 - target;
  Buffer& b = *buffers_[target];
  snap::BufferHeader& h = b.header();
  if (!snap::DoneWith(h)) {  // crun still seals (or copies) what it holds: wait for that
    std::vector<int> fds;
    auto settled =
        Ask("settle " + std::to_string(env_.local_rank) + " " + std::to_string(target), &fds);
    for (int fd : fds) ::close(fd);
    if (!settled.ok()) return settled.status();
  }
  snap::StoreState(h, snap::kWriting);
  const std::string encoded = snap::EncodeToc(toc);
  std::memcpy(b.payload(), encoded.data(), encoded.size());
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (items[i].bytes > 0) items[i].fill(b.payload() + toc[i].offset);
  }
  h.step = step;
  h.payload_bytes = payload;
  h.toc_bytes = encoded.size();
  h.rank = env_.rank;
  h.world_size = env_.world_size;
  h.layout = layout;
  h.saved_unix_ns = NowUnixNs();
  const bool other_done =
      buffers_[other] && snap::LoadState(buffers_[other]->header()) == snap::kComplete;
  h.generation = std::max(h.generation, other_done ? buffers_[other]->header().generation : 0) + 1;
  snap::StoreState(h, snap::kComplete);
  // In a job of several nodes, crun answers once the snapshot is sealed and on the next node.
  std::vector<int> fds;
  auto told = Ask((commit_ ? "commit " : "saved ") + std::to_string(env_.local_rank) + " " +
                      std::to_string(target),
                  commit_ ? &fds : nullptr);
  for (int fd : fds) ::close(fd);
  unsettled_ = commit_ ? -1 : target;
  return told.ok() ? Status::Ok() : told.status();
}

// What this rank holds complete and its own (its steps), or why it refuses. A refusal with
// nothing left to load fails the job's load; a corrupt newer copy next to a whole older one
// does not (the older one is loaded, as the agreement allows).
SnapshotStore::Held SnapshotStore::HeldSteps(const std::array<std::string, 2>& verdict) const {
  Held out;
  for (int i = 0; i < 2; ++i) {
    if (!buffers_[i]) continue;
    const snap::BufferHeader& h = buffers_[i]->header();
    if (verdict[i] == "corrupt") {
      out.refusal = "the snapshot of " + RankWord(env_) + " at step " + std::to_string(h.step) +
                    " fails its checksum (crun's node memory was overwritten): not loaded";
      continue;
    }
    if (verdict[i] != "valid" && verdict[i] != "sealed") continue;
    if (h.layout == snap::kSharded && (h.world_size != env_.world_size || h.rank != env_.rank)) {
      out.refusal = "the snapshot in local rank " + std::to_string(env_.local_rank) +
                    "'s memory at step " + std::to_string(h.step) + " was saved by rank " +
                    std::to_string(h.rank) + " of " + std::to_string(h.world_size) + ", not by " +
                    RankWord(env_) + " of " + std::to_string(env_.world_size) +
                    ": a sharded snapshot loads only into the same rank of the same world size";
      continue;
    }
    out.steps.push_back(h.step);
  }
  if (!out.steps.empty()) out.refusal.clear();
  return out;
}

// The step the job resumes at, through the job's store: every rank posts what it holds (or
// its refusal), rank 0 decides, every rank reads the decision. None: no step every rank holds.
StatusOr<std::optional<std::uint64_t>> SnapshotStore::Agree(Context& context, const Held& held,
                                                            Millis timeout) {
  if (env_.world_size <= 1) {
    if (!held.refusal.empty()) return InvalidArgument(held.refusal);
    if (held.steps.empty()) return std::optional<std::uint64_t>();
    return std::optional<std::uint64_t>(*std::max_element(held.steps.begin(), held.steps.end()));
  }
  const std::string prefix = context.round_prefix() + "snapshot/" + std::to_string(loads_++) + "/";
  Store& store = context.store();
  CRUN_RETURN_IF_ERROR(store.Set(prefix + std::to_string(env_.rank),
                                 held.refusal.empty() ? "steps:" + JoinSteps(held.steps)
                                                      : "refused:" + held.refusal));
  const std::string agreed_key = prefix + "agreed";
  if (env_.rank == 0) {
    std::vector<std::string> keys;
    for (int r = 0; r < env_.world_size; ++r) keys.push_back(prefix + std::to_string(r));
    CRUN_RETURN_IF_ERROR(store.Wait(keys, timeout));
    auto values = store.MultiGet(keys);
    if (!values.ok()) return values.status();
    std::vector<std::vector<std::uint64_t>> all;
    std::string decision;
    for (const std::string& v : *values) {
      if (v.rfind("refused:", 0) == 0 && decision.empty()) decision = v;
      all.push_back(v.rfind("steps:", 0) == 0 ? SplitSteps(std::string_view(v).substr(6))
                                              : std::vector<std::uint64_t>{});
    }
    if (decision.empty()) {
      const auto step = AgreeStep(all);
      decision = step ? "step:" + std::to_string(*step) : "none";
    }
    CRUN_RETURN_IF_ERROR(store.Set(agreed_key, decision));
  }
  CRUN_RETURN_IF_ERROR(store.Wait({agreed_key}, timeout));
  auto text = store.Get(agreed_key);
  if (!text.ok()) return text.status();
  if (text->rfind("refused:", 0) == 0) return InvalidArgument(text->substr(8));
  if (text->rfind("step:", 0) != 0) return std::optional<std::uint64_t>();
  return std::optional<std::uint64_t>(
      static_cast<std::uint64_t>(*ParseInteger(std::string_view(*text).substr(5), 0, INT64_MAX)));
}

// Buffer `index`, holding the agreed step, as loaded; the older (sealed) buffer is checked by
// crun first.
StatusOr<LoadedSnapshot> SnapshotStore::Loaded(int index, const std::string& verdict) {
  const Buffer& b = *buffers_[index];
  const snap::BufferHeader& h = b.header();
  const std::string which =
      "the snapshot of " + RankWord(env_) + " at step " + std::to_string(h.step);
  if (verdict == "sealed") {
    std::vector<int> none;
    auto checked =
        Ask("verify " + std::to_string(env_.local_rank) + " " + std::to_string(index), &none);
    if (!checked.ok()) return checked.status();
    if (*checked != "valid") {
      return InvalidArgument(which + " fails its checksum (" + *checked +
                             "): crun's node memory was overwritten");
    }
  }
  auto items =
      snap::DecodeToc(std::string_view(reinterpret_cast<const char*>(b.payload()), h.toc_bytes),
                      h.payload_bytes);
  if (!items) return InvalidArgument(which + " has a malformed table of contents");
  LoadedSnapshot out;
  out.step = h.step;
  out.items = std::move(*items);
  for (const auto& item : out.items) out.data.push_back(b.payload() + item.offset);
  return out;
}

// The steps of this rank on disk (crun's --checkpoint-dir) that it may load, newest first.
StatusOr<std::vector<std::uint64_t>> SnapshotStore::DiskSteps() {
  std::vector<int> fds;
  auto answer = Ask("disk " + std::to_string(env_.local_rank) + " " + std::to_string(env_.rank) +
                        " " + std::to_string(env_.world_size),
                    &fds);
  for (int fd : fds) ::close(fd);
  if (!answer.ok()) return answer.status();
  return SplitSteps(*answer);
}

// Step `step` from disk into this rank's memory, mapped, as crun checked it.
StatusOr<LoadedSnapshot> SnapshotStore::Restore(std::uint64_t step) {
  std::vector<int> fds;
  auto answer = Ask("restore " + std::to_string(env_.local_rank) + " " + std::to_string(env_.rank) +
                        " " + std::to_string(step),
                    &fds);
  if (!answer.ok()) {
    return InvalidArgument(RankWord(env_) + " cannot resume from disk at step " +
                           std::to_string(step) + ": " + answer.status().message());
  }
  std::istringstream in(*answer);
  int index = -1;
  std::uint64_t capacity = 0;
  in >> index >> capacity;
  if (!in || (index != 0 && index != 1) || capacity == 0 || fds.size() != 1) {
    for (int fd : fds) ::close(fd);
    return ProtocolError("crun's snapshot store answered a restore with '" + *answer + "'");
  }
  CRUN_RETURN_IF_ERROR(MapBuffer(index, fds[0], capacity));
  return Loaded(index, "valid");
}

StatusOr<std::optional<LoadedSnapshot>> SnapshotStore::Load(Context& context, Millis timeout) {
  auto slot = TakeSlot("load");
  if (!slot.ok()) return slot.status();
  const std::array<std::string, 2>& verdict = *slot;
  Held held = HeldSteps(verdict);
  auto disk = DiskSteps();
  if (!disk.ok()) return disk.status();
  const std::vector<std::uint64_t> in_memory = held.steps;
  for (std::uint64_t step : *disk) {
    if (std::find(held.steps.begin(), held.steps.end(), step) == held.steps.end()) {
      held.steps.push_back(step);
    }
  }
  if (!held.steps.empty()) held.refusal.clear();
  auto agreed = Agree(context, held, timeout);
  if (!agreed.ok()) return agreed.status();
  // The job goes on from the agreed step: a snapshot of any other step belongs to a timeline
  // that is abandoned (a step newer than the agreed one that this rank saved before another
  // rank failed), and must neither be loaded later nor make a save overwrite the agreed one.
  for (int i = 0; i < 2; ++i) {
    if (buffers_[i] && (!*agreed || buffers_[i]->header().step != **agreed)) {
      snap::StoreState(buffers_[i]->header(), snap::kEmpty);
    }
  }
  if (!*agreed) return std::optional<LoadedSnapshot>();
  if (std::find(in_memory.begin(), in_memory.end(), **agreed) != in_memory.end()) {
    for (int i = 0; i < 2; ++i) {
      if (buffers_[i] && (verdict[i] == "valid" || verdict[i] == "sealed") &&
          buffers_[i]->header().step == **agreed) {
        auto loaded = Loaded(i, verdict[i]);
        if (!loaded.ok()) return loaded.status();
        return std::optional<LoadedSnapshot>(std::move(*loaded));
      }
    }
  }
  auto restored = Restore(**agreed);
  if (!restored.ok()) return restored.status();
  return std::optional<LoadedSnapshot>(std::move(*restored));
}

}  // namespace crun::worker
