#include "base/step_records.h"

#include <optional>

#include "base/numbers.h"

namespace crun {
namespace {

constexpr std::int64_t kMax = std::int64_t{1} << 62;

// "S <step> <compute_us>" or "S <step>", without its newline.
std::optional<StepRecord> ParseRecord(std::string_view text) {
  if (text.size() < 2 || text[0] != 'S' || text[1] != ' ') return std::nullopt;
  text.remove_prefix(2);
  const auto space = text.find(' ');
  const auto step = ParseInteger(text.substr(0, space), 0, kMax);
  if (!step) return std::nullopt;
  if (space == std::string_view::npos) return StepRecord{*step, std::nullopt};
  const auto compute = ParseInteger(text.substr(space + 1), 0, kMax);
  if (!compute) return std::nullopt;
  return StepRecord{*step, *compute};
}

}  // namespace

std::string FormatStepRecord(const StepRecord& r) {
  if (!r.compute_us) return "S " + std::to_string(r.step) + "\n";
  return "S " + std::to_string(r.step) + " " + std::to_string(*r.compute_us) + "\n";
}

int HeartbeatParser::Feed(std::string_view bytes, std::vector<StepRecord>& records) {
  int beats = 0;
  for (const char c : bytes) {
    if (in_record_) {
      if (c == '\n') {
        in_record_ = false;
        if (auto r = ParseRecord(record_)) records.push_back(*r);
        continue;
      }
      if ((c == ' ' || (c >= '0' && c <= '9')) && record_.size() < kMaxRecord) {
        record_ += c;
        continue;
      }
      in_record_ = false;  // not a record after all: this byte is a beat of its own
    }
    ++beats;
    if (c == 'S') {
      in_record_ = true;
      record_.clear();  // not `= "S"`: GCC 12 at -O3 warns of an overlap (-Wrestrict) there
      record_.push_back('S');
    }
  }
  return beats;
}

}  // namespace crun
