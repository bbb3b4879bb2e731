#include "metrics/exposition.h"

#include <charconv>
#include <cmath>

namespace crun::metrics {
namespace {

bool NameChar(char c, bool first, bool colon) {
  const bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  const bool digit = c >= '0' && c <= '9';
  return letter || (colon && c == ':') || (!first && digit);
}

Status CheckName(const std::string& name, bool colon, const char* what) {
  if (name.empty()) return InvalidArgument(std::string("empty ") + what);
  for (std::size_t i = 0; i < name.size(); ++i) {
    if (!NameChar(name[i], i == 0, colon)) {
      return InvalidArgument(std::string(what) + " '" + name + "': character " +
                             std::to_string(i + 1) + " is not allowed");
    }
  }
  return Status::Ok();
}

// HELP text escapes backslash and newline; label values also the double quote.
void Escape(std::string& out, const std::string& text, bool quote) {
  for (char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (quote && c == '"') {
      out += "\\\"";
    } else {
      out += c;
    }
  }
}

}  // namespace

Status CheckMetricName(const std::string& name) { return CheckName(name, true, "metric name"); }

Status CheckLabelName(const std::string& name) {
  CRUN_RETURN_IF_ERROR(CheckName(name, false, "label name"));
  if (name.rfind("__", 0) == 0) {
    return InvalidArgument("label name '" + name + "': names starting with __ are Prometheus's");
  }
  return Status::Ok();
}

std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[32];
  // Shortest round-trip form: integers print as integers, 0.1 as 0.1.
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  return ec == std::errc() ? std::string(buf, end) : std::string("NaN");
}

void WriteHeader(std::string& out, const std::string& name, const std::string& help,
                 const char* type) {
  out += "# HELP ";
  out += name;
  out += ' ';
  Escape(out, help, false);
  out += "\n# TYPE ";
  out += name;
  out += ' ';
  out += type;
  out += '\n';
}

void WriteSample(std::string& out, const std::string& name, const Labels& labels, double value) {
  out += name;
  if (!labels.empty()) {
    out += '{';
    for (std::size_t i = 0; i < labels.size(); ++i) {
      if (i > 0) out += ',';
      out += labels[i].first;
      out += "=\"";
      Escape(out, labels[i].second, true);
      out += '"';
    }
    out += '}';
  }
  out += ' ';
  out += FormatValue(value);
  out += '\n';
}

}  // namespace crun::metrics
