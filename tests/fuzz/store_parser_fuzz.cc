// libFuzzer target: the store's RequestParser (rendezvous/store/wire.h) fed arbitrary bytes.
//
// Input: one byte choosing the chunk size (1..256 bytes), then the stream. The stream is parsed
// twice, whole and in chunks of that size, with tight limits; both must agree on every
// request and on where and why the stream breaks, and nothing may crash, leak or hit undefined
// behaviour (the target is built with ASan, LSan and UBSan: tests/fuzz/CMakeLists.txt).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "rendezvous/store/wire.h"
#include "tests/fuzz/tight_limits.h"

namespace {

struct Outcome {
  std::vector<crun::wire::Request> requests;
  crun::wire::RequestParser::Result result = crun::wire::RequestParser::Result::kNeedMore;
  std::string error;
};

Outcome Parse(std::string_view stream, std::size_t chunk) {
  Outcome out;
  crun::wire::RequestParser parser(crun::fuzz::TightLimits());
  for (std::size_t at = 0; at < stream.size(); at += chunk) {
    // A fresh copy per chunk: the parser must not keep pointers into a caller's buffer.
    std::string piece(stream.substr(at, chunk));
    out.result = parser.Consume(piece, [&](crun::wire::Request& r) {
      out.requests.push_back(r);
      return true;
    });
    piece.assign(piece.size(), '\xAA');
    if (out.result == crun::wire::RequestParser::Result::kError) {
      out.error = parser.error();
      if (out.error.empty()) std::abort();  // a broken stream always says why
      break;
    }
  }
  return out;
}

bool Same(const crun::wire::Request& a, const crun::wire::Request& b) {
  return a.command == b.command && a.args == b.args && a.number == b.number && a.nonce == b.nonce;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const std::size_t chunk = 1 + data[0];
  const std::string_view stream(reinterpret_cast<const char*>(data + 1), size - 1);
  const Outcome whole = Parse(stream, stream.size() + 1);
  const Outcome split = Parse(stream, chunk);
  if (whole.result != split.result || whole.error != split.error ||
      whole.requests.size() != split.requests.size()) {
    std::abort();
  }
  for (std::size_t i = 0; i < whole.requests.size(); ++i) {
    if (!Same(whole.requests[i], split.requests[i])) std::abort();
  }
  return 0;
}
