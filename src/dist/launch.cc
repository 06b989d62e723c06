// launch_local_job: `dlrec train --ranks N` starts its N ranks through the MPI launcher.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "dlrec/core/error.h"
#include "dlrec/dist/communicator.h"

namespace dlrec::dist {

std::string mpi_launcher() {
#if defined(DLREC_WITH_MPI) && defined(DLREC_MPIEXEC)
  const std::string exe = DLREC_MPIEXEC;
  if (!exe.empty() && access(exe.c_str(), X_OK) == 0) return exe;
#endif
  return "";
}

int launch_local_job(int ranks, const std::vector<std::string>& argv) {
  DLREC_CHECK(ranks >= 1, "a job needs at least 1 rank, got ", ranks);
  DLREC_CHECK(!argv.empty(), "launch: no program");
  const std::string exe = mpi_launcher();
  if (exe.empty())
    fail("starting ", ranks, " ranks needs MPI: this build of dlrec ",
         mpi_built() ? "found no MPI launcher (mpiexec) where it was built"
                     : "has no MPI (install openmpi-bin libopenmpi-dev and rebuild)");
  std::vector<std::string> args = {exe, "-np", std::to_string(ranks)};
  // One node: more ranks than cores is allowed, and the ranks are not pinned to cores (their
  // thread pools spread themselves).
  args.insert(args.end(), {"--oversubscribe", "--bind-to", "none"});
  if (geteuid() == 0) args.push_back("--allow-run-as-root");  // containers and CI run as root
  args.insert(args.end(), argv.begin(), argv.end());
  std::vector<char*> cargs;
  for (auto& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  DLREC_CHECK(pid >= 0, "launch: fork failed");
  if (pid == 0) {
    execv(exe.c_str(), cargs.data());
    std::fprintf(stderr, "dlrec: error: cannot run the MPI launcher '%s'\n", exe.c_str());
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + WTERMSIG(status);
}

}  // namespace dlrec::dist
