#include "rendezvous/goodput/ledger.h"

#include <algorithm>
#include <numeric>
#include <utility>

namespace crun::goodput {
namespace {

constexpr std::array<std::string_view, kCategories> kNames{"training",  "redone",     "starting",
                                                           "detecting", "restarting", "reloading",
                                                           "waiting"};

// Keeps every other element once `v` holds `most`: marks stay spread over the whole job.
template <typename T>
void Thin(std::vector<T>& v, std::size_t most) {
  if (v.size() < most) return;
  std::size_t kept = 0;
  for (std::size_t i = 0; i < v.size(); i += 2) v[kept++] = v[i];
  v.resize(kept);
}

}  // namespace

std::string_view NameOf(Category c) { return kNames[static_cast<std::size_t>(c)]; }

std::optional<Category> CategoryNamed(std::string_view name) {
  for (Category c : kAllCategories) {
    if (NameOf(c) == name) return c;
  }
  return std::nullopt;
}

Ms Sum(const Totals& t) { return std::accumulate(t.begin(), t.end(), Ms{0}); }

Ledger Ledger::Launched(std::string node, std::string host, int nproc, Ms now) {
  Ledger l;
  l.led_.node = std::move(node);
  l.led_.host = std::move(host);
  l.led_.launched = l.led_.until = now;
  l.since_ = l.latest_ = now;
  l.ranks_.resize(static_cast<std::size_t>(std::max(nproc, 0)));
  return l;
}

Ms Ledger::Clamp(Ms t) const { return std::max(t, latest_); }

Category Ledger::PipelineCategory() const {
  return trained_ ? Category::kRestarting : Category::kStarting;
}

void Ledger::Close(Category c, Ms until, bool member) {
  until = std::max(until, since_);
  const Ms length = until - since_;
  if (length > 0) {
    At(led_.totals, c) += length;
    auto& segs = led_.segments;
    if (!segs.empty() && segs.back().category == c && segs.back().member == member &&
        segs.back().end == since_) {
      segs.back().end = until;
    } else {
      if (segs.size() >= kMaxSegments) segs.erase(segs.begin());  // the totals keep it
      segs.push_back({c, since_, until, member});
    }
    if (incident_) {
      Incident& i = led_.incidents[*incident_];
      if (c == Category::kTraining) {
        i.resumed = since_;
        incident_.reset();
      } else {
        At(i.cost, c) += length;
      }
    }
  }
  since_ = until;
  led_.until = until;
}

void Ledger::Enter(Mode m, Category c, Ms now) {
  Close(open_, now, mode_ != Mode::kSpare);
  mode_ = m;
  open_ = c;
}

void Ledger::GateHeld(Ms now) {
  now = latest_ = Clamp(now);
  if (mode_ == Mode::kDone) return;
  Enter(Mode::kGate, Category::kWaiting, now);
}

void Ledger::Joining(Ms now) {
  now = latest_ = Clamp(now);
  if (mode_ == Mode::kDone) return;
  if (mode_ == Mode::kTraining) Close(last_class_, now);
  Enter(trained_ ? Mode::kRejoining : Mode::kStarting, PipelineCategory(), now);
}

void Ledger::Assigned(Ms now, bool spare, Ms waited_for_nodes) {
  now = latest_ = Clamp(now);
  if (mode_ == Mode::kDone) return;
  const bool was_spare = mode_ == Mode::kSpare;
  const Ms waited = std::clamp(waited_for_nodes, Ms{0}, now - since_);
  Close(open_, now - waited, !was_spare);
  Close(Category::kWaiting, now, !was_spare);
  if (spare) {
    // A spare holds no job back: an incident it was recovering from is over for this node.
    if (incident_) led_.incidents[*incident_].resumed = now;
    incident_.reset();
    mode_ = Mode::kSpare;
    open_ = Category::kWaiting;
  } else {
    mode_ = trained_ ? Mode::kRejoining : Mode::kStarting;
    open_ = PipelineCategory();
  }
}

void Ledger::WorkersRunning(Ms now) {
  now = latest_ = Clamp(now);
  if (mode_ == Mode::kDone) return;
  for (Rank& r : ranks_) r = Rank{};
  Enter(Mode::kRunning, trained_ ? Category::kReloading : Category::kStarting, now);
  CheckAllProgressed(now);  // no local rank: nothing to wait for
}

void Ledger::Mark(Ms now, std::int64_t step) {
  led_.steps_known = true;
  if (awaiting_resume_step_ && incident_) {
    led_.incidents[*incident_].resumed_from = std::max<std::int64_t>(step - 1, 0);
  }
  awaiting_resume_step_ = false;
  seen_ = std::max(seen_.value_or(step), step);
  auto& points = led_.steps;
  if (!points.empty() && now - points.back().at < 1000) return;  // at most a point a second
  Thin(points, kMaxMarks);
  points.push_back({now, step});
}

void Ledger::CheckAllProgressed(Ms now) {
  if (mode_ != Mode::kRunning) return;
  for (const Rank& r : ranks_) {
    if (!r.progressed) return;
  }
  if (ranks_.empty()) return;
  Close(open_, now);
  trained_ = true;
  mode_ = Mode::kTraining;
  open_ = Category::kTraining;
}

void Ledger::Advance(Ms now, std::optional<std::int64_t> step) {
  if (step) Mark(now, *step);
  if (mode_ == Mode::kRunning) return CheckAllProgressed(now);
  if (mode_ != Mode::kTraining) return;
  if (!step && led_.steps_known) return;  // a beat between steps: the step decides
  last_class_ =
      step && redo_upto_ && *step <= *redo_upto_ ? Category::kRedone : Category::kTraining;
  Close(last_class_, now);
}

void Ledger::Progress(Ms now, int local_rank, std::optional<std::int64_t> step) {
  now = latest_ = Clamp(now);
  if (mode_ == Mode::kDone || local_rank < 0 || local_rank >= static_cast<int>(ranks_.size())) {
    return;
  }
  led_.progress_known = true;
  Rank& r = ranks_[static_cast<std::size_t>(local_rank)];
  if (mode_ == Mode::kRunning || mode_ == Mode::kTraining) {
    r.progressed = true;
    r.last = now;
  }
  Advance(now, step);
}

void Ledger::Saved(Ms now, std::optional<std::int64_t> node_step) {
  now = latest_ = Clamp(now);
  if (mode_ == Mode::kDone) return;
  Thin(led_.saves, kMaxMarks);
  led_.saves.push_back(now);
  if (mode_ != Mode::kRunning && mode_ != Mode::kTraining) return;
  // Every local rank holds the step saved: each has progressed.
  led_.progress_known = true;
  for (Rank& r : ranks_) {
    r.progressed = true;
    r.last = now;
  }
  Advance(now, node_step);
}

void Ledger::FailureKnown(Ms now, Ms fault, std::string kind, std::string cause) {
  now = latest_ = Clamp(now);
  if (mode_ == Mode::kDone) return;
  for (Rank& r : ranks_) r = Rank{};
  const bool recovering = incident_ && mode_ != Mode::kTraining;
  if (recovering) {
    Enter(Mode::kRejoining, PipelineCategory(), now);
    return;
  }
  fault = std::clamp(fault, since_, now);
  // A step under way when the fault came is thrown away: redone, where steps are told, and a
  // cost of this incident; what came before it is not.
  const Category before = mode_ != Mode::kTraining ? open_
                          : led_.steps_known       ? Category::kRedone
                                                   : Category::kTraining;
  if (before != Category::kRedone) Close(before, fault, mode_ != Mode::kSpare);
  if (led_.incidents.size() >= kMaxIncidents) led_.incidents.erase(led_.incidents.begin());
  Incident i;
  i.fault = fault;
  i.known = now;
  i.kind = std::move(kind);
  i.cause = std::move(cause);
  i.step_at_failure = seen_;
  led_.incidents.push_back(std::move(i));
  incident_ = led_.incidents.size() - 1;
  if (before == Category::kRedone) Close(before, fault);
  Close(Category::kDetecting, now);
  redo_upto_ = seen_;
  awaiting_resume_step_ = true;
  mode_ = Mode::kRejoining;
  open_ = PipelineCategory();
}

void Ledger::Finished(Ms now) {
  now = latest_ = Clamp(now);
  if (mode_ == Mode::kDone) return;
  Close(mode_ == Mode::kTraining ? last_class_ : open_, now, mode_ != Mode::kSpare);
  mode_ = Mode::kDone;
  led_.finished = true;
}

std::optional<Ms> Ledger::LastProgress(int local_rank) const {
  if (local_rank < 0 || local_rank >= static_cast<int>(ranks_.size())) return std::nullopt;
  return ranks_[static_cast<std::size_t>(local_rank)].last;
}

NodeLedger Ledger::Settled() const { return led_; }

NodeLedger Ledger::Live(Ms now) const {
  Ledger copy = *this;
  if (mode_ == Mode::kDone) return copy.led_;
  now = std::max(now, latest_);
  copy.Close(mode_ == Mode::kTraining ? last_class_ : open_, now, mode_ != Mode::kSpare);
  return copy.led_;
}

}  // namespace crun::goodput
