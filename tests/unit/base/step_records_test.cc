// The heartbeat pipe's bytes (base/step_records.h): beats and step records, in pieces of any
// size, and what is not a record.
#include <catch2/catch.hpp>

#include <random>
#include <string>
#include <vector>

#include "base/step_records.h"

namespace {

using crun::FormatStepRecord;
using crun::HeartbeatParser;
using crun::StepRecord;

// A record's compute time, -1 for the short form's none.
struct Read {
  int beats = 0;
  std::vector<std::pair<std::int64_t, std::int64_t>> records;
};

Read ReadAll(const std::vector<std::string>& pieces) {
  HeartbeatParser p;
  Read out;
  std::vector<StepRecord> records;
  for (const auto& piece : pieces) out.beats += p.Feed(piece, records);
  for (const auto& r : records) out.records.emplace_back(r.step, r.compute_us.value_or(-1));
  return out;
}

TEST_CASE("heartbeats: plain beats and step records, whole or split", "[steps]") {
  CHECK(FormatStepRecord({120, 48211}) == "S 120 48211\n");
  CHECK(FormatStepRecord({120, std::nullopt}) == "S 120\n");
  struct Row {
    std::vector<std::string> pieces;
    int beats;
    std::vector<std::pair<std::int64_t, std::int64_t>> records;
  };
  const Row rows[] = {
      {{"..."}, 3, {}},
      {{"S 1 20\n"}, 1, {{1, 20}}},
      {{".S 1 20\n.S 2 30\n"}, 4, {{1, 20}, {2, 30}}},
      {{"S 1", "2 3", "4\n"}, 1, {{12, 34}}},  // split anywhere
      {{"S 7 9"}, 1, {}},                      // its newline not here yet
      {{"S 1\n"}, 1, {{1, -1}}},               // the short form: the step, no compute time
      {{"S 4", "2\n.S 43 5\n"}, 3, {{42, -1}, {43, 5}}},
      {{"S\n"}, 1, {}},  // no number: a beat, no record
      {{"S \n"}, 1, {}},
      {{"S 1 2 3\n"}, 1, {}},
      {{"S -1 2\n"}, 6, {}},  // '-' is no digit: S, then -, 1, space, 2 and newline are beats
      {{"SS.S"}, 4, {}},      // beats with "S": every byte counts
      {{"x\n\n"}, 3, {}},
      // Too long: the S, then each byte past the 64th (seven 1s and the newline) is a beat.
      {{"S " + std::string(70, '1') + "\n"}, 1 + 1 + 7 + 1, {}},
  };
  for (const Row& r : rows) {
    std::string all;
    for (const auto& piece : r.pieces) all += piece;
    INFO(all);
    const Read got = ReadAll(r.pieces);
    CHECK(got.beats == r.beats);
    CHECK(got.records == r.records);
  }
}

TEST_CASE("heartbeats: any split of a stream reads the same", "[steps]") {
  std::string stream;
  for (int i = 0; i < 200; ++i) {
    if (i % 3 == 0) {
      stream += ".";
    } else {
      stream +=
          FormatStepRecord({i, i % 3 == 1 ? std::optional<std::int64_t>(i * 1000) : std::nullopt});
    }
  }
  const Read whole = ReadAll({stream});
  CHECK(whole.records.size() == 133);
  for (unsigned seed = 1; seed <= 100; ++seed) {
    std::mt19937 rng(seed);
    std::vector<std::string> pieces;
    for (std::size_t at = 0; at < stream.size();) {
      const std::size_t n = std::uniform_int_distribution<std::size_t>(1, 9)(rng);
      pieces.push_back(stream.substr(at, n));
      at += n;
    }
    INFO("seed " << seed);
    const Read split = ReadAll(pieces);
    CHECK(split.beats == whole.beats);
    CHECK(split.records == whole.records);
  }
}

}  // namespace
