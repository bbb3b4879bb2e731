#include "rendezvous/etcd/goodput.h"

#include <algorithm>
#include <cstddef>

#include <nlohmann/json.hpp>

#include "rendezvous/goodput/ledger_json.h"

namespace crun::etcd {

std::string LedgerKey(const Keys& keys, const std::string& node_id) {
  return keys.prefix + "ledger/" + node_id;
}

std::string JobGoodputKey(const Keys& keys) { return keys.announce() + "goodput"; }

std::string EncodeLedger(goodput::NodeLedger ledger) {
  ledger.saves.clear();
  ledger.steps.clear();
  return goodput::ToJson(ledger).dump();
}

std::optional<std::string> LedgerPuts::Offer(Clock::time_point now,
                                             const goodput::NodeLedger& ledger) {
  Marks marks;
  marks.incidents = ledger.incidents.size();
  marks.resumed = static_cast<std::size_t>(
      std::count_if(ledger.incidents.begin(), ledger.incidents.end(),
                    [](const goodput::Incident& i) { return i.resumed != 0; }));
  marks.trained = goodput::At(ledger.totals, goodput::Category::kTraining) > 0;
  marks.finished = ledger.finished;
  std::string value = EncodeLedger(ledger);
  if (last_ && marks == marks_ && now - *last_ < kLedgerRefresh) {
    held_ = std::move(value);
    return std::nullopt;
  }
  last_ = now;
  marks_ = marks;
  held_.reset();
  return value;
}

std::vector<goodput::NodeLedger> Ledgers(const Keys& keys, const Mirror& mirror,
                                         std::optional<WallClock::time_point> wall,
                                         std::vector<std::string>* skipped) {
  std::vector<goodput::NodeLedger> out;
  const std::string prefix = LedgerKey(keys, "");
  for (auto it = mirror.lower_bound(prefix); it != mirror.end() && it->first.starts_with(prefix);
       ++it) {
    const std::string id = it->first.substr(prefix.size());
    auto ledger = goodput::NodeFromText(it->second.value, id);  // the key's node
    if (!ledger.ok()) {
      if (skipped != nullptr) skipped->push_back(it->first + ": " + ledger.status().message());
      continue;
    }
    if (wall && mirror.count(keys.node(id)) != 0) {
      goodput::CarryOn(*ledger, std::chrono::duration_cast<std::chrono::milliseconds>(
                                    wall->time_since_epoch())
                                    .count());
    }
    out.push_back(std::move(ledger).value());
  }
  return out;
}

std::string EncodeJobGoodput(goodput::JobLedger job, std::size_t nodes) {
  job.segments.clear();
  job.nodes.clear();
  // The newest a ledger keeps (every node's own are capped alike; their union may be more).
  if (job.incidents.size() > goodput::kMaxIncidents) {
    job.incidents.erase(job.incidents.begin(),
                        job.incidents.end() - static_cast<std::ptrdiff_t>(goodput::kMaxIncidents));
  }
  nlohmann::ordered_json j = {{"nodes", nodes}, {"job", goodput::JobJson(job)}};
  return j.dump();
}

StatusOr<JobGoodput> DecodeJobGoodput(const std::string& text) {
  return Guarded("the job's goodput", [&]() -> StatusOr<JobGoodput> {
    const auto j = nlohmann::json::parse(text);
    JobGoodput out;
    out.nodes = j.at("nodes").get<std::size_t>();
    CRUN_ASSIGN_OR_RETURN(out.job, goodput::JobFromJson(j.at("job")));
    return out;
  });
}

}  // namespace crun::etcd
