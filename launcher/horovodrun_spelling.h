// horovodrun's spelling on one host (docs/frameworks.md): `crun -np 4 -H localhost:4 python
// train.py` runs what `horovodrun -np 4 -H localhost:4 python train.py` runs, as
// `crun --contract horovod --nproc-per-node 4 --no-python python train.py`. Pure: the command
// line in, crun's own out. crun does not ssh: a host that is not this one is refused, naming it
// and the crun line to run on each node instead.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "base/status.h"

namespace crun::launcher {

// `args` without the program name. Unchanged unless it starts with -np or -H (each with its
// value, in either order). `names_this_host` says whether a -H host is this machine.
StatusOr<std::vector<std::string>> RewriteHorovodrunSpelling(
    std::vector<std::string> args, const std::function<bool(const std::string&)>& names_this_host);

}  // namespace crun::launcher
