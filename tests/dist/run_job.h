// Runs a command (an mpirun job or the dlrec CLI) with a hard wall-clock limit, capturing its
// output, for the tests of jobs across processes.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>

namespace dlrec::testing {

struct JobResult {
  int exit_code = -1;
  bool hung = false;   // it ran into the limit and `timeout` killed it
  std::string output;  // stdout and stderr together
};

// The command under `timeout -s KILL <limit>` (coreutils), so that a hanging job fails the test
// instead of hanging it.
inline JobResult run_job(const std::string& cmd, int limit_seconds) {
  JobResult r;
  const std::string full = "timeout -s KILL " + std::to_string(limit_seconds) + " " + cmd + " 2>&1";
  const auto t0 = std::chrono::steady_clock::now();
  FILE* p = popen(full.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int st = pclose(p);
  r.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  r.hung = std::chrono::steady_clock::now() - t0 >= std::chrono::seconds(limit_seconds);
  return r;
}

// mpirun with the flags a CI container needs (root, fewer cores than ranks); empty when this
// build has no MPI launcher or it is not installed.
// The environment that makes `dlrec train --ranks N` (which runs mpirun itself) do the same.
inline const char* kMpiEnv = "env OMPI_MCA_btl_vader_single_copy_mechanism=none ";
inline std::string mpirun_prefix(int ranks) {
#ifdef DLREC_MPIEXEC
  const std::string exe = DLREC_MPIEXEC;
  if (exe.empty() || access(exe.c_str(), X_OK) != 0) return "";
  // Shared-memory transport without cross-process memory attach: containers often forbid it
  // (ptrace scope), and the tests' messages are small.
  return exe + " -np " + std::to_string(ranks) +
         " --oversubscribe --allow-run-as-root --mca btl_vader_single_copy_mechanism none ";
#else
  return "";
#endif
}

}  // namespace dlrec::testing
