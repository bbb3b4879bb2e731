#include "rendezvous/beats/beat_datagram.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/rand.h>

#include <charconv>
#include <cstring>
#include <stdexcept>

namespace crun::rdzv {
namespace {

constexpr char kMagic[4] = {'C', 'R', 'B', '1'};
constexpr char kAckMagic[4] = {'C', 'R', 'A', '1'};
constexpr std::size_t kTag = 16;

// One HMAC-SHA256 context a thread, fetched once: the one-shot HMAC() looks the algorithm up
// on every call, half the cost of a beat's tag.
class Mac {
 public:
  Mac() {
    EVP_MAC* mac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
    ctx_ = mac != nullptr ? EVP_MAC_CTX_new(mac) : nullptr;
    EVP_MAC_free(mac);  // the context holds its own reference
    char digest[] = "SHA256";
    const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string("digest", digest, 0),
                                 OSSL_PARAM_construct_end()};
    if (ctx_ == nullptr || EVP_MAC_CTX_set_params(ctx_, params) != 1) {
      throw std::runtime_error("OpenSSL has no HMAC-SHA256 for heartbeat datagrams");
    }
  }
  ~Mac() { EVP_MAC_CTX_free(ctx_); }
  Mac(const Mac&) = delete;
  Mac& operator=(const Mac&) = delete;

  std::array<unsigned char, kTag> Tag(const BeatKey& key, std::string_view data) {
    unsigned char mac[EVP_MAX_MD_SIZE];
    std::size_t n = 0;
    if (EVP_MAC_init(ctx_, key.data(), key.size(), nullptr) != 1 ||
        EVP_MAC_update(ctx_, reinterpret_cast<const unsigned char*>(data.data()), data.size()) !=
            1 ||
        EVP_MAC_final(ctx_, mac, &n, sizeof mac) != 1 || n < kTag) {
      throw std::runtime_error("OpenSSL's HMAC-SHA256 failed on a heartbeat datagram");
    }
    std::array<unsigned char, kTag> tag{};
    std::memcpy(tag.data(), mac, kTag);
    return tag;
  }

 private:
  EVP_MAC_CTX* ctx_ = nullptr;
};

std::array<unsigned char, kTag> Tag(const BeatKey& key, std::string_view data) {
  static thread_local Mac mac;
  return mac.Tag(key, data);
}

void PutU64(char* out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((v >> (56 - 8 * i)) & 0xff);
}

std::uint64_t GetU64(const char* in) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | static_cast<unsigned char>(in[i]);
  return v;
}

template <typename T>
bool ParseNumber(std::string_view s, T& out) {
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && end == s.data() + s.size();
}

}  // namespace

BeatKey NewBeatKey() {
  BeatKey key{};
  if (RAND_bytes(key.data(), static_cast<int>(key.size())) != 1) {
    throw std::runtime_error("the system's random source gave no bytes for a heartbeat key");
  }
  return key;
}

std::string FormatBeatTicket(const BeatTicket& t) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "1 " + std::to_string(t.port) + " " + std::to_string(t.session) + " ";
  for (unsigned char b : t.key) {
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 15]);
  }
  return out;
}

StatusOr<BeatTicket> ParseBeatTicket(std::string_view text) {
  const auto bad = [&](std::string_view why) {
    return InvalidArgument("the service's heartbeat ticket '" + std::string(text.substr(0, 80)) +
                           "' " + std::string(why));
  };
  std::string_view fields[4];
  std::string_view rest = text;
  for (int i = 0; i < 4; ++i) {
    const auto space = rest.find(' ');
    fields[i] = rest.substr(0, space);
    rest = space == std::string_view::npos ? std::string_view() : rest.substr(space + 1);
    if (fields[i].empty()) return bad("has fewer than 4 fields");
  }
  if (!rest.empty()) return bad("has more than 4 fields");
  if (fields[0] != "1") return bad("is of a version this agent does not know");
  BeatTicket t;
  if (!ParseNumber(fields[1], t.port) || t.port == 0) return bad("names no UDP port");
  if (!ParseNumber(fields[2], t.session)) return bad("names no session");
  if (fields[3].size() != 2 * t.key.size()) return bad("has a key of the wrong length");
  for (std::size_t i = 0; i < t.key.size(); ++i) {
    unsigned int b = 0;
    const auto pair = fields[3].substr(2 * i, 2);
    const auto [end, ec] = std::from_chars(pair.data(), pair.data() + 2, b, 16);
    if (ec != std::errc() || end != pair.data() + 2) return bad("has a key that is not hex");
    t.key[i] = static_cast<unsigned char>(b);
  }
  return t;
}

std::string SealBeat(const BeatTicket& t, std::string_view payload) {
  std::string d;
  d.reserve(kBeatOverhead + payload.size());
  d.append(kMagic, sizeof kMagic);
  d.resize(12);
  PutU64(d.data() + 4, t.session);
  d.append(payload);
  const auto tag = Tag(t.key, d);
  d.append(reinterpret_cast<const char*>(tag.data()), tag.size());
  return d;
}

std::optional<std::uint64_t> BeatSession(std::string_view datagram) {
  if (datagram.size() < kBeatOverhead || datagram.substr(0, 4) != std::string_view(kMagic, 4)) {
    return std::nullopt;
  }
  return GetU64(datagram.data() + 4);
}

std::optional<std::string_view> OpenBeat(const BeatKey& key, std::string_view datagram) {
  if (!BeatSession(datagram)) return std::nullopt;
  const auto body = datagram.substr(0, datagram.size() - kTag);
  const auto tag = Tag(key, body);
  if (CRYPTO_memcmp(tag.data(), datagram.data() + body.size(), kTag) != 0) return std::nullopt;
  return body.substr(12);
}

BeatAckDatagram SealAck(const BeatKey& key, std::uint64_t session, std::uint64_t sequence) {
  BeatAckDatagram d{};
  std::memcpy(d.data(), kAckMagic, sizeof kAckMagic);
  PutU64(d.data() + 4, session);
  PutU64(d.data() + 12, sequence);
  const auto tag = Tag(key, std::string_view(d.data(), kBeatAckSize - kTag));
  std::memcpy(d.data() + kBeatAckSize - kTag, tag.data(), kTag);
  return d;
}

std::optional<std::uint64_t> AckSession(std::string_view datagram) {
  if (datagram.size() != kBeatAckSize ||
      datagram.substr(0, 4) != std::string_view(kAckMagic, sizeof kAckMagic)) {
    return std::nullopt;
  }
  return GetU64(datagram.data() + 4);
}

std::optional<BeatAck> OpenAck(const BeatKey& key, std::string_view datagram) {
  const auto session = AckSession(datagram);
  if (!session) return std::nullopt;
  const auto tag = Tag(key, datagram.substr(0, kBeatAckSize - kTag));
  if (CRYPTO_memcmp(tag.data(), datagram.data() + kBeatAckSize - kTag, kTag) != 0) {
    return std::nullopt;
  }
  return BeatAck{*session, GetU64(datagram.data() + 12)};
}

}  // namespace crun::rdzv
