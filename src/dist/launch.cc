// launch_local_job: `dlrec train --ranks N` starts its N ranks through the MPI launcher;
// run_job: a CLI command as such a job (include/dlrec/dist/launch.h).
#include "dlrec/dist/launch.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
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

namespace {
std::string count_of(int n, const std::string& unit) {
  return std::to_string(n) + " " + (n == 1 ? unit : unit + (unit.back() == 's' ? "es" : "s"));
}
}  // namespace

int run_job(const JobRequest& request, const std::vector<std::string>& argv,
            const std::function<int(Communicator&)>& body) {
  if (request.launch && !started_by_mpi_launcher()) {
    const int rc = launch_local_job(request.size, argv);  // this command, once per rank
    if (rc != 0)
      std::fprintf(stderr,
                   "dlrec: error: the %s job of %s failed (exit status %d); the messages above "
                   "name the rank that failed first\n",
                   request.command.c_str(), count_of(request.size, request.unit).c_str(), rc);
    return rc;
  }
  std::unique_ptr<Communicator> comm;
  try {
    comm = make_communicator(request.comm_kind, request.comm, request.exchange);
    if (request.size > 0 && comm->size() != request.size)
      fail("this job has ", count_of(comm->size(), request.unit), " but the command asks for ",
           request.size, " (", request.option, " ", request.size, "); start it with mpirun -np ",
           request.size, " or drop the option");
    print_topology(*comm, stderr);
    const int rc = body(*comm);
    comm.reset();
    finalize();
    return rc;
  } catch (const std::exception& e) {
    // The other ranks may wait in a collective for this one: the whole job ends here.
    if (comm && comm->size() > 1) abort_job(e.what());
    throw;
  }
}

}  // namespace dlrec::dist
