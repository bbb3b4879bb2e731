#include "launcher/timeline_command.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>

#include "base/files.h"
#include "rendezvous/goodput/ledger_json.h"
#include "rendezvous/goodput/timeline.h"

namespace crun::launcher {
namespace {

struct TimelineOptions {
  std::string file;
  std::string out;
};

// The page's path: OUT, or the file's with .html in place of .json (else added).
std::string OutputOf(const TimelineOptions& o) {
  if (!o.out.empty()) return o.out;
  const std::string& f = o.file;
  if (f.size() > 5 && f.compare(f.size() - 5, 5, ".json") == 0) {
    return f.substr(0, f.size() - 5) + ".html";
  }
  return f + ".html";
}

int Run(const TimelineOptions& o) {
  std::ifstream in(o.file, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "crun timeline: %s: cannot be read (%s)\n", o.file.c_str(),
                 std::strerror(errno));
    return 1;
  }
  std::stringstream text;
  text << in.rdbuf();
  auto nodes = goodput::NodesFromFile(text.str(), o.file);
  if (!nodes.ok()) {
    std::fprintf(stderr, "crun timeline: %s\n", nodes.status().message().c_str());
    return 1;
  }
  const goodput::JobLedger job = goodput::Combine(std::move(nodes).value());
  const std::string out = OutputOf(o);
  if (!ReplaceWholeFile(out, goodput::RenderTimeline(job, o.file))) {
    std::fprintf(stderr, "crun timeline: %s: cannot be written (%s)\n", out.c_str(),
                 std::strerror(errno));
    return 1;
  }
  std::printf("%s\n", out.c_str());
  return 0;
}

}  // namespace

void AddTimelineCommand(CLI::App& app, int* exit_code) {
  auto o = std::make_shared<TimelineOptions>();
  CLI::App* cmd =
      app.add_subcommand("timeline",
                         "Draw a --goodput-file's timeline as a self-contained HTML page");
  cmd->add_option("file", o->file, "The JSON that --goodput-file wrote")->required();
  cmd->add_option("-o,--output", o->out, "The page to write (default: FILE with .html)");
  cmd->callback([o, exit_code] { *exit_code = Run(*o); });
}

}  // namespace crun::launcher
