// The goodput timeline (rendezvous/goodput/timeline.h): a lane per node, a mark per incident
// with its cause (escaped) in the tooltip, the totals as the JSON has them, nothing fetched.
#include <catch2/catch.hpp>

#include <string>

#include "rendezvous/goodput/job_ledger.h"
#include "rendezvous/goodput/timeline.h"

namespace {

using crun::goodput::Ledger;

std::size_t Count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST_CASE("goodput timeline: lanes, incident marks with causes, totals, nothing fetched",
          "[goodput]") {
  auto a = Ledger::Launched("node-a", "host-a", 1, 0);
  auto b = Ledger::Launched("node-b", "host-b", 1, 0);
  for (Ledger* l : {&a, &b}) {
    l->Joining(0);
    l->Assigned(100, false, 0);
    l->WorkersRunning(200);
    for (int s = 1; s <= 5; ++s) l->Progress(1000 * s, 0, s);
  }
  a.Saved(3000, 3);
  a.FailureKnown(5500, 5500, "exception",
                 "rank 0 failed: ValueError: <script>alert(\"x\")</script>");
  b.FailureKnown(5600, 5600, "peer", "a peer failed");
  for (Ledger* l : {&a, &b}) {
    l->Joining(6000);
    l->Assigned(6100, false, 0);
    l->WorkersRunning(6200);
    l->Progress(7000, 0, 4);
    l->Progress(8000, 0, 6);
  }
  a.FailureKnown(12000, 9000, "hang", "no progress for 3.0 s");
  b.FailureKnown(12000, 12000, "peer", "a peer failed");
  a.Finished(13000);
  b.Finished(13000);
  const auto job = crun::goodput::Combine({a.Settled(), b.Settled()});
  REQUIRE(job.incidents.size() == 2);
  const std::string page = crun::goodput::RenderTimeline(job, "run-1 <&>");
  CHECK(Count(page, "<g class=\"lane\"") == 2);
  CHECK(Count(page, "<g class=\"job-lane\"") == 1);
  CHECK(Count(page, "<g class=\"incident\"") == 2);
  CHECK(Count(page, "<line class=\"save\"") == 1);
  CHECK(page.find("ValueError: &lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;") !=
        std::string::npos);
  CHECK(page.find("<script") == std::string::npos);
  CHECK(page.find("run-1 &lt;&amp;&gt;") != std::string::npos);
  CHECK(page.find("no progress for 3.0 s") != std::string::npos);
  for (const char* fetch : {"src=", "href=", "url(", "@import", "http://", "https://"}) {
    CHECK(page.find(fetch) == std::string::npos);
  }
  for (auto c : crun::goodput::kAllCategories) {
    CHECK(page.find("<tr data-category=\"" + std::string(crun::goodput::NameOf(c)) +
                    "\" data-ms=\"" + std::to_string(crun::goodput::At(job.totals, c)) + "\"") !=
          std::string::npos);
  }
}

}  // namespace
