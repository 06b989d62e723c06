#include "etl/output_dir.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <regex>

#include "dlrec/core/error.h"
#include "dlrec/core/file_util.h"

namespace dlrec::etl {

namespace fs = std::filesystem;

namespace {

// The files a dataset directory holds (run.h): anything else in it is the user's.
bool is_dataset_file(const std::string& name) {
  static const std::regex shard(R"((train|valid)(_r\d+)?_\d+\.shard)");
  return name == "dataset.json" || name == "workflow.json" || name == "stats.json" ||
         name == "ranks.json" || std::regex_match(name, shard);
}

// "<prefix><pid>-..." of a dead process.
bool stale_with_pid_prefix(const std::string& name, const std::string& prefix) {
  if (name.compare(0, prefix.size(), prefix) != 0) return false;
  const size_t dash = name.find('-', prefix.size());
  if (dash == std::string::npos) return false;
  const long pid = pid_after(name.substr(0, dash), prefix);
  return pid > 0 && pid != ::getpid() && !process_alive(pid);
}

void report(const std::vector<std::string>& lines) {
  for (const auto& l : lines) std::fprintf(stderr, "etl: %s\n", l.c_str());
}

void report_removed(const std::vector<std::string>& paths) {
  for (const auto& p : paths)
    std::fprintf(stderr, "etl: removed '%s' (left by a killed process)\n", p.c_str());
}

}  // namespace

std::vector<std::string> remove_stale_etl_temporaries(const std::string& dir) {
  std::vector<std::string> removed = remove_stale_temporaries(dir, ".tmp.");
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!stale_with_pid_prefix(name, ".dlrec-spill-") && !stale_with_pid_prefix(name, ".shuffle-"))
      continue;
    std::error_code rec;
    if (fs::remove(it->path(), rec)) removed.push_back(it->path().string());
  }
  return removed;
}

EtlOutput::EtlOutput(const EtlOptions& o) {
  std::string out = o.output_dir;
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  std::error_code ec;
  // A link to a directory: the dataset goes where it points (the link stays).
  if (fs::is_symlink(fs::symlink_status(out, ec))) out = fs::canonical(out).string();
  final_dir_ = out;
  report(recover_dir(final_dir_));
  if (!o.spill_dir.empty()) report_removed(remove_stale_etl_temporaries(o.spill_dir));
  const bool exists = fs::exists(final_dir_, ec);
  if (exists) report_removed(remove_stale_etl_temporaries(final_dir_));
  if (exists && !fs::is_directory(final_dir_, ec))
    fail("etl: output '", final_dir_, "' exists and is not a directory");
  if (exists && file_exists(final_dir_ + "/dataset.json")) {
    if (!o.overwrite)
      fail("etl: '", final_dir_, "' already holds a dataset (dataset.json); choose another "
           "output directory or overwrite it");
    std::vector<std::string> foreign;
    for (const auto& e : fs::directory_iterator(final_dir_)) {
      const std::string name = e.path().filename().string();
      if (!is_dataset_file(name)) foreign.push_back(name);
    }
    if (!foreign.empty()) {
      std::string list;
      for (size_t i = 0; i < foreign.size() && i < 5; ++i)
        list += (i ? ", '" : "'") + foreign[i] + "'";
      if (foreign.size() > 5) list += " and " + std::to_string(foreign.size() - 5) + " more";
      fail("etl: '", final_dir_, "' holds files that are not part of its dataset (", list,
           "); --overwrite replaces the whole directory, so move them away or choose another "
           "output directory");
    }
  }
  if (exists && !file_exists(final_dir_ + "/dataset.json")) {
    write_dir_ = final_dir_;  // nothing to keep: in place
    return;
  }
  const fs::path parent = fs::path(final_dir_).parent_path();
  if (!parent.empty()) make_dirs(parent.string());
  write_dir_ = staging_dir_for(final_dir_);
  fs::remove_all(write_dir_, ec);
  make_dirs(write_dir_);
  staged_ = true;
}

EtlOutput::~EtlOutput() {
  if (staged_ && !committed_) {
    std::error_code ec;
    fs::remove_all(write_dir_, ec);
  }
}

void EtlOutput::commit() {
  if (staged_) replace_dir(write_dir_, final_dir_);
  committed_ = true;
}

}  // namespace dlrec::etl
