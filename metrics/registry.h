// Metrics as Prometheus reads them (docs/observability.md): counters, gauges and histograms in
// families of one name, one help text and fixed label names, one series per tuple of label
// values. Updating a series is lock-free (atomics); finding one by its labels takes the
// family's mutex, so hot paths keep the reference With() returns.
//
// Cardinality is bounded per family: at most `max_series` series, the last of them shared by
// every further tuple and labelled "other" in each label, and crun_metrics_overflow_total
// counts how often that happened. Series of a job that ended are removed (Remove), so a
// long-lived daemon holds the live jobs' series, not every job's it ever saw.
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace crun::metrics {

inline constexpr std::size_t kDefaultMaxSeries = 1000;
inline constexpr char kOverflowValue[] = "other";

class Counter {
 public:
  void Inc(double by = 1) { v_.fetch_add(by, std::memory_order_relaxed); }
  // A total counted elsewhere (a server's statistics), copied at scrape time.
  void Mirror(double total) { v_.store(total, std::memory_order_relaxed); }
  double value() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> v_{0};
};

class Gauge {
 public:
  void Set(double v) { v_.store(v, std::memory_order_relaxed); }
  void Inc(double by = 1) { v_.fetch_add(by, std::memory_order_relaxed); }
  void Dec(double by = 1) { v_.fetch_sub(by, std::memory_order_relaxed); }
  double value() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> v_{0};
};

// Buckets by upper bound (le), ascending; +Inf is implied.
class Histogram {
 public:
  explicit Histogram(const std::vector<double>& bounds);
  void Observe(double v);

  struct Snapshot {
    std::vector<std::uint64_t> cumulative;  // one per bound, then +Inf
    double sum = 0;
    std::uint64_t count = 0;
  };
  Snapshot Read() const;
  const std::vector<double>& bounds() const { return bounds_; }

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<std::uint64_t>[]> counts_;  // bounds_.size() + 1
  std::atomic<double> sum_{0};
};

// Seconds, for latencies from a millisecond to a minute.
std::vector<double> LatencyBuckets();

class FamilyBase {
 public:
  FamilyBase(std::string name, std::string help, std::vector<std::string> label_names,
             std::size_t max_series);
  virtual ~FamilyBase() = default;
  const std::string& name() const { return name_; }
  // Appends the family (HELP, TYPE, every series) to `out`.
  virtual void Render(std::string& out) const = 0;

 protected:
  // The label values checked against the names (an invariant: a wrong count aborts).
  void CheckArity(const std::vector<std::string>& values) const;

  std::string name_;
  std::string help_;
  std::vector<std::string> label_names_;
  std::size_t max_series_;
};

template <typename M>
class Family final : public FamilyBase {
 public:
  template <typename... Args>
  Family(std::string name, std::string help, std::vector<std::string> label_names,
         std::size_t max_series, std::function<void()> on_overflow, Args&&... args)
      : FamilyBase(std::move(name), std::move(help), std::move(label_names), max_series),
        on_overflow_(std::move(on_overflow)),
        make_([=] { return std::make_unique<M>(args...); }) {
    if (label_names_.empty()) series_[{}] = make_();  // shown (at 0) before its first use
  }

  // The series for these label values (one per label name), made at first use. The
  // reference stays valid until Remove() of the same values.
  M& With(const std::vector<std::string>& values = {}) {
    CheckArity(values);
    std::lock_guard lock(mu_);
    auto it = series_.find(values);
    if (it != series_.end()) return *it->second;
    // At most max_series_ series, one of them kept for the overflow.
    if (series_.size() + 1 >= max_series_) {
      std::vector<std::string> other(values.size(), kOverflowValue);
      const bool has_other = series_.count(other) != 0;
      if (series_.size() - (has_other ? 1 : 0) + 1 >= max_series_) {
        if (on_overflow_) on_overflow_();
        auto& slot = series_[other];
        if (!slot) slot = make_();
        return *slot;
      }
    }
    auto& slot = series_[values];
    slot = make_();
    return *slot;
  }
  void Remove(const std::vector<std::string>& values) {
    std::lock_guard lock(mu_);
    series_.erase(values);
  }
  // Every series whose value of label `index` is `value` (a run id's, when its job ended).
  void RemoveWhere(std::size_t index, const std::string& value) {
    std::lock_guard lock(mu_);
    std::erase_if(series_, [&](const auto& s) { return s.first.at(index) == value; });
  }
  std::size_t size() const {
    std::lock_guard lock(mu_);
    return series_.size();
  }
  void Render(std::string& out) const override;

 private:
  void RenderScalars(std::string& out, const char* type) const;  // counters and gauges

  std::function<void()> on_overflow_;
  std::function<std::unique_ptr<M>()> make_;
  mutable std::mutex mu_;
  std::map<std::vector<std::string>, std::unique_ptr<M>> series_;
};

class Registry {
 public:
  Registry();
  Family<Counter>& AddCounter(const std::string& name, const std::string& help,
                              std::vector<std::string> label_names = {},
                              std::size_t max_series = kDefaultMaxSeries);
  Family<Gauge>& AddGauge(const std::string& name, const std::string& help,
                          std::vector<std::string> label_names = {},
                          std::size_t max_series = kDefaultMaxSeries);
  Family<Histogram>& AddHistogram(const std::string& name, const std::string& help,
                                  std::vector<std::string> label_names,
                                  const std::vector<double>& bounds,
                                  std::size_t max_series = kDefaultMaxSeries);
  // Runs before each Render(): values that are read rather than counted (a server's
  // statistics, taken on its own thread) are set here.
  void OnScrape(std::function<void()> refresh);

  // The whole page, families in the order they were added.
  std::string Render() const;

 private:
  void Add(std::unique_ptr<FamilyBase> family);
  template <typename M, typename... Args>
  Family<M>& Emplace(const std::string& name, const std::string& help,
                     std::vector<std::string> label_names, std::size_t max_series, Args&&... args);

  mutable std::mutex mu_;
  std::vector<std::unique_ptr<FamilyBase>> families_;
  std::vector<std::function<void()>> refresh_;
  Family<Counter>* overflow_ = nullptr;
};

}  // namespace crun::metrics
