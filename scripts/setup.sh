#!/usr/bin/env bash
# Set up fusionlab in ./.venv, then optionally run one of the course's commands.
#
#   bash scripts/setup.sh            # set up only
#   bash scripts/setup.sh lab        # then open the course in JupyterLab: the repository root, on START_HERE.ipynb
#   bash scripts/setup.sh test       # then the unit tests and strict nbval on every notebook (what CI runs)
#   bash scripts/setup.sh nbval      # then strict nbval only, on this machine's device (CPU or GPU)
#   bash scripts/setup.sh record     # then, on a GPU, record every lesson's benchmarks (python -m fusionlab.record)
#   bash scripts/setup.sh exercises  # then regenerate exercises/ from solutions/ (scripts/make_exercises.py)
#
# Arguments after the command go to it: `record --suites lesson1`, `lab --port 8890`, `nbval -x`,
# `exercises --check`. FUSIONLAB_DRY_RUN=1 prints the command instead of setting up and running it.
#
# torch: if the Python that makes the venv already has torch (a GPU box, a conda env), the venv
# sees it and keeps it. Otherwise it installs torch==2.13.0 (on the course's CPU machines a CPU
# wheel is on disk; an unpinned torch would pull gigabytes of CUDA packages).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VPY=.venv/bin/python
NBVAL=(--nbval notebooks solutions --nbval-current-env --nbval-sanitize-with nbval_sanitize.cfg -p no:cacheprovider)

usage() {
  echo "usage: bash scripts/setup.sh [lab|test|nbval|record|exercises] [arguments for the command]" >&2
  exit 2
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
  lab)
    extra=()
    [ "$(id -u)" = 0 ] && extra+=(--allow-root)  # containers and cloud boxes often run as root
    # the repository root, so notebooks/, exercises/ and solutions/ are all one click away; the lab's
    # default URL is START_HERE.ipynb, so the address it prints (what a remote box, a container or WSL
    # copies into a browser) lands there too, not only the local redirect page it opens itself
    run=(.venv/bin/jupyter lab "${extra[@]}" --ServerApp.root_dir="$PWD" --LabApp.default_url=/lab/tree/START_HERE.ipynb "$@") ;;
  test)
    # Unit tests, then every lesson and solution notebook under strict nbval (outputs compared,
    # except cells tagged nbval-ignore-output because they depend on the device). pytest-xdist runs
    # them in one worker a CPU (FUSIONLAB_TEST_WORKERS=N for N, 0 for one process); --dist loadscope
    # keeps each test module, and each notebook's cells in order, in one worker. On a 2-core machine
    # the whole suite took 17.7 min in one process and 9.2 min in two.
    run=("$VPY" -m pytest tests "${NBVAL[@]}" -q -n "${FUSIONLAB_TEST_WORKERS:-auto}" --dist loadscope "$@") ;;
  nbval)
    # Strict nbval alone, on whatever this machine has: a GPU Triton supports, or the interpreter.
    run=("$VPY" -m pytest "${NBVAL[@]}" -q "$@") ;;
  record)
    # On a GPU: every lesson's suite, into fusionlab/recorded/ (refuses, with the reason, without one).
    run=("$VPY" -m fusionlab.record "$@") ;;
  exercises)
    run=("$VPY" scripts/make_exercises.py "$@") ;;
  "") run=() ;;
  *) usage ;;
esac

if [ -n "${FUSIONLAB_DRY_RUN:-}" ]; then
  [ ${#run[@]} -gt 0 ] && printf '%s\n' "${run[@]}"
  exit 0
fi

if [ ! -x "$VPY" ]; then
  if "$PY" -c "import torch" 2>/dev/null; then
    "$PY" -m venv --system-site-packages .venv
  else
    "$PY" -m venv .venv
  fi
fi
"$VPY" -m pip install -q --upgrade pip
"$VPY" -c "import torch" 2>/dev/null || "$VPY" -m pip install -q "torch==2.13.0"
"$VPY" -m pip install -q -e ".[course,test,dev]"
"$VPY" -c "import fusionlab; print(fusionlab.info())"

[ ${#run[@]} -gt 0 ] && exec "${run[@]}"
exit 0
