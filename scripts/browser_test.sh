#!/usr/bin/env bash
# The lessons in headless Chromium: every core lesson in JupyterLab 4 + ipywidgets 8 (the course's .venv),
# after START_HERE opened from the address the lab prints; then lessons 1, 4 and 7 in classic Notebook 6.5
# + ipywidgets 7.7.1 + widgetsnbextension 3.6 (Colab's widget versions, in its own venv). Each lesson: Run
# All, no error, every trip animation steps, every timing-bar image loads at its drawn size.
#
#   bash scripts/browser_test.sh                      # both; screenshots and result.json in out/browser/
#   bash scripts/browser_test.sh --frontends lab      # arguments go to scripts/browser_test.py
#   bash scripts/browser_test.sh --lab-lessons notebooks/01_the_warehouse.ipynb   # one lesson
#
# Installs what it needs, never into .venv: Debian's chromium (apt-get, as root), a venv with the
# playwright package (its driver only: the browser is Debian's, no browser download), and the classic
# Notebook venv. FUSIONLAB_BROWSER_VENVS (default /tmp/fusionlab-browser) says where the venvs live;
# they are reused by the next run.
set -euo pipefail
cd "$(dirname "$0")/.."
VENVS=${FUSIONLAB_BROWSER_VENVS:-/tmp/fusionlab-browser}
PY=${PYTHON:-python3}
start=$(date +%s)
export FUSIONLAB_BROWSER_T0=$start

if ! [ -x /usr/bin/chromium ]; then
  if [ "$(id -u)" = 0 ]; then apt=(apt-get); elif sudo -n true 2>/dev/null; then apt=(sudo -n apt-get); else
    echo "browser_test: Debian's chromium is missing and apt-get needs root: apt-get install -y chromium" >&2; exit 2
  fi
  "${apt[@]}" update -qq
  DEBIAN_FRONTEND=noninteractive "${apt[@]}" install -y -qq chromium >/dev/null
fi
[ -x .venv/bin/jupyter ] || bash scripts/setup.sh  # the course's own venv, with JupyterLab and ipywidgets 8

# the driver: playwright drives the system Chromium (PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD: never fetch one)
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1
if ! "$VENVS/driver/bin/python" -c "import playwright" 2>/dev/null; then
  "$PY" -m venv "$VENVS/driver"
  "$VENVS/driver/bin/pip" install -q playwright
fi

# classic Notebook 6.5 with Colab's ipywidgets; torch, triton, numpy, matplotlib and fusionlab come
# from .venv through a .pth placed after this venv's own packages (its ipywidgets 7.7.1 wins)
NB7=$VENVS/nb7
if ! "$NB7/bin/python" -c "import notebook, ipywidgets, widgetsnbextension as w; assert ipywidgets.__version__ == '7.7.1'" 2>/dev/null; then
  "$PY" -m venv "$NB7"
  "$NB7/bin/pip" install -q "notebook>=6.5,<6.6" "ipywidgets==7.7.1" "widgetsnbextension>=3.6,<3.7" ipykernel
fi
site_of() { "$1" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])"; }
echo "import site; site.addsitedir('$(site_of .venv/bin/python)')" > "$(site_of "$NB7/bin/python")/zz_fusionlab_venv.pth"
"$NB7/bin/python" -c "import ipywidgets, notebook, torch, fusionlab
print(f'classic venv: notebook {notebook.__version__}, ipywidgets {ipywidgets.__version__}, torch {torch.__version__}')"

echo "browser_test: set-up took $(( $(date +%s) - start )) s"
exec "$VENVS/driver/bin/python" scripts/browser_test.py --classic-python "$NB7/bin/python" "$@"
