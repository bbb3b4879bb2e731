// The goodput ledger of one node (docs/observability.md, "Goodput"): every millisecond of the
// node's wall time since its crun started, in exactly one category. Pure: events in, with the
// time they happened (wall milliseconds, injected), the ledger out; no clock is read here.
//
//   training    the workers run and progress on steps not done before
//   redone      the workers train steps done before a failure (counted as they are trained
//               again: a step whose number is at most the highest seen before the failure),
//               and the part of a step under way when a crash threw it away
//   starting    launch until every local rank's first progress (a failure before it is
//               detecting, then starting again)
//   detecting   the fault until crun knows of it: about zero for a crash, from the hung rank's
//               last progress for a hang, from a lost node's last heartbeat for a lost node
//   restarting  the failure known until the workers run again: stop, edge, rendezvous, spawn
//   reloading   the workers started again until every local rank's first progress
//   waiting     for nodes (the rendezvous says how long), as a spare, for the health gate
//
// Time since the workers' last progress is pending: whether it was training, redone or the
// start of a hang is known only at the next progress or failure. Settled totals therefore
// lag by at most a step, and never go down; the live view counts the pending time as its
// current category.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace crun::goodput {

enum class Category {
  kTraining,
  kRedone,
  kStarting,
  kDetecting,
  kRestarting,
  kReloading,
  kWaiting
};
inline constexpr int kCategories = 7;
inline constexpr std::array<Category, kCategories> kAllCategories{Category::kTraining,
                                                                  Category::kRedone,
                                                                  Category::kStarting,
                                                                  Category::kDetecting,
                                                                  Category::kRestarting,
                                                                  Category::kReloading,
                                                                  Category::kWaiting};

// "training", "redone", ...
std::string_view NameOf(Category c);
std::optional<Category> CategoryNamed(std::string_view name);

using Ms = std::int64_t;  // wall-clock milliseconds since the Unix epoch
using Totals = std::array<Ms, kCategories>;
inline Ms& At(Totals& t, Category c) { return t[static_cast<std::size_t>(c)]; }
inline Ms At(const Totals& t, Category c) { return t[static_cast<std::size_t>(c)]; }
Ms Sum(const Totals& t);

struct Segment {
  Category category = Category::kStarting;
  Ms begin = 0, end = 0;
  bool member = true;  // false: a spare's wait, which holds no job back (job_ledger.h)
  bool operator==(const Segment&) const = default;
};

// A failure, from its fault until the workers train new steps again.
struct Incident {
  Ms fault = 0;       // when it happened (the hung rank's last progress, the lost node's last beat)
  Ms known = 0;       // when crun knew
  std::string kind;   // "crash", "hang", "slow", "oom", "signal", "node lost", "peer", ...
  std::string cause;  // in words, from the failure report
  std::optional<std::int64_t> step_at_failure;  // the highest step any local rank had done
  std::optional<std::int64_t> resumed_from;     // the step the workers came back at
  Ms resumed = 0;  // when the workers trained a new step again; 0: not yet
  Totals cost{};   // what it cost, by category
  bool operator==(const Incident&) const = default;
};

// A point of the step rate: the node's newest step at a time.
struct StepPoint {
  Ms at = 0;
  std::int64_t step = 0;
  bool operator==(const StepPoint&) const = default;
};

struct NodeLedger {
  std::string node;  // the rendezvous's node id
  std::string host;
  Ms launched = 0;
  Ms until = 0;                 // the figures are as of this time
  Totals totals{};              // sum to until - launched
  bool steps_known = false;     // some worker reported step numbers: "redone" can be told
  bool progress_known = false;  // some worker reported progress: "starting"/"reloading" ends
  bool finished = false;
  std::vector<Segment> segments;    // in time order; same-category neighbours merged
  std::vector<Incident> incidents;  // in time order
  std::vector<Ms> saves;            // snapshot saves (thinned to kMaxMarks)
  std::vector<StepPoint> steps;     // the step rate's points (thinned to kMaxMarks)
  bool operator==(const NodeLedger&) const = default;
};

inline constexpr std::size_t kMaxSegments = 4096;
inline constexpr std::size_t kMaxIncidents = 256;
inline constexpr std::size_t kMaxMarks = 512;

// What the ledger is told. Times are wall milliseconds, in order (a time earlier than the
// last one is taken as the last one).
struct Ledger {
  // The job's node: its first event. `nproc` local ranks.
  static Ledger Launched(std::string node, std::string host, int nproc, Ms now);

  // A health check holds the join (waiting), until Joining.
  void GateHeld(Ms now);
  // The join is asked for (after the gate, if any).
  void Joining(Ms now);
  // A round was assigned: as a member, or as its spare (waiting until a member again).
  // `waited_for_nodes`: how long of it the rendezvous waited for enough nodes.
  void Assigned(Ms now, bool spare, Ms waited_for_nodes);
  // The attempt's workers run.
  void WorkersRunning(Ms now);
  // Local rank `local_rank` progressed; `step` when it named one.
  void Progress(Ms now, int local_rank, std::optional<std::int64_t> step);
  // A snapshot was saved; `node_step`: the newest step every local rank holds, if known.
  void Saved(Ms now, std::optional<std::int64_t> node_step);
  // A failure is known now; it happened at `fault` (clamped to [the last progress or change,
  // now]). A failure while one is being recovered from is part of it.
  void FailureKnown(Ms now, Ms fault, std::string kind, std::string cause);
  // The job ends on this node.
  void Finished(Ms now);

  // Where the node's time goes now: what its pending time will most likely be.
  Category Current() const { return mode_ == Mode::kTraining ? last_class_ : open_; }
  // The last progress of local rank `local_rank` in this attempt, if any (a hang's fault).
  std::optional<Ms> LastProgress(int local_rank) const;

  // Settled: closed time only (never goes down). Live: pending time counted too, up to `now`.
  NodeLedger Settled() const;
  NodeLedger Live(Ms now) const;

 private:
  struct Rank {
    bool progressed = false;  // in this attempt
    std::optional<Ms> last;
  };
  enum class Mode { kStarting, kGate, kRejoining, kRunning, kTraining, kSpare, kDone };

  void Close(Category c, Ms until, bool member = true);
  void Enter(Mode m, Category c, Ms now);
  void Mark(Ms now, std::int64_t step);
  void Advance(Ms now, std::optional<std::int64_t> step);
  void CheckAllProgressed(Ms now);
  Ms Clamp(Ms t) const;
  Category PipelineCategory() const;  // starting before the first training, else restarting

  NodeLedger led_;
  Mode mode_ = Mode::kStarting;
  Category open_ = Category::kStarting;
  Ms since_ = 0;  // the open segment's start
  Ms latest_ = 0;
  std::vector<Rank> ranks_;
  bool trained_ = false;                       // every local rank progressed once
  std::optional<std::int64_t> seen_;           // the highest step seen
  std::optional<std::int64_t> redo_upto_;      // steps at most this are redone
  std::optional<std::size_t> incident_;        // the one being recovered from
  Category last_class_ = Category::kTraining;  // of the last step: what pending time is
  bool awaiting_resume_step_ = false;
};

}  // namespace crun::goodput
