#include "base/security.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "base/text.h"

namespace crun {
namespace {

// `what` names where the path came from ("--tls-ca", "CRUN_TLS_CA") for the error.
StatusOr<std::string> ReadWhole(const std::string& what, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return PosixError(what + " " + path, errno, StatusCode::kInvalidArgument);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The flag's value, else the environment variable's; `source` says which, for messages.
std::string FlagOrEnv(const std::string& flag_value, const char* flag, const char* env,
                      std::string* source) {
  if (!flag_value.empty()) {
    *source = flag;
    return flag_value;
  }
  const char* v = std::getenv(env);
  if (v != nullptr && *v != '\0') {
    *source = env;
    return v;
  }
  return "";
}

Status CheckToken(const std::string& token, const std::string& source) {
  if (token.empty()) return InvalidArgument(source + ": the job token is empty");
  for (unsigned char c : token) {
    // It travels as gRPC metadata: printable ASCII only.
    if (c < 0x20 || c > 0x7e) {
      return InvalidArgument(source +
                             ": the job token may hold printable ASCII only "
                             "(found byte " +
                             std::to_string(c) + ")");
    }
  }
  return Status::Ok();
}

}  // namespace

StatusOr<Security> LoadSecurity(const SecurityFlags& flags, std::string_view role) {
  Security s;
  std::string source;
  const std::string token_file =
      FlagOrEnv(flags.token_file, "--token-file", "CRUN_TOKEN_FILE", &source);
  if (!token_file.empty()) {
    auto text = ReadWhole(source, token_file);
    if (!text.ok()) return text.status();
    s.token = std::string(TrimEnd(*text));
    s.token_source = source + " " + token_file;
  } else if (const char* t = std::getenv("CRUN_TOKEN"); t != nullptr && *t != '\0') {
    s.token = std::string(TrimEnd(t));
    s.token_source = "CRUN_TOKEN";
  }
  if (!s.token_source.empty()) CRUN_RETURN_IF_ERROR(CheckToken(s.token, s.token_source));

  std::string cert_src, key_src, ca_src;
  s.cert_path = FlagOrEnv(flags.tls_cert, "--tls-cert", "CRUN_TLS_CERT", &cert_src);
  const std::string key = FlagOrEnv(flags.tls_key, "--tls-key", "CRUN_TLS_KEY", &key_src);
  s.ca_path = FlagOrEnv(flags.tls_ca, "--tls-ca", "CRUN_TLS_CA", &ca_src);
  if (s.cert_path.empty() != key.empty()) {
    return InvalidArgument(s.cert_path.empty()
                               ? key_src + " " + key + " without a certificate (--tls-cert)"
                               : cert_src + " " + s.cert_path + " without its key (--tls-key)");
  }
  if (role == "service" && s.cert_path.empty() && !s.ca_path.empty()) {
    return InvalidArgument(ca_src + " " + s.ca_path +
                           ": a TLS service needs its own "
                           "certificate and key too (--tls-cert, --tls-key)");
  }
  if (!s.cert_path.empty()) {
    auto c = ReadWhole(cert_src, s.cert_path);
    if (!c.ok()) return c.status();
    auto k = ReadWhole(key_src, key);
    if (!k.ok()) return k.status();
    s.cert_pem = std::move(c).value();
    s.key_pem = std::move(k).value();
    if (s.cert_pem.find("-----BEGIN CERTIFICATE-----") == std::string::npos) {
      return InvalidArgument(cert_src + " " + s.cert_path + ": not a PEM certificate");
    }
    if (s.key_pem.find("PRIVATE KEY-----") == std::string::npos) {
      return InvalidArgument(key_src + " " + key + ": not a PEM private key");
    }
    struct stat st {};
    if (::stat(key.c_str(), &st) == 0 && (st.st_mode & 077) != 0 && role == "service") {
      // Not fatal (a shared read-only mount may not allow 0600), but worth saying.
      std::fprintf(stderr, "crun: warning: %s %s is readable by other users (mode %03o)\n",
                   key_src.c_str(), key.c_str(), st.st_mode & 0777);
    }
  }
  if (!s.ca_path.empty()) {
    auto c = ReadWhole(ca_src, s.ca_path);
    if (!c.ok()) return c.status();
    s.ca_pem = std::move(c).value();
    if (s.ca_pem.find("-----BEGIN CERTIFICATE-----") == std::string::npos) {
      return InvalidArgument(ca_src + " " + s.ca_path + ": not a PEM certificate");
    }
  }
  return s;
}

bool TokenMatches(std::string_view expected, std::string_view given) {
  unsigned char diff = expected.size() == given.size() ? 0 : 1;
  const std::size_t n = expected.size();
  for (std::size_t i = 0; i < n; ++i) {
    const unsigned char g = i < given.size() ? static_cast<unsigned char>(given[i]) : 0;
    diff |= static_cast<unsigned char>(static_cast<unsigned char>(expected[i]) ^ g);
  }
  return diff == 0;
}

std::string PeerIp(std::string_view peer) {
  std::string p(peer);
  // gRPC percent-encodes the brackets of IPv6 peers in some versions.
  for (const auto& [from, to] : {std::pair<std::string, std::string>{"%5B", "["}, {"%5D", "]"}}) {
    for (std::size_t at; (at = p.find(from)) != std::string::npos;) p.replace(at, 3, to);
  }
  if (p.rfind("ipv4:", 0) == 0) {
    p = p.substr(5);
    const auto colon = p.rfind(':');
    return colon == std::string::npos ? p : p.substr(0, colon);
  }
  if (p.rfind("ipv6:", 0) == 0) {
    p = p.substr(5);
    const auto open = p.find('[');
    const auto close = p.find(']');
    if (open != std::string::npos && close != std::string::npos && close > open) {
      p = p.substr(open + 1, close - open - 1);
    }
    // An IPv4 client of a dual-stack listener: report it as IPv4.
    if (p.rfind("::ffff:", 0) == 0 && p.find('.') != std::string::npos) p = p.substr(7);
    return p;
  }
  return p;
}

std::vector<std::string> RoundAllowList(const std::vector<std::vector<std::string>>& members,
                                        bool with_loopback) {
  std::vector<std::string> allowed;
  for (const auto& addresses : members) {
    if (addresses.empty()) return {};
    allowed.insert(allowed.end(), addresses.begin(), addresses.end());
  }
  if (with_loopback && !allowed.empty()) {
    allowed.push_back("127.0.0.1");
    allowed.push_back("::1");
  }
  return allowed;
}

}  // namespace crun
