// A fresh directory under $TMPDIR for one test, removed with everything in it afterwards.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <stdexcept>
#include <string>

namespace crun::testing {

struct TempDir {
  std::string path;
  explicit TempDir(const std::string& prefix = "crun_test") {
    std::string pattern =
        std::filesystem::temp_directory_path().string() + "/" + prefix + "_XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp " + pattern);
    path = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

}  // namespace crun::testing
