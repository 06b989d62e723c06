// Shared by the test programs: running a command line (the dlrec CLI) and capturing its output.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace dlrec::testing {

// Runs the shell command `cmd` with its stderr into the output (stored in *output unless null);
// its exit code, -1 when it could not start or did not exit.
inline int run_command(const std::string& cmd, std::string* output) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return -1;
  char buf[4096];
  std::string out;
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  if (output) *output = out;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// `dlrec ARGS` with the build's dlrec binary (DLREC_BIN_DIR), as run_command.
inline int run_dlrec(const std::string& args, std::string* output) {
  return run_command(std::string(DLREC_BIN_DIR) + "/dlrec " + args, output);
}

}  // namespace dlrec::testing
