#include "rendezvous/service/job_goodput.h"

#include "rendezvous/goodput/ledger_json.h"

namespace crun::rdzv {

Status JobGoodput::Received(const std::string& node_id, const std::string& json, TimePoint now) {
  auto ledger = goodput::NodeFromText(json, node_id);  // the session's node, whatever it says
  if (!ledger.ok()) return ledger.status();
  nodes_[node_id] = Held{std::move(ledger).value(), now};
  return Status::Ok();
}

std::vector<goodput::NodeLedger> JobGoodput::AsOf(TimePoint now,
                                                  const std::set<std::string>& live) const {
  std::vector<goodput::NodeLedger> out;
  for (const auto& [id, held] : nodes_) {
    goodput::NodeLedger n = held.ledger;
    const auto more = std::chrono::duration_cast<std::chrono::milliseconds>(now - held.received);
    if (live.count(id) != 0) goodput::CarryOn(n, n.until + more.count());
    out.push_back(std::move(n));
  }
  return out;
}

msg::GoodputFigures FiguresOf(const goodput::Totals& totals, std::size_t incidents,
                              bool steps_known, bool progress_known) {
  msg::GoodputFigures f;
  f.known = progress_known;
  f.ratio = goodput::Goodput(totals);
  for (goodput::Category c : goodput::kAllCategories) {
    f.seconds.emplace_back(std::string(goodput::NameOf(c)),
                           static_cast<double>(goodput::At(totals, c)) / 1000.0);
  }
  f.incidents = static_cast<int>(incidents);
  f.summary = goodput::Summary(totals, incidents, steps_known, progress_known);
  return f;
}

}  // namespace crun::rdzv
