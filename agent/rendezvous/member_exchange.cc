#include "agent/rendezvous/member_exchange.h"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <tuple>

#include <nlohmann/json.hpp>

#include "base/numbers.h"

namespace crun::agent {
namespace {

using Clock = std::chrono::steady_clock;

// How often a waiting exchange looks at its stop flag.
constexpr Millis kStopCheck{250};

std::string Num(int v) { return std::to_string(v); }

std::string Seconds(Millis t) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", static_cast<double>(t.count()) / 1000);
  return buf;
}

}  // namespace

std::string ExchangeKey(int round, int index) {
  return "/crun/contract/" + Num(round) + "/" + Num(index);
}

std::string BegunKey(int round) { return "/crun/contract/" + Num(round) + "/begun"; }

// "3" (a crun that began the round after another's, as every crun wrote before failures were
// told), or "3\n{...}": the index, then the failure as JSON.
std::string EncodeBegun(const RoundBegun& b) {
  if (!b.after) return Num(b.index);
  const rdzv::Failure& f = *b.after;
  return Num(b.index) + "\n" +
         nlohmann::json{{"what", f.what},
                        {"cause", f.cause},
                        {"last_line", f.last_line},
                        {"way", f.way},
                        {"before_progress", f.before_progress}}
             .dump();
}

StatusOr<RoundBegun> DecodeBegun(const std::string& key, const std::string& text) {
  const auto newline = text.find('\n');
  const std::string who = text.substr(0, newline);
  const auto index = ParseInteger(who, 0, 1 << 20);
  if (!index) return ProtocolError(key + " holds '" + who.substr(0, 100) + "', not an index");
  RoundBegun b{static_cast<int>(*index), std::nullopt};
  if (newline == std::string::npos) return b;
  try {
    const auto j = nlohmann::json::parse(text.substr(newline + 1));
    b.after = rdzv::Failure{j.at("what"), j.at("cause"), j.at("last_line"), j.at("way"),
                            j.at("before_progress")};
  } catch (const std::exception& e) {
    return ProtocolError(key +
                         ": the failure after which the round began is unreadable: " + e.what());
  }
  return b;
}

std::string EncodeParticipant(const Participant& p) {
  return nlohmann::json{{"node", p.node}, {"local_rank", p.local_rank}, {"nproc", p.nproc},
                        {"host", p.host}, {"address", p.address},       {"ports", p.ports}}
      .dump();
}

StatusOr<Participant> DecodeParticipant(std::string_view text, int index,
                                        const ContractSet& contracts) {
  const auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  const auto bad = [&](const std::string& why) {
    return ProtocolError("participant " + Num(index) + " published " + why + ": '" +
                         std::string(text.substr(0, 200)) + "'");
  };
  if (!j.is_object()) return bad("something that is not a JSON object");
  Participant p;
  p.index = index;
  const auto integer = [&](const char* name, int* out, int min) {
    const auto it = j.find(name);
    if (it == j.end() || !it->is_number_integer() || it->get<long long>() < min ||
        it->get<long long>() > 1 << 20) {
      return false;
    }
    *out = it->get<int>();
    return true;
  };
  if (!integer("node", &p.node, 0) || !integer("local_rank", &p.local_rank, 0) ||
      !integer("nproc", &p.nproc, 1)) {
    return bad("no valid node, local_rank or nproc");
  }
  const auto host = j.find("host");
  const auto address = j.find("address");
  const auto ports = j.find("ports");
  if (host == j.end() || !host->is_string() || address == j.end() || !address->is_string() ||
      address->get<std::string>().empty() || ports == j.end() || !ports->is_array()) {
    return bad("no host, address or list of ports");
  }
  p.host = host->get<std::string>();
  p.address = address->get<std::string>();
  for (const auto& port : *ports) {
    if (!port.is_number_unsigned() || port.get<unsigned long long>() == 0 ||
        port.get<unsigned long long>() > 65535) {
      return bad("a port that is not one (" + port.dump() + ")");
    }
    p.ports.push_back(port.get<std::uint16_t>());
  }
  if (Status fits = PortLayout(contracts, p.nproc).Check(p.ports.size()); !fits.ok()) {
    return bad(fits.message() + " (is it running crun with another --contract?)");
  }
  return p;
}

StatusOr<std::vector<RoundMember>> MembersOf(std::vector<Participant> all,
                                             const ContractSet& contracts) {
  std::sort(all.begin(), all.end(), [](const Participant& a, const Participant& b) {
    return std::tie(a.node, a.local_rank) < std::tie(b.node, b.local_rank);
  });
  std::vector<RoundMember> members;
  std::vector<std::uint16_t> beyond;  // the current node's own (jax, horovod)
  const auto close_node = [&] {
    if (members.empty()) return;
    auto& ports = members.back().ports;
    ports.insert(ports.end(), beyond.begin(), beyond.end());
  };
  for (const Participant& p : all) {
    const auto workers = static_cast<std::ptrdiff_t>(PortLayout(contracts, p.nproc).worker_ports());
    const bool new_node = members.empty() || p.node != static_cast<int>(members.size()) - 1;
    if (new_node) {
      if (p.node != static_cast<int>(members.size())) {
        return InvalidArgument("node " + Num(static_cast<int>(members.size())) +
                               " has no participant (the next is node " + Num(p.node) + ")");
      }
      if (p.local_rank != 0) {
        return InvalidArgument("node " + Num(p.node) + " starts at local rank " +
                               Num(p.local_rank) + ", not 0 (participant " + Num(p.index) + ")");
      }
      close_node();
      members.push_back(RoundMember{p.host, p.address, 0, {}});
      beyond.assign(p.ports.begin() + workers, p.ports.end());
    }
    RoundMember& m = members.back();
    if (p.local_rank != m.nproc) {
      return InvalidArgument("participant " + Num(p.index) + " runs local rank " +
                             Num(p.local_rank) + " of node " + Num(p.node) + " where local rank " +
                             Num(m.nproc) + " was next");
    }
    m.ports.insert(m.ports.end(), p.ports.begin(), p.ports.begin() + workers);
    m.nproc += p.nproc;
  }
  close_node();
  return members;
}

StatusOr<std::vector<RoundMember>> ExchangeMembers(Store& store, const Participant& self,
                                                   const ExchangeOptions& options) {
  std::vector<std::string> keys;
  for (int i = 0; i < options.participants; ++i) keys.push_back(ExchangeKey(options.round, i));
  const std::string round = "round " + Num(options.round);
  const auto in_round = [&round](const Status& s) {
    return Status(s.code(), round + ": " + s.message());
  };
  Status s = store.Set(BegunKey(options.round), EncodeBegun({self.index, options.after}));
  if (s.ok()) s = store.Set(keys.at(static_cast<std::size_t>(self.index)), EncodeParticipant(self));
  if (!s.ok()) {
    return in_round(Status(s.code(), "cannot publish this crun's ports: " + s.message()));
  }
  const auto deadline = Clock::now() + options.timeout;
  for (;;) {
    if (options.stop != nullptr && options.stop->load()) {
      return Aborted(round + ": stopped while waiting for the other crun processes' ports");
    }
    const auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now());
    const Status waited = store.Wait(keys, std::clamp(left, Millis(1), kStopCheck));
    if (waited.ok()) break;
    if (waited.code() != StatusCode::kTimeout) {
      return in_round(waited);
    }
    if (Clock::now() < deadline) continue;
    std::string missing;
    for (int i = 0; i < options.participants; ++i) {
      auto has = store.Check({keys[static_cast<std::size_t>(i)]});
      if (has.ok() && !*has) missing += (missing.empty() ? "" : ", ") + Num(i);
    }
    if (!options.contracts.NeedsPorts()) {  // a barrier only (--health-check)
      return TimeoutError(round + ": " + options.who + " " + missing + " did not join within " +
                          Seconds(options.timeout) +
                          " (did its health check keep it out? it exits 87 then; or is it not "
                          "running, or did it not restart with this one?)");
    }
    return TimeoutError(round + ": no ports from " + options.who + " " + missing + " within " +
                        Seconds(options.timeout) +
                        " (is it running crun with the same --contract, and did it restart "
                        "with this one?)");
  }
  auto values = store.MultiGet(keys);
  if (!values.ok()) return in_round(values.status());
  std::vector<Participant> all;
  for (int i = 0; i < options.participants; ++i) {
    auto p = DecodeParticipant((*values)[static_cast<std::size_t>(i)], i, options.contracts);
    if (!p.ok()) return in_round(p.status());
    all.push_back(std::move(p).value());
  }
  auto members = MembersOf(std::move(all), options.contracts);
  if (!members.ok()) return in_round(members.status());
  return members;
}

StatusOr<RoundBegun> WatchForRound(Store& store, int round, const std::atomic<bool>& stop) {
  const std::string key = BegunKey(round);
  for (;;) {
    if (stop.load()) return Aborted("stopped watching for round " + Num(round));
    const Status waited = store.Wait({key}, kStopCheck);
    if (waited.code() == StatusCode::kTimeout) continue;
    if (!waited.ok()) return waited;
    CRUN_ASSIGN_OR_RETURN(const std::string text, store.Get(key));
    return DecodeBegun(key, text);
  }
}

}  // namespace crun::agent
