// A job's settings (--nnodes, --max-restarts, --rdzv-conf's timeouts, --contract, ...): the one
// type that every backend and the agent take, and the one list of its fields that every
// encoding reads (SettingFields). Pure values; no I/O.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "rendezvous/contracts/contract_set.h"

namespace crun::rdzv {

using Millis = std::chrono::milliseconds;

inline constexpr Millis kDefaultJoinTimeout{600'000};    // torchrun's
inline constexpr Millis kDefaultLastCallTimeout{1'000};  // torchrun: 30 s
inline constexpr Millis kDefaultHeartbeatTimeout{3'000};
inline constexpr int kDefaultMaxRestartsWithoutProgress = 3;
// Bounds on what an agent may ask for: the job's world size fits an int with room to spare,
// and deadlines stay far from the clock's range.
inline constexpr int kMaxNodes = 100'000;
inline constexpr int kMaxNprocPerNode = 4'096;
inline constexpr Millis kMaxTimeout{30LL * 24 * 3600 * 1000};  // 30 days

struct Settings {
  int min_nodes = 1;
  int max_nodes = 1;
  Millis join_timeout = kDefaultJoinTimeout;
  Millis last_call_timeout = kDefaultLastCallTimeout;
  Millis heartbeat_timeout = kDefaultHeartbeatTimeout;
  int max_restarts = 0;
  // --max-restarts-without-progress: this many failures in a row, the same way and before any
  // progress, end the job as a crash loop (docs/health.md); 0: never.
  int max_restarts_without_progress = kDefaultMaxRestartsWithoutProgress;
  // --max-repeated-failures: this many failures in a row that failed the same way, progress or
  // not, end the job as a deterministic failure (docs/health.md); 0: never.
  int max_repeated_failures = 0;
  // More than this many rounds within storm_window fails the job (nodes flapping).
  int storm_rounds = 10;
  Millis storm_window{60'000};
  // --contract: every node must run the same set, and reserve the ports its layout says
  // (rendezvous/contracts/contract_set.h); a node whose ports do not fit is refused.
  ContractSet contracts;

  // Errors name the values: "max nodes (2) must be >= min nodes (4)".
  Status Validate() const;
  // Two agents of one run must agree; the message says which setting differs.
  Status CheckCompatible(const Settings& other) const;
  bool operator==(const Settings&) const = default;
};

// The one list of a job's settings: every encoding (the protocol's crun.v1.Settings, etcd's
// JSON) is generated from it and the agreement check reads it; service_unit_tests holds
// rendezvous.proto to it. Adding a setting: its member above and its entry here (and its field
// in rendezvous.proto).
struct SettingField {
  enum class Kind { kCount, kMillis, kContracts };
  const char* name;  // as the proto and etcd's JSON spell it; a kMillis one adds "_ms"
  Kind kind;
  int proto_number;    // in crun.v1.Settings, 1 to 63; 0: not on the wire (the service's own)
  bool json_optional;  // etcd's JSON may lack it (older writers): the default then
  const char* agree;   // the flag every agent of a job must give alike; null: none
  std::int64_t (*get)(const Settings&);
  void (*set)(Settings&, std::int64_t);
  // Its own flag, for a whole number given as is (--max-restarts): the launcher's option table
  // adds it from here, PET_<NAME> too, with its help and group, and refuses a value outside
  // [min, max] naming the flag. null: none, or one the launcher parses itself (--nnodes'
  // range, --contract's names).
  const char* flags = nullptr;  // CLI11's spelling: "--max-restarts,--max_restarts"
  const char* help = nullptr;
  const char* group = nullptr;  // --help's heading
  std::int64_t min = 0;
  std::int64_t max = 0;
};

inline const std::vector<SettingField>& SettingFields() {
  using K = SettingField::Kind;
  static constexpr const char* kRestarts = "Restarts and shutdown";
  static const std::vector<SettingField> fields{
      {"min_nodes", K::kCount, 1, false, "--nnodes",
       [](const Settings& s) -> std::int64_t { return s.min_nodes; },
       [](Settings& s, std::int64_t v) { s.min_nodes = static_cast<int>(v); }},
      {"max_nodes", K::kCount, 2, false, "--nnodes",
       [](const Settings& s) -> std::int64_t { return s.max_nodes; },
       [](Settings& s, std::int64_t v) { s.max_nodes = static_cast<int>(v); }},
      {"join_timeout", K::kMillis, 3, false, nullptr,
       [](const Settings& s) -> std::int64_t { return s.join_timeout.count(); },
       [](Settings& s, std::int64_t v) { s.join_timeout = Millis(v); }},
      {"last_call_timeout", K::kMillis, 4, false, nullptr,
       [](const Settings& s) -> std::int64_t { return s.last_call_timeout.count(); },
       [](Settings& s, std::int64_t v) { s.last_call_timeout = Millis(v); }},
      {"heartbeat_timeout", K::kMillis, 5, false, nullptr,
       [](const Settings& s) -> std::int64_t { return s.heartbeat_timeout.count(); },
       [](Settings& s, std::int64_t v) { s.heartbeat_timeout = Millis(v); }},
      {"max_restarts", K::kCount, 6, false, "--max-restarts",
       [](const Settings& s) -> std::int64_t { return s.max_restarts; },
       [](Settings& s, std::int64_t v) { s.max_restarts = static_cast<int>(v); },
       "--max-restarts,--max_restarts", "Restarts of the worker group allowed after a failure",
       kRestarts, 0, 1'000'000},
      {"max_restarts_without_progress", K::kCount, 8, true, "--max-restarts-without-progress",
       [](const Settings& s) -> std::int64_t { return s.max_restarts_without_progress; },
       [](Settings& s, std::int64_t v) { s.max_restarts_without_progress = static_cast<int>(v); },
       "--max-restarts-without-progress,--max_restarts_without_progress",
       "Stop after this many attempts in a row that failed the same way before any progress: a "
       "crash loop, exit code 86, do not requeue (0: off; docs/health.md)",
       kRestarts, 0, 1'000'000},
      {"max_repeated_failures", K::kCount, 9, true, "--max-repeated-failures",
       [](const Settings& s) -> std::int64_t { return s.max_repeated_failures; },
       [](Settings& s, std::int64_t v) { s.max_repeated_failures = static_cast<int>(v); },
       "--max-repeated-failures,--max_repeated_failures",
       "Stop after this many attempts in a row that failed the same way, progress or not (the "
       "same error at the same point after every resume): exit code 86, do not requeue (0: "
       "off; docs/health.md)",
       kRestarts, 0, 1'000'000},
      {"contracts", K::kContracts, 7, true, "--contract",
       [](const Settings& s) -> std::int64_t { return s.contracts.bits(); },
       [](Settings& s, std::int64_t v) {
         s.contracts = ContractSet::FromBits(static_cast<std::uint32_t>(v));
       }},
      {"storm_rounds", K::kCount, 0, true, nullptr,
       [](const Settings& s) -> std::int64_t { return s.storm_rounds; },
       [](Settings& s, std::int64_t v) { s.storm_rounds = static_cast<int>(v); }},
      {"storm_window", K::kMillis, 0, true, nullptr,
       [](const Settings& s) -> std::int64_t { return s.storm_window.count(); },
       [](Settings& s, std::int64_t v) { s.storm_window = Millis(v); }},
  };
  return fields;
}

// A field's key in the proto and etcd's JSON: its name, "_ms" added for a duration.
inline std::string WireName(const SettingField& f) {
  return std::string(f.name) + (f.kind == SettingField::Kind::kMillis ? "_ms" : "");
}

}  // namespace crun::rdzv
