#!/usr/bin/env bash
# Checks that need the GPU host's Python (it has torch; the build machine has none), run on a
# bundle of binaries: today the dense optimizers against torch.optim
# (tests/python/test_optimizers_torch.py through tests/python/run_pytest.py, which drives
# test_nn's OptimizerTorch.StepsFromFile case, so the bundle must hold test_nn).
#
#   bash bench/gpu_checks.sh --bundle DIR [--pytest-dir DIR] [--python CMD] [--dry-run]
#
# pytest: the lent hosts' image lists torch but not pytest, and nothing can be installed there.
# If `python3 -c "import pytest"` fails, this script says so on a line starting
# "gpu_checks: NOT RUN" and exits 3, unless --pytest-dir names a folder of pure-Python packages
# carried along and put on PYTHONPATH. The build machine's own pytest (the pins of
# requirements-test.txt) serves; copied without byte code it is ~10 MB:
#   SP=$(python3 -c 'import site; print(site.getsitepackages()[0])'); mkdir -p .gpu-pytest
#   cp -r $SP/{pytest,_pytest,pluggy,iniconfig,packaging,pygments,py.py} \
#         $SP/{pytest,pluggy,iniconfig,packaging,pygments}-*.dist-info .gpu-pytest/
#   find .gpu-pytest -name __pycache__ -prune -exec rm -rf {} +
# (checked here: that folder alone, `python3 -S` with it on PYTHONPATH, runs run_pytest.py).
# Exit status: 0 all passed, 1 a failure, 3 not run (no pytest, no torch, no test_nn),
# 77 every test skipped (run_pytest.py's code), 2 bad arguments.
set -u

usage() { sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
die() { echo "gpu_checks.sh: $*" >&2; exit 2; }

BUNDLE="" PYTEST_DIR="" PY=python3 DRY=0
while [ $# -gt 0 ]; do
  case $1 in
    --bundle) BUNDLE=${2:?--bundle needs a folder}; shift 2 ;;
    --pytest-dir) PYTEST_DIR=${2:?--pytest-dir needs a folder}; shift 2 ;;
    --python) PY=${2:?--python needs a command}; shift 2 ;;
    --dry-run) DRY=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
[ -n "$BUNDLE" ] || die "--bundle DIR is required (see --help)"
[ -d "$BUNDLE" ] || die "--bundle: no folder '$BUNDLE'"
[ -z "$PYTEST_DIR" ] || [ -d "$PYTEST_DIR" ] || die "--pytest-dir: no folder '$PYTEST_DIR'"

BIN=$(cd "$BUNDLE/bin" 2>/dev/null && pwd) || BIN=""
CMD=("$PY" tests/python/run_pytest.py tests/python/test_optimizers_torch.py)
if [ $DRY = 1 ]; then
  echo "dry run: DLREC_BIN_DIR=$BUNDLE/bin${PYTEST_DIR:+ PYTHONPATH=$PYTEST_DIR} ${CMD[*]}"
  exit 0
fi

not_run() { echo "gpu_checks: NOT RUN torch.optim comparison: $*"; exit 3; }
[ -n "$BIN" ] || not_run "no folder $BUNDLE/bin"
[ -e "$BIN/test_nn" ] || [ ! -e "$BIN/test_nn.gz" ] || gunzip -k "$BIN/test_nn.gz"
[ -x "$BIN/test_nn" ] || not_run "$BIN/test_nn is not in the bundle (bundle it beside dlrec)"
if [ -n "$PYTEST_DIR" ]; then
  PYTHONPATH="$(cd "$PYTEST_DIR" && pwd)${PYTHONPATH:+:$PYTHONPATH}"
  export PYTHONPATH
fi
"$PY" -c "import torch" 2>/dev/null || not_run "$PY has no torch"
if ! "$PY" -c "import pytest" 2>/dev/null; then
  not_run "$PY ($("$PY" --version 2>&1)) has no pytest on this host; carry one with --pytest-dir (see --help)"
fi
echo "python: $("$PY" -c 'import sys, torch, pytest; print(sys.version.split()[0], "torch", torch.__version__, "pytest", pytest.__version__)')"

# test_nn needs the bundle's libraries (bundle-portable.sh's env.sh).
if [ -f "$BUNDLE/env.sh" ]; then
  # shellcheck disable=SC1091
  source "$BUNDLE/env.sh"
fi
DLREC_BIN_DIR=$BIN "${CMD[@]}"
rc=$?
case $rc in
  0) echo "gpu_checks: PASSED torch.optim comparison (test_optimizers_torch.py)" ;;
  77) echo "gpu_checks: SKIPPED torch.optim comparison: every test skipped (reasons above)" ;;
  *) echo "gpu_checks: FAILED torch.optim comparison (run_pytest.py exit $rc)"; rc=1 ;;
esac
exit $rc
