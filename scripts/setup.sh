#!/usr/bin/env bash
# Set up fusionlab in ./.venv, then optionally open the course or run every test.
#
#   bash scripts/setup.sh lab    # set up, then open the lessons in JupyterLab
#   bash scripts/setup.sh test   # set up, then run the unit tests and strict nbval on every notebook
#   bash scripts/setup.sh        # set up only
#
# torch: if the Python that makes the venv already has torch (a GPU box, a conda env), the venv
# sees it and keeps it. Otherwise it installs torch==2.13.0 (on the course's CPU machines a CPU
# wheel is on disk; an unpinned torch would pull gigabytes of CUDA packages).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

if [ ! -x .venv/bin/python ]; then
  if "$PY" -c "import torch" 2>/dev/null; then
    "$PY" -m venv --system-site-packages .venv
  else
    "$PY" -m venv .venv
  fi
fi
VPY=.venv/bin/python
"$VPY" -m pip install -q --upgrade pip
"$VPY" -c "import torch" 2>/dev/null || "$VPY" -m pip install -q "torch==2.13.0"
"$VPY" -m pip install -q -e ".[course,test,dev]"
"$VPY" -c "import fusionlab; print(fusionlab.info())"

case "${1:-}" in
  lab)
    extra=()
    [ "$(id -u)" = 0 ] && extra+=(--allow-root)  # containers and cloud boxes often run as root
    exec .venv/bin/jupyter lab "${extra[@]}" notebooks/ ;;
  test)
    # Unit tests, then every lesson and solution notebook under strict nbval (outputs compared,
    # except cells tagged nbval-ignore-output because they depend on the device).
    exec "$VPY" -m pytest tests --nbval notebooks solutions --nbval-current-env \
      --nbval-sanitize-with nbval_sanitize.cfg -p no:cacheprovider -q ;;
  "") ;;
  *) echo "usage: bash scripts/setup.sh [lab|test]" >&2; exit 2 ;;
esac
