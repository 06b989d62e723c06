// Linked into every test program (tests/CMakeLists.txt): when the program ends, removes what
// its tests left in the scratch folder (gtest's TempDir, /tmp by default). Tests name their
// scratch files and folders with the process id ("dlrec_io_<suite>_<test>_<pid>",
// "shard_test_<pid>", "pq_<pid>_x.parquet", ...), so an entry whose name holds this process's
// id as a whole '_'/'.'-separated part is ours; nothing of another process is touched.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

namespace {

bool names_pid(const std::string& name, const std::string& pid) {
  for (size_t at = name.find(pid); at != std::string::npos; at = name.find(pid, at + 1)) {
    const size_t end = at + pid.size();
    const bool left = at > 0 && (name[at - 1] == '_' || name[at - 1] == '.');
    const bool right = end == name.size() || name[end] == '_' || name[end] == '.';
    if (left && right) return true;
  }
  return false;
}

class RemoveScratch : public ::testing::Environment {
 public:
  void TearDown() override {
    namespace fs = std::filesystem;
    const std::string pid = std::to_string(::getpid());
    std::error_code ec;
    for (const std::string& dir : {::testing::TempDir(), fs::temp_directory_path(ec).string()}) {
      for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
        const std::string name = it->path().filename().string();
        const bool ours = name.rfind("dlrec", 0) == 0 || name.rfind("shard_test_", 0) == 0 ||
                          name.rfind("pq_", 0) == 0 || name.rfind("wf_", 0) == 0;
        std::error_code rm;
        if (ours && names_pid(name, pid)) fs::remove_all(it->path(), rm);
      }
    }
  }
};

const auto* const kRegistered = ::testing::AddGlobalTestEnvironment(new RemoveScratch);

}  // namespace
