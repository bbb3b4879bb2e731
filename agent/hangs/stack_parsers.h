// Parsers of each stack tool's text (py-spy, faulthandler, eu-stack, gdb) into threads and
// frames. Pure functions of the text.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "agent/hangs/stack_model.h"

namespace crun::agent {

// Parsers of each tool's text; threads in the tool's order, exactly one marked main when
// any thread was found.
std::vector<ThreadStack> ParsePySpy(const std::string& text);
std::vector<ThreadStack> ParseFaulthandler(const std::string& text);
std::vector<ThreadStack> ParseEuStack(const std::string& text, pid_t pid);
std::vector<ThreadStack> ParseGdb(const std::string& text, pid_t pid);

}  // namespace crun::agent
