#include "rendezvous/goodput/timeline.h"

#include <algorithm>
#include <cstdio>
#include <string_view>

namespace crun::goodput {
namespace {

constexpr double kWidth = 1000;  // the plot's width, in SVG units
constexpr double kLabel = 150;   // the lanes' names, left of the plot
constexpr double kLane = 26;     // a lane's height
constexpr double kGap = 8;
constexpr double kRate = 80;  // the step rate's panel

// Colours a reader tells apart, training green, the costs warm to cold.
constexpr std::array<std::string_view, kCategories> kColours{"#2e9e44", "#e8a33d", "#8c9fb8",
                                                             "#d6452f", "#a455c4", "#4a7fd0",
                                                             "#b7b7b7"};

std::string Escaped(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string Num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

std::string Seconds(Ms ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", static_cast<double>(ms) / 1000.0);
  return buf;
}

struct Plot {
  Ms begin = 0, end = 1;
  double X(Ms t) const {
    const double span = static_cast<double>(std::max<Ms>(end - begin, 1));
    return kLabel + kWidth * static_cast<double>(std::clamp(t, begin, end) - begin) / span;
  }
};

// The costs of an incident, in words: "detecting 3.0 s, restarting 0.4 s".
std::string CostWords(const Totals& cost) {
  std::string out;
  for (Category c : kAllCategories) {
    if (At(cost, c) < 50) continue;  // what rounds to 0.0 s says nothing
    out +=
        std::string(out.empty() ? "" : ", ") + std::string(NameOf(c)) + " " + Spoken(At(cost, c));
  }
  return out.empty() ? "nothing" : out;
}

void Lane(std::string& svg, const Plot& p, double y, const std::string& name, const std::string& id,
          const std::vector<Segment>& segments, const char* cls) {
  svg += "<g class=\"" + std::string(cls) + "\" data-node=\"" + Escaped(id) + "\">";
  svg += "<text class=\"name\" x=\"4\" y=\"" + Num(y + kLane * 0.65) + "\">" + Escaped(name) +
         "</text>";
  for (const Segment& s : segments) {
    const double x0 = p.X(s.begin), x1 = p.X(s.end);
    svg += "<rect class=\"seg c-" + std::string(NameOf(s.category)) + (s.member ? "" : " spare") +
           "\" data-category=\"" + std::string(NameOf(s.category)) + "\" data-ms=\"" +
           std::to_string(s.end - s.begin) + "\" x=\"" + Num(x0) + "\" y=\"" + Num(y) +
           "\" width=\"" + Num(std::max(x1 - x0, 0.5)) + "\" height=\"" + Num(kLane) +
           "\"><title>" + std::string(NameOf(s.category)) + (s.member ? "" : " (a spare)") + " " +
           Spoken(s.end - s.begin) + ", from +" + Spoken(s.begin - p.begin) + "</title></rect>";
  }
  svg += "</g>";
}

// The lanes: the job's, then each node's with its saves.
void Lanes(std::string& svg, const JobLedger& job, const Plot& p, double lanes_y, double nodes_y) {
  Lane(svg, p, lanes_y, "job", "", job.segments, "job-lane");
  double y = nodes_y;
  for (const NodeLedger& n : job.nodes) {
    Lane(svg, p, y, n.node + (n.host.empty() || n.host == n.node ? "" : " (" + n.host + ")"),
         n.node, n.segments, "lane");
    for (const Ms t : n.saves) {
      svg += "<line class=\"save\" x1=\"" + Num(p.X(t)) + "\" x2=\"" + Num(p.X(t)) + "\" y1=\"" +
             Num(y + kLane) + "\" y2=\"" + Num(y + kLane + 4) + "\"/>";
    }
    y += kLane + kGap;
  }
}

// One mark per incident of the job, across every lane, its cause in the tooltip.
void Incidents(std::string& svg, const JobLedger& job, const Plot& p, double lanes_y,
               double rate_y) {
  for (std::size_t i = 0; i < job.incidents.size(); ++i) {
    const Incident& inc = job.incidents[i];
    const double x = p.X(inc.fault);
    std::string tip = "incident " + std::to_string(i + 1) + ": " + inc.kind + " at +" +
                      Spoken(inc.fault - p.begin) + ": " + inc.cause + ". Known after " +
                      Spoken(inc.known - inc.fault) + "; cost " + CostWords(inc.cost);
    if (inc.step_at_failure && inc.resumed_from) {
      tip += "; step " + std::to_string(*inc.step_at_failure) + ", resumed from " +
             std::to_string(*inc.resumed_from);
    }
    svg += "<g class=\"incident\" data-kind=\"" + Escaped(inc.kind) + "\"><title>" + Escaped(tip) +
           "</title><line x1=\"" + Num(x) + "\" x2=\"" + Num(x) + "\" y1=\"" + Num(lanes_y - 4) +
           "\" y2=\"" + Num(rate_y - kGap) + "\"/><path d=\"M" + Num(x - 6) + " " +
           Num(lanes_y - 6) + " h12 l-6 9 z\"/></g>";
  }
}

// Each node's step rate: steps a second between its points (a point a second, ledger.h), a
// line broken where the steps stopped or went back (an incident).
void Rates(std::string& svg, const JobLedger& job, const Plot& p, double rate_y) {
  double top = 0;
  struct Run {
    std::size_t node = 0;
    std::vector<std::pair<Ms, double>> points;
  };
  std::vector<Run> rates;
  for (std::size_t k = 0; k < job.nodes.size(); ++k) {
    const auto& steps = job.nodes[k].steps;
    bool open = false;
    for (std::size_t i = 1; i < steps.size(); ++i) {
      const Ms dt = steps[i].at - steps[i - 1].at;
      const auto ds = steps[i].step - steps[i - 1].step;
      if (dt <= 0 || dt > 2500 || ds <= 0) {
        open = false;
        continue;
      }
      if (!open) rates.push_back({k, {}});
      open = true;
      rates.back().points.emplace_back(steps[i].at,
                                       static_cast<double>(ds) * 1000.0 / static_cast<double>(dt));
      top = std::max(top, rates.back().points.back().second);
    }
  }
  svg += "<g class=\"rates\"><text class=\"name\" x=\"4\" y=\"" + Num(rate_y + 14) +
         "\">steps/s</text><text class=\"axis\" x=\"" + Num(kLabel - 4) + "\" y=\"" +
         Num(rate_y + 10) + "\" text-anchor=\"end\">" + Num(top) + "</text>";
  for (const Run& run : rates) {
    if (top <= 0) break;
    std::string points;
    for (const auto& [t, v] : run.points) {
      points += Num(p.X(t)) + "," + Num(rate_y + kRate - kRate * v / top) + " ";
    }
    const std::string& name = job.nodes[run.node].node;
    svg += "<polyline class=\"rate\" data-node=\"" + Escaped(name) + "\" points=\"" + points +
           "\"><title>" + Escaped(name) + ": steps per second</title></polyline>";
  }
  svg += "</g>";
}

std::string Css() {
  std::string css =
      "body{font:14px system-ui,sans-serif;margin:16px;color:#222}"
      "h1{font-size:18px;margin:0 0 4px}p.summary{margin:4px 0 12px}"
      "table{border-collapse:collapse;margin:12px 0}td,th{padding:2px 10px;text-align:right;"
      "white-space:nowrap}"
      "th:first-child,td:first-child{text-align:left}.swatch{display:inline-block;width:12px;"
      "height:12px;margin-right:6px;vertical-align:middle}"
      "text.name{font-size:12px}text.axis{font-size:11px;fill:#555}"
      ".seg.spare{opacity:.45}line.save{stroke:#222;stroke-width:1}"
      ".incident line{stroke:#b00;stroke-width:1.5;stroke-dasharray:4 3}.incident path{fill:#b00}"
      "polyline.rate{fill:none;stroke:#2e9e44;stroke-width:1.5}";
  for (Category c : kAllCategories) {
    css += ".c-" + std::string(NameOf(c)) +
           "{fill:" + std::string(kColours[static_cast<std::size_t>(c)]) + "}";
  }
  return css;
}

// The totals (the JSON's figures) and the incidents, as tables.
std::string Tables(const JobLedger& job, const Plot& p) {
  std::string html =
      "<table id=\"totals\"><tr><th>category</th><th>seconds</th>"
      "<th>share</th></tr>";
  const Ms wall = std::max<Ms>(Sum(job.totals), 1);
  for (Category c : kAllCategories) {
    const Ms ms = At(job.totals, c);
    html += "<tr data-category=\"" + std::string(NameOf(c)) + "\" data-ms=\"" + std::to_string(ms) +
            "\"><td><span class=\"swatch c-" + std::string(NameOf(c)) +
            "\" style=\"background:" + std::string(kColours[static_cast<std::size_t>(c)]) +
            "\"></span>" + std::string(NameOf(c)) + "</td><td>" + Seconds(ms) + "</td><td>" +
            Num(100.0 * static_cast<double>(ms) / static_cast<double>(wall)) + " %</td></tr>";
  }
  html += "<tr class=\"wall\" data-ms=\"" + std::to_string(Sum(job.totals)) +
          "\"><td>wall time</td><td>" + Seconds(Sum(job.totals)) + "</td><td></td></tr></table>";
  html +=
      "<table id=\"incidents\"><tr><th>#</th><th>at</th><th>kind</th><th>cause</th>"
      "<th>cost</th></tr>";
  for (std::size_t i = 0; i < job.incidents.size(); ++i) {
    const Incident& inc = job.incidents[i];
    html += "<tr><td>" + std::to_string(i + 1) + "</td><td>+" + Spoken(inc.fault - p.begin) +
            "</td><td>" + Escaped(inc.kind) +
            "</td><td style=\"text-align:left;white-space:normal;max-width:520px\">" +
            Escaped(inc.cause) + "</td><td style=\"text-align:left\">" + CostWords(inc.cost) +
            "</td></tr>";
  }
  html += "</table></body></html>\n";
  return html;
}

}  // namespace

std::string RenderTimeline(const JobLedger& job, const std::string& title) {
  Plot p{job.begin, std::max(job.until, job.begin + 1)};
  const double lanes_y = kGap;
  const double nodes_y = lanes_y + kLane + 2 * kGap;
  const double rate_y = nodes_y + static_cast<double>(job.nodes.size()) * (kLane + kGap) + kGap;
  const double height = rate_y + kRate + 3 * kGap;
  std::string svg =
      "<svg width=\"" + Num(kLabel + kWidth + 10) + "\" height=\"" + Num(height) + "\">";
  Lanes(svg, job, p, lanes_y, nodes_y);
  Incidents(svg, job, p, lanes_y, rate_y);
  Rates(svg, job, p, rate_y);
  svg += "<text class=\"axis\" x=\"" + Num(kLabel) + "\" y=\"" + Num(height - 4) +
         "\">+0 s</text><text class=\"axis\" x=\"" + Num(kLabel + kWidth) + "\" y=\"" +
         Num(height - 4) + "\" text-anchor=\"end\">+" + Spoken(p.end - p.begin) + "</text></svg>";

  std::string html = "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>" +
                     Escaped("crun goodput: " + title) + "</title><style>" + Css() +
                     "</style></head><body><h1>" + Escaped("crun goodput: " + title) +
                     "</h1><p class=\"summary\" id=\"summary\">" + Escaped(Summary(job)) + "</p>" +
                     svg;
  return html + Tables(job, p);
}

}  // namespace crun::goodput
