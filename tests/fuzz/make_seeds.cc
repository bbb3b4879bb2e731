// Writes the seed corpus of store_parser_fuzz (tests/fuzz/corpus/store_parser_fuzz): for each
// dialect, a stream of every command it has, encoded by crun's own encoder, prefixed with the
// chunk-size byte the target reads first. Run by hand when the wire format grows:
//   make_seeds OUT_DIR
#include <cstdio>
#include <fstream>
#include <string>

#include "rendezvous/store/wire.h"

using crun::wire::Command;
using crun::wire::Dialect;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds OUT_DIR\n");
    return 2;
  }
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
