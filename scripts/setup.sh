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
# sees it and keeps it. Otherwise it installs torch==2.13.0: with an NVIDIA GPU (nvidia-smi lists one)
# or on macOS, PyPI's build (on Linux the CUDA one, several GB); with no GPU, PyTorch's CPU build from
# its CPU index (a few hundred MB) when that index answers, else PyPI's torch==2.13.0 as pip finds it
# (an offline machine's local wheel cache). FUSIONLAB_TORCH=cpu|cuda forces the choice.
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

TORCH=torch==2.13.0
CPU_INDEX=https://download.pytorch.org/whl/cpu
torch_build() {  # cuda: PyPI's torch; cpu: PyTorch's CPU index
  case "${FUSIONLAB_TORCH:-auto}" in
    cpu|cuda) echo "$FUSIONLAB_TORCH" ;;
    auto)
      if [ "$(uname -s)" = Darwin ] || { command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; }; then
        echo cuda  # macOS: PyPI's torch is its CPU build anyway
      else
        echo cpu
      fi ;;
  esac
}
case "${FUSIONLAB_TORCH:-auto}" in
  cpu|cuda|auto) ;;
  *) echo "FUSIONLAB_TORCH=$FUSIONLAB_TORCH: give cpu, cuda or leave it unset" >&2; exit 2 ;;
esac
torch_args=("$TORCH")
[ "$(torch_build)" = cpu ] && torch_args+=(--index-url "$CPU_INDEX")

if [ -n "${FUSIONLAB_DRY_RUN:-}" ]; then
  echo "torch, if the venv has none: pip install ${torch_args[*]}" >&2
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
if ! "$VPY" -c "import torch" 2>/dev/null; then
  if [ ${#torch_args[@]} -gt 1 ] && ! "$VPY" -c "import urllib.request as u; u.urlopen('$CPU_INDEX/', timeout=5)" 2>/dev/null; then
    echo "setup: PyTorch's CPU index ($CPU_INDEX) does not answer; installing $TORCH as pip finds it" >&2
    torch_args=("$TORCH")  # offline: a local wheel cache (pip's find-links) serves it
  fi
  "$VPY" -m pip install -q "${torch_args[@]}"
fi
"$VPY" -m pip install -q -e ".[course,test,dev]"
"$VPY" -c "import fusionlab; print(fusionlab.info())"

[ ${#run[@]} -gt 0 ] && exec "${run[@]}"
exit 0
