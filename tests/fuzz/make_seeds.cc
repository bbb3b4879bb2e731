// Writes the seed corpora of the store's fuzz targets. Run by hand when the wire format grows:
//   make_seeds parser  tests/fuzz/corpus/store_parser_fuzz
//   make_seeds session tests/fuzz/corpus/store_session_fuzz
// parser: for each dialect, a stream of every command it has, encoded by crun's own encoder,
// prefixed with the chunk-size byte the target reads first.
// session: two clients' streams in the target's format (chunk byte, the first stream's length
// in two bytes, both streams) that make one client's requests answer the other's: a WAIT and
// the SET it waits for, the two halves of a BARRIER, a 1.13 WATCH_KEY and the change it sees.
#include <cstdio>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "rendezvous/store/wire.h"

using crun::wire::Command;
using crun::wire::Dialect;

namespace {

std::string Encode(Dialect d, const std::vector<crun::wire::Request>& requests) {
  std::string out;
  if (d == Dialect::kModern) {  // a 2.x client's first request
    crun::wire::EncodeRequest(d,
                              crun::wire::MakeRequest(Command::kValidate, {}, 0,
                                                      crun::wire::kValidationMagic),
                              &out);
  }
  for (const auto& r : requests) crun::wire::EncodeRequest(d, r, &out);
  return out;
}

int SessionSeeds(const std::string& dir) {
  using crun::wire::MakeRequest;
  int n = 0;
  for (Dialect d : {Dialect::kLegacy, Dialect::kModern}) {
    const std::vector<std::pair<std::vector<crun::wire::Request>, std::vector<crun::wire::Request>>>
        pairs = {
            {{MakeRequest(Command::kWait, {"/k"})},
             {MakeRequest(Command::kSet, {"/k", "v"}), MakeRequest(Command::kGet, {"/k"})}},
            {{MakeRequest(Command::kAdd, {"/n"}, 1), MakeRequest(Command::kWait, {"/a", "/b"})},
             {MakeRequest(Command::kMultiSet, {"/a", "1", "/b", "2"}),
              MakeRequest(Command::kCompareSet, {"/a", "1", "3"})}},
            {{MakeRequest(Command::kWatchKey, {"/w"}), MakeRequest(Command::kGet, {"/w"})},
             {MakeRequest(Command::kSet, {"/w", "1"}), MakeRequest(Command::kDeleteKey, {"/w"})}},
            {{MakeRequest(Command::kBarrier, {"/bar"}, 2)},
             {MakeRequest(Command::kBarrier, {"/bar"}, 2), MakeRequest(Command::kCancelWait, {})}},
            {{MakeRequest(Command::kQueuePop, {"/q"}), MakeRequest(Command::kQueueLen, {"/q"})},
             {MakeRequest(Command::kQueuePush, {"/q", "x"}), MakeRequest(Command::kListKeys, {})}},
        };
    for (const auto& [a, b] : pairs) {
      bool supported = true;
      for (const auto* side : {&a, &b}) {
        for (const auto& r : *side) supported &= crun::wire::WireCode(d, r.command) >= 0;
      }
      if (!supported) continue;
      const std::string first = Encode(d, a), second = Encode(d, b);
      std::string seed(1, '\x05');
      seed += static_cast<char>(first.size() & 0xff);
      seed += static_cast<char>(first.size() >> 8);
      std::ofstream(dir + "/" + std::to_string(n++)) << seed + first + second;
    }
  }
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string kind = argc == 3 ? argv[1] : "";
  if (kind != "parser" && kind != "session") {
    std::fprintf(stderr, "usage: make_seeds parser|session OUT_DIR\n");
    return 2;
  }
  if (kind == "session") {
    std::printf("%d seeds\n", SessionSeeds(argv[2]));
    return 0;
  }
  argv[1] = argv[2];
  int n = 0;
  for (Dialect d : {Dialect::kLegacy, Dialect::kModern}) {
    std::string all;
    for (int c = 0; c <= static_cast<int>(Command::kBarrier); ++c) {
      const auto command = static_cast<Command>(c);
      if (crun::wire::WireCode(d, command) < 0) continue;
      auto r = crun::wire::MakeRequest(command, {"/k", "value", "x"}, 3, 0x3C85F7CE);
      if (command == Command::kMultiSet) r.args = {"/a", "1", "/b", "2"};
      std::string one(1, static_cast<char>(7 + c));  // the chunk-size byte
      crun::wire::EncodeRequest(d, r, &one);
      crun::wire::EncodeRequest(d, r, &all);
      std::ofstream(std::string(argv[1]) + "/" + std::to_string(n++)) << one;
    }
    std::ofstream(std::string(argv[1]) + "/" + std::to_string(n++)) << std::string(1, '\x03') + all;
  }
  std::printf("%d seeds\n", n);
  return 0;
}
