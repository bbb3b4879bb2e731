// What a worker writes on CRUN_HEARTBEAT_FD (docs/health.md): one byte, any byte, per plain
// heartbeat ("." by convention), and after a training step a step record,
//
//   "S <step> <compute_us>\n"   or   "S <step>\n"
//
// the step's number and its compute time in microseconds: the time outside the collectives,
// which names a slow rank (docs/health.md, "Slow ranks"). The short form names the step only:
// a worker's first step after it starts, whose compute time nobody measured. It tells the
// goodput ledger the step a worker resumed from. A crun older than the short form reads it as
// one beat. The SDK and the Python module write
// records with StepRecord's format; crun reads the pipe with HeartbeatParser. One definition of
// the encoding, here.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace crun {

struct StepRecord {
  std::int64_t step = 0;
  std::optional<std::int64_t> compute_us;  // none in the short form
};

// "S 120 48211\n", or "S 120\n" without a compute time.
std::string FormatStepRecord(const StepRecord& record);

// Reads the pipe's bytes as they come, in pieces of any size. Every byte outside a record is a
// beat; a record is one beat too, and comes out once its newline has arrived. An 'S' followed
// by anything but digits and spaces, or by more than kMaxRecord of them, was a beat and no
// record: the bytes after it count as beats again (a worker that beats with "S" is not
// silenced). A whole line that does not parse ("S\n", "S 1 2 3\n") is one beat.
class HeartbeatParser {
 public:
  static constexpr std::size_t kMaxRecord = 64;

  // The beats in `bytes`; whole records are appended to `records`.
  int Feed(std::string_view bytes, std::vector<StepRecord>& records);

 private:
  std::string record_;  // since an 'S', before its newline
  bool in_record_ = false;
};

}  // namespace crun
