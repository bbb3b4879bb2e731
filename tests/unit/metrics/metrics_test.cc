// The metrics registry and Prometheus's text format: exact pages for each kind of metric,
// escaping, bounded cardinality, and the page checked by Prometheus's own promtool.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "metrics/exposition.h"
#include "metrics/registry.h"
#include "tests/unit/skip.h"

using crun::metrics::FormatValue;
using crun::metrics::Registry;

namespace {

// The page without the registry's own overflow family, which every page starts with.
std::string Body(const Registry& r) {
  std::string page = r.Render();
  const std::string own = "# TYPE crun_metrics_overflow_total counter\n";
  const auto at = page.find(own);
  REQUIRE(at != std::string::npos);
  std::size_t end = at + own.size();
  while (end < page.size() && page.compare(end, 28, "crun_metrics_overflow_total{") == 0) {
    end = page.find('\n', end) + 1;
  }
  return page.substr(end);
}

}  // namespace

TEST_CASE("metrics: values are written so that they read back exactly") {
  CHECK(FormatValue(0) == "0");
  CHECK(FormatValue(3) == "3");
  CHECK(FormatValue(0.1) == "0.1");
  CHECK(FormatValue(-2.5) == "-2.5");
  CHECK(FormatValue(1e21) == "1e+21");
  CHECK(FormatValue(std::numeric_limits<double>::infinity()) == "+Inf");
  CHECK(FormatValue(-std::numeric_limits<double>::infinity()) == "-Inf");
  CHECK(FormatValue(std::nan("")) == "NaN");
}

TEST_CASE("metrics: names and label names follow Prometheus's rules") {
  CHECK(crun::metrics::CheckMetricName("crun_rounds_formed_total").ok());
  CHECK(crun::metrics::CheckMetricName("job:restarts:rate5m").ok());
  CHECK(!crun::metrics::CheckMetricName("").ok());
  CHECK(crun::metrics::CheckMetricName("2xx").message() ==
        "metric name '2xx': character 1 is not allowed");
  CHECK(!crun::metrics::CheckMetricName("a-b").ok());
  CHECK(crun::metrics::CheckLabelName("run_id").ok());
  CHECK(!crun::metrics::CheckLabelName("a:b").ok());
  CHECK(crun::metrics::CheckLabelName("__name__").message() ==
        "label name '__name__': names starting with __ are Prometheus's");
}

TEST_CASE("metrics: counters, gauges and label values on the page") {
  Registry r;
  auto& exits =
      r.AddCounter("crun_worker_exits_total", "Workers that exited, by cause", {"run_id", "cause"});
  auto& workers = r.AddGauge("crun_workers", "Workers running");
  exits.With({"job7", "signal"}).Inc();
  exits.With({"job7", "exit_code"}).Inc(2);
  exits.With({"a\"b\\c\nd", "oom"}).Inc();  // escaped, not broken
  workers.With().Set(8);
  CHECK(Body(r) ==
        "# HELP crun_worker_exits_total Workers that exited, by cause\n"
        "# TYPE crun_worker_exits_total counter\n"
        "crun_worker_exits_total{run_id=\"a\\\"b\\\\c\\nd\",cause=\"oom\"} 1\n"
        "crun_worker_exits_total{run_id=\"job7\",cause=\"exit_code\"} 2\n"
        "crun_worker_exits_total{run_id=\"job7\",cause=\"signal\"} 1\n"
        "# HELP crun_workers Workers running\n"
        "# TYPE crun_workers gauge\n"
        "crun_workers 8\n");
}

TEST_CASE("metrics: a histogram's buckets are cumulative, with +Inf, sum and count") {
  Registry r;
  auto& h = r.AddHistogram("crun_round_formation_seconds", "Time to form a round", {"run_id"},
                           {0.25, 0.5, 1});
  auto& job = h.With({"j"});
  for (double v : {0.125, 0.25, 0.375, 0.75, 7.0}) job.Observe(v);  // exact in binary
  CHECK(Body(r) ==
        "# HELP crun_round_formation_seconds Time to form a round\n"
        "# TYPE crun_round_formation_seconds histogram\n"
        "crun_round_formation_seconds_bucket{run_id=\"j\",le=\"0.25\"} 2\n"
        "crun_round_formation_seconds_bucket{run_id=\"j\",le=\"0.5\"} 3\n"
        "crun_round_formation_seconds_bucket{run_id=\"j\",le=\"1\"} 4\n"
        "crun_round_formation_seconds_bucket{run_id=\"j\",le=\"+Inf\"} 5\n"
        "crun_round_formation_seconds_sum{run_id=\"j\"} 8.5\n"
        "crun_round_formation_seconds_count{run_id=\"j\"} 5\n");
}

TEST_CASE("metrics: cardinality is bounded, ended jobs' series are removed") {
  Registry r;
  auto& restarts = r.AddCounter("crun_restarts_total", "Restarts", {"run_id"}, 3);
  for (int i = 0; i < 5; ++i) restarts.With({"job" + std::to_string(i)}).Inc();
  CHECK(restarts.size() == 3);  // job0, job1, and "other" for job2..job4
  CHECK(restarts.With({"job1"}).value() == 1);
  const std::string page = r.Render();
  CHECK(page.find("crun_restarts_total{run_id=\"other\"} 3\n") != std::string::npos);
  CHECK(page.find("crun_metrics_overflow_total{metric=\"crun_restarts_total\"} 3\n") !=
        std::string::npos);
  restarts.RemoveWhere(0, "job0");
  CHECK(restarts.size() == 2);
  restarts.With({"job9"}).Inc();  // room again
  CHECK(r.Render().find("crun_restarts_total{run_id=\"job9\"} 1\n") != std::string::npos);
}

TEST_CASE("metrics: updates from many threads are all counted, OnScrape runs at each render") {
  Registry r;
  auto& c = r.AddCounter("crun_heartbeats_received_total", "Heartbeats");
  auto& h = r.AddHistogram("crun_x_seconds", "x", {}, {1});
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) {
        c.With().Inc();
        h.With().Observe(0.5);
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(c.With().value() == 40000);
  CHECK(h.With().Read().count == 40000);
  int scrapes = 0;
  auto& g = r.AddGauge("crun_store_open_connections", "Open connections");
  r.OnScrape([&] { g.With().Set(++scrapes); });
  r.Render();
  CHECK(r.Render().find("crun_store_open_connections 2\n") != std::string::npos);
}

TEST_CASE("metrics: promtool check metrics accepts the page", "[may-skip]") {
  if (std::system("command -v promtool >/dev/null 2>&1") != 0) {
    crun::testing::Skip("promtool is not installed (Debian package prometheus)");
  }
  Registry r;
  r.AddCounter("crun_restarts_total", "Restarts of the worker group", {"run_id"})
      .With({"job\"7"})
      .Inc();
  r.AddGauge("crun_agents_connected", "Agents with an open session").With().Set(3);
  r.AddHistogram("crun_round_formation_seconds", "Time to form a round", {"run_id"},
                 crun::metrics::LatencyBuckets())
      .With({"job7"})
      .Observe(0.02);
  char path[] = "/tmp/crun-metrics-XXXXXX";
  const int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  ::close(fd);
  {
    std::ofstream out(path);
    out << r.Render();
  }
  const std::string cmd = std::string("promtool check metrics < ") + path + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::string said;
  char buf[256];
  while (std::fgets(buf, sizeof buf, p) != nullptr) said += buf;
  const int rc = ::pclose(p);
  ::unlink(path);
  INFO(said);
  CHECK(rc == 0);
  CHECK(said.empty());  // no lint complaint either
}
