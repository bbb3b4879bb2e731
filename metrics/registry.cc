#include "metrics/registry.h"

#include <cstdio>
#include <cstdlib>

#include "metrics/exposition.h"

namespace crun::metrics {
namespace {

// Names are the program's constants: a bad one is a bug, found by the first test that runs.
void Require(const Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "crun: metrics: %s\n", s.message().c_str());
    std::abort();
  }
}

Labels Zip(const std::vector<std::string>& names, const std::vector<std::string>& values) {
  Labels out;
  out.reserve(names.size() + 1);
  for (std::size_t i = 0; i < names.size(); ++i) out.emplace_back(names[i], values[i]);
  return out;
}

}  // namespace

Histogram::Histogram(const std::vector<double>& bounds)
    : bounds_(bounds), counts_(new std::atomic<std::uint64_t>[bounds.size() + 1]) {
  for (std::size_t i = 0; i + 1 < bounds_.size(); ++i) {
    if (!(bounds_[i] < bounds_[i + 1])) {
      Require(InvalidArgument("histogram bounds must ascend: " + FormatValue(bounds_[i]) +
                              " then " + FormatValue(bounds_[i + 1])));
    }
  }
  for (std::size_t i = 0; i <= bounds_.size(); ++i) counts_[i].store(0);
}

void Histogram::Observe(double v) {
  std::size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;  // le: v <= bound
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
}

Histogram::Snapshot Histogram::Read() const {
  Snapshot s;
  std::uint64_t running = 0;
  for (std::size_t i = 0; i <= bounds_.size(); ++i) {
    running += counts_[i].load(std::memory_order_relaxed);
    s.cumulative.push_back(running);
  }
  s.count = running;
  s.sum = sum_.load(std::memory_order_relaxed);
  return s;
}

std::vector<double> LatencyBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
}

FamilyBase::FamilyBase(std::string name, std::string help, std::vector<std::string> label_names,
                       std::size_t max_series)
    : name_(std::move(name)),
      help_(std::move(help)),
      label_names_(std::move(label_names)),
      max_series_(max_series) {
  Require(CheckMetricName(name_));
  for (const auto& l : label_names_) Require(CheckLabelName(l));
}

void FamilyBase::CheckArity(const std::vector<std::string>& values) const {
  if (values.size() != label_names_.size()) {
    Require(InvalidArgument(name_ + " has " + std::to_string(label_names_.size()) +
                            " labels, given " + std::to_string(values.size()) + " values"));
  }
}

template <typename M>
void Family<M>::RenderScalars(std::string& out, const char* type) const {
  WriteHeader(out, name_, help_, type);
  std::lock_guard lock(mu_);
  for (const auto& [values, m] : series_) {
    WriteSample(out, name_, Zip(label_names_, values), m->value());
  }
}

template <>
void Family<Counter>::Render(std::string& out) const {
  RenderScalars(out, "counter");
}

template <>
void Family<Gauge>::Render(std::string& out) const {
  RenderScalars(out, "gauge");
}

template <>
void Family<Histogram>::Render(std::string& out) const {
  WriteHeader(out, name_, help_, "histogram");
  std::lock_guard lock(mu_);
  for (const auto& [values, h] : series_) {
    const auto snap = h->Read();
    Labels labels = Zip(label_names_, values);
    labels.emplace_back("le", "");
    for (std::size_t i = 0; i < snap.cumulative.size(); ++i) {
      labels.back().second = i < h->bounds().size() ? FormatValue(h->bounds()[i]) : "+Inf";
      WriteSample(out, name_ + "_bucket", labels, static_cast<double>(snap.cumulative[i]));
    }
    labels.pop_back();
    WriteSample(out, name_ + "_sum", labels, snap.sum);
    WriteSample(out, name_ + "_count", labels, static_cast<double>(snap.count));
  }
}

Registry::Registry() {
  auto family = std::make_unique<Family<Counter>>(
      "crun_metrics_overflow_total",
      "Series that went to a family's \"other\" series because it held its maximum",
      std::vector<std::string>{"metric"}, kDefaultMaxSeries, nullptr);
  overflow_ = family.get();
  Add(std::move(family));
}

void Registry::Add(std::unique_ptr<FamilyBase> family) {
  std::lock_guard lock(mu_);
  for (const auto& f : families_) {
    if (f->name() == family->name())
      Require(InvalidArgument("metric " + f->name() + " added twice"));
  }
  families_.push_back(std::move(family));
}

template <typename M, typename... Args>
Family<M>& Registry::Emplace(const std::string& name, const std::string& help,
                             std::vector<std::string> label_names, std::size_t max_series,
                             Args&&... args) {
  auto* overflow = overflow_;
  auto f = std::make_unique<Family<M>>(
      name, help, std::move(label_names), max_series,
      [overflow, name] { overflow->With({name}).Inc(); }, std::forward<Args>(args)...);
  auto& ref = *f;
  Add(std::move(f));
  return ref;
}

Family<Counter>& Registry::AddCounter(const std::string& name, const std::string& help,
                                      std::vector<std::string> label_names,
                                      std::size_t max_series) {
  return Emplace<Counter>(name, help, std::move(label_names), max_series);
}

Family<Gauge>& Registry::AddGauge(const std::string& name, const std::string& help,
                                  std::vector<std::string> label_names, std::size_t max_series) {
  return Emplace<Gauge>(name, help, std::move(label_names), max_series);
}

Family<Histogram>& Registry::AddHistogram(const std::string& name, const std::string& help,
                                          std::vector<std::string> label_names,
                                          const std::vector<double>& bounds,
                                          std::size_t max_series) {
  for (const auto& l : label_names) {
    if (l == "le") Require(InvalidArgument("histogram " + name + ": 'le' is the bucket's label"));
  }
  return Emplace<Histogram>(name, help, std::move(label_names), max_series, bounds);
}

void Registry::OnScrape(std::function<void()> refresh) {
  std::lock_guard lock(mu_);
  refresh_.push_back(std::move(refresh));
}

std::string Registry::Render() const {
  std::vector<std::function<void()>> refresh;
  {
    std::lock_guard lock(mu_);
    refresh = refresh_;
  }
  for (const auto& r : refresh) r();
  std::string out;
  std::lock_guard lock(mu_);
  for (const auto& f : families_) f->Render(out);
  return out;
}

}  // namespace crun::metrics
