// Prometheus's text exposition format, version 0.0.4 (what a /metrics page holds): names and
// label names checked, label values and help text escaped, numbers written so that a scraper
// reads back exactly the value held. Pure functions over plain values, tested without sockets
// (tests/unit/metrics), and checked with Prometheus's own `promtool check metrics`.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "base/status.h"

namespace crun::metrics {

// Name/value pairs in the order the family declares its label names.
using Labels = std::vector<std::pair<std::string, std::string>>;

inline constexpr char kContentType[] = "text/plain; version=0.0.4; charset=utf-8";

// [a-zA-Z_:][a-zA-Z0-9_:]*; the message names the bad name.
Status CheckMetricName(const std::string& name);
// [a-zA-Z_][a-zA-Z0-9_]*, not starting with "__" (reserved for Prometheus).
Status CheckLabelName(const std::string& name);

// "1", "0.25", "1e+21", "+Inf", "-Inf", "NaN": the shortest text that reads back as `v`.
std::string FormatValue(double v);

// Appends the "# HELP" and "# TYPE" lines of a family ("counter", "gauge", "histogram").
void WriteHeader(std::string& out, const std::string& name, const std::string& help,
                 const char* type);
// Appends one sample: name{a="x",b="y"} value
void WriteSample(std::string& out, const std::string& name, const Labels& labels, double value);

}  // namespace crun::metrics
