// Shared by the test programs: scratch directories and whole-file reads.
#pragma once

#include <dirent.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "dlrec/core/file_util.h"

namespace dlrec::testing {

// A scratch directory <gtest temp>/dlrec_<name>_<pid>, removed with everything in it at the
// end of the test.
struct TempDir {
  std::string path;
  explicit TempDir(const std::string& name)
      : path(std::string(::testing::TempDir()) + "dlrec_" + name + "_" +
             std::to_string(::getpid())) {
    make_dirs(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

// The names in `dir`, sorted, hidden files included (spill runs are .dlrec-spill-*).
inline std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> v;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d))
      if (std::strcmp(e->d_name, ".") && std::strcmp(e->d_name, "..")) v.push_back(e->d_name);
    ::closedir(d);
  }
  std::sort(v.begin(), v.end());
  return v;
}

// Writes `text` to dir/name (binary) and returns that path.
inline std::string write_file(const std::string& dir, const std::string& name,
                              const std::string& text) {
  std::string p = dir + "/" + name;
  std::ofstream(p, std::ios::binary) << text;
  return p;
}

inline std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

}  // namespace dlrec::testing
