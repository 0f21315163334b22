"""The lessons as a learner sees them: run in headless Chromium, in JupyterLab 4 (ipywidgets 8) and in classic
Notebook 6.5 (ipywidgets 7.7.1, Colab's version), with the widgets checked live.

For each front end: a Jupyter server on loopback serves a temporary copy of the course (so nothing
is written into the repository); the lab is started as `bash scripts/setup.sh lab` starts it. In the lab,
Chromium first opens the address the lab prints and checks that it shows START_HERE.ipynb, then follows
its link to lesson 1's exercise notebook. Then, for every core lesson in the lab and lessons 1, 4 and 7 in
classic Notebook (``--lab-lessons``, ``--classic-lessons``), one after the other in one browser, it opens
the lesson, runs every cell (Run All) and asserts

- no cell has an error output, every cell ran, and no widget failed to render;
- every trip animation is a live widget: its Step and Reset buttons and its slider are there, and a
  click on Step changes what it shows ("trip 1 of 4 ...") through a round trip to the kernel;
- every timing-bar image widget's PNG has loaded, and is shown no wider than it was drawn.

Each lesson's kernel is shut down before the next opens. Screenshots (PNG) and ``result.json`` go to ``--out``.

Run it through ``scripts/browser_test.sh``, which installs what it needs (Debian's chromium, a venv
with playwright, a venv with Notebook 6.5 + ipywidgets 7.7.1); this file needs playwright and a
Chromium at ``--chromium``, and never downloads a browser.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parents[1]
LESSON = "notebooks/01_the_warehouse.ipynb"
#: what `scripts/setup.sh lab` gives the lab as its default URL
LANDING_URL = "/lab/tree/START_HERE.ipynb"
#: the core lessons, in JupyterLab; in classic Notebook (Colab's widget stack), three of them
LAB_LESSONS = sorted(
    f"notebooks/{p.name}" for p in (Path(__file__).resolve().parents[1] / "notebooks").glob("0*.ipynb")
)
CLASSIC_LESSONS = [
    "notebooks/01_the_warehouse.ipynb",
    "notebooks/04_fused_reductions.ipynb",
    "notebooks/07_flash_attention.ipynb",
]
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
#: what a front end shows where a widget or an output could not be rendered
RENDER_ERRORS = ("Error displaying widget", "Error rendering output item", "Failed to load model class")
#: the lab settings that make a run reproducible: every cell in the DOM (no windowing), no autosave, no news
LAB_SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false", "checkForUpdates": False},
}

# -- JavaScript run in the page, per front end -------------------------------------------------------------
# Each returns plain JSON. `cells()` lists the code cells as {i, source, count, running, outputs}.
LAB_JS = {
    "ready": """(path) => {
        const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
        if (!w || !w.context || w.context.path !== path) return false;
        const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
        return !!(k && k.connectionStatus === 'connected' && k.status === 'idle' && w.content.widgets.length);
    }""",
    "run_all": "() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); return true; }",
    "cells": """() => window.jupyterapp.shell.currentWidget.content.widgets.map((c, i) => {
        c.node.setAttribute('data-fl-cell', String(i));
        if (c.model.type !== 'code') return null;
        const prompt = c.node.querySelector('.jp-InputPrompt');
        return {i, source: c.model.sharedModel.getSource(), count: c.model.executionCount,
                running: !!(prompt && prompt.textContent.includes('*')), outputs: c.model.outputs.toJSON()};
    }).filter(Boolean)""",
    "idle": "() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.status === 'idle'",
}
CLASSIC_JS = {
    "ready": """(path) => !!(window.Jupyter && Jupyter.notebook && Jupyter.notebook._fully_loaded
        && Jupyter.notebook.kernel && Jupyter.notebook.kernel.is_connected()
        && document.querySelector('#kernel_indicator_icon.kernel_idle_icon'))""",
    "run_all": """() => { Jupyter.notebook.set_autosave_interval(0); Jupyter.notebook.execute_all_cells();
        return true; }""",
    "cells": """() => Jupyter.notebook.get_cells().map((c, i) => {
        c.element[0].setAttribute('data-fl-cell', String(i));
        if (c.cell_type !== 'code') return null;
        return {i, source: c.get_text(), count: c.input_prompt_number, running: c.input_prompt_number === '*',
                outputs: JSON.parse(JSON.stringify(c.output_area.outputs))};
    }).filter(Boolean)""",
    "idle": "() => !!document.querySelector('#kernel_indicator_icon.kernel_idle_icon')",
    # each widget output of cell i: its model's id and whether the manager has it (resolved, rejected, pending);
    # an empty id is a view ipywidgets removed (it blanks the id), as its restore's re-render does
    "models": """async (i) => {
        const wm = Jupyter.notebook.kernel.widget_manager, out = [];
        for (const o of Jupyter.notebook.get_cell(i).output_area.outputs) {
            const v = o.data && o.data['application/vnd.jupyter.widget-view+json'];
            if (!v) continue;
            const p = wm._models[v.model_id];
            let state = p ? 'pending' : 'absent';
            if (p) await Promise.race([p.then(() => { state = 'resolved'; }, e => { state = 'rejected: ' + e; }),
                                       new Promise(r => setTimeout(r, 1000))]);
            out.push(v.model_id.slice(0, 8) + ' ' + state);
        }
        return out.join(', ') + ' (' + Object.keys(wm._models).length + ' models in the manager)';
    }""",
    # ipywidgets 7's nbextension loads through require.js and registers its comm target when the kernel is
    # created, which can land after the kernel is idle: a widget opened before it would have no model here
    "widgets": """() => !!(Jupyter.notebook.kernel && Jupyter.notebook.kernel.comm_manager
        && Jupyter.notebook.kernel.comm_manager.targets['jupyter.widget'])""",
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A Jupyter server (lab or classic) on loopback, in its own process group, over a temporary root."""

    def __init__(self, kind: str, python: Path, root: Path, work: Path):
        self.kind, self.root = kind, root
        self.port, self.token = _free_port(), secrets.token_hex(16)
        env = {
            **os.environ,
            "PATH": f"{python.parent}{os.pathsep}{os.environ.get('PATH', '')}",  # the kernel's `python`
            "FUSIONLAB_MODE": "interpreter",  # as CI: Triton's interpreter, torch on the CPU
            "CUDA_VISIBLE_DEVICES": "",
            "JUPYTER_CONFIG_DIR": str(work / "config"),
            "JUPYTER_DATA_DIR": str(work / "data"),
            "JUPYTER_RUNTIME_DIR": str(work / "runtime"),
            "IPYTHONDIR": str(work / "ipython"),
            "JUPYTERLAB_SETTINGS_DIR": str(work / "settings"),
            "JUPYTERLAB_WORKSPACES_DIR": str(work / "workspaces"),
        }
        for name, value in LAB_SETTINGS.items():
            (work / "settings" / name).parent.mkdir(parents=True, exist_ok=True)
            (work / "settings" / name).write_text(json.dumps(value))
        common = ["--no-browser", "--allow-root"]
        if kind == "lab":
            # as `setup.sh lab` starts it (its default URL is START_HERE.ipynb), with the token the lab
            # makes itself: the address it prints is then the one a learner copies, token and all
            cmd = [str(python), "-m", "jupyterlab", *common, "--ServerApp.ip=127.0.0.1"]
            cmd += [f"--ServerApp.port={self.port}", f"--LabApp.default_url={LANDING_URL}"]
            cmd += [f"--ServerApp.root_dir={root}", "--LabApp.expose_app_in_browser=True"]
        else:
            cmd = [str(python), "-m", "notebook", *common, "--ip=127.0.0.1", f"--port={self.port}"]
            cmd += [f"--NotebookApp.token={self.token}", f"--notebook-dir={root}"]
        self.log = (work / f"{kind}-server.log").open("w")
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 90
        self.printed = None
        while kind == "lab" and self.printed is None:
            m = re.search(r"(http://127\.0\.0\.1:\d+/\S*\?token=(\w+))", Path(self.log.name).read_text())
            if m:
                self.printed, self.token = m.group(1), m.group(2)
            elif self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{kind} server printed no address; see {self.log.name}") from None
            else:
                time.sleep(0.5)
        while True:
            try:
                urllib.request.urlopen(f"{self.base}/api/status?token={self.token}", timeout=2).close()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"{kind} server did not start; see {self.log.name}") from None
                time.sleep(0.5)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, path: str) -> str:
        if self.kind == "lab":  # ?reset: a fresh workspace, so the tabs of an earlier page are not restored
            return f"{self.base}/lab/tree/{path}?reset&token={self.token}"
        return f"{self.base}/notebooks/{path}?token={self.token}"

    def shutdown_kernels(self) -> None:
        """End every kernel the server runs (a lesson's, once it is checked): the next lesson runs alone."""
        api = f"{self.base}/api/kernels"
        kernels = json.loads(urllib.request.urlopen(f"{api}?token={self.token}", timeout=10).read())
        for k in kernels:
            req = urllib.request.Request(f"{api}/{k['id']}?token={self.token}", method="DELETE")
            urllib.request.urlopen(req, timeout=30).close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # our own process group: the server and its kernels
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


def _wait(page, js: str, what: str, timeout_s: float, arg=None) -> None:
    try:
        page.wait_for_function(js, arg=arg, timeout=timeout_s * 1000, polling=250)
    except Exception as e:
        raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}") from e


def run_lesson(
    page, server: Server, out: Path, timeout_s: float, lesson: str = LESSON, frames: dict | None = None
) -> dict:
    """Open the lesson, run every cell, check the widgets; returns what it found (raises on a failure).
    ``frames``: counts of the kernel messages the page received, kept up to date by a websocket listener."""
    js = LAB_JS if server.kind == "lab" else CLASSIC_JS
    name, stem = server.kind, Path(lesson).stem[:3].rstrip("_")
    t0 = time.monotonic()
    replies = frames["comm_info_reply"] if frames is not None else 0
    page.goto(server.url(lesson))
    _wait(page, js["ready"], "the notebook and its kernel", 120, arg=lesson)
    if "widgets" in js:
        _wait(page, js["widgets"], "ipywidgets' widget manager (its comm target) in the page", 60)
    if "widgets" in js and frames is not None:
        # ipywidgets 7's manager restores the kernel's widgets when the page opens: it asks the kernel for its
        # widget comms (comm_info_request, behind any cell already queued) and then re-renders every cell that
        # holds widget output, which removes the live views of cells run meanwhile (their outputs keep only
        # the picture). A learner clicks Run All seconds after the page opens; a Run All within milliseconds
        # lost lesson 4's or 7's widgets in about one classic run in four on CI (2026-11-27). So: wait for
        # the reply, then for the re-render it triggers.
        deadline = time.monotonic() + 60
        while frames["comm_info_reply"] == replies:
            if time.monotonic() > deadline:
                raise AssertionError(f"{name} {lesson}: ipywidgets' manager never asked the kernel for its widgets")
            page.wait_for_timeout(100)  # a sync Playwright call, so the websocket listener runs meanwhile
        page.wait_for_timeout(1000)
    loaded = time.monotonic()
    page.evaluate(js["run_all"])
    time.sleep(1)
    deadline = time.monotonic() + timeout_s
    while True:  # every code cell has run (or was aborted after an error) and the kernel is idle
        cells = page.evaluate(js["cells"])
        if not any(c["running"] for c in cells) and page.evaluate(js["idle"]):
            time.sleep(1)  # let the last widget messages land
            cells = page.evaluate(js["cells"])
            if not any(c["running"] for c in cells):
                break
        if time.monotonic() > deadline:
            raise AssertionError(f"{name} {lesson}: cells still running after {timeout_s:.0f} s")
        time.sleep(0.5)
    ran = time.monotonic()

    problems = []
    for c in cells:
        head = c["source"].strip().splitlines()[0][:70] if c["source"].strip() else ""
        for o in c["outputs"]:
            if o.get("output_type") == "error":
                problems.append(f"cell {c['i']} ({head}): {o.get('ename')}: {o.get('evalue')}")
            elif o.get("output_type") == "stream" and o.get("name") == "stderr":
                text = "".join(o.get("text", ""))
                if re.search(r"Traceback|Error", text):
                    problems.append(f"cell {c['i']} ({head}) wrote an error to stderr: {text.strip()[:300]}")
        if c["source"].strip() and not isinstance(c["count"], int):
            problems.append(f"cell {c['i']} ({head}) did not run (an earlier error stops Run All)")
    html = page.content()
    problems += [f"the page shows {e!r}" for e in RENDER_ERRORS if e in html]

    found = {"animations": [], "bars": []}
    # every trip animation: live controls, and a Step click that changes what it shows through the kernel
    anim_cells = [c["i"] for c in cells if "TripAnimation(" in c["source"] and c["outputs"]]
    for i in anim_cells:
        cell = page.locator(f'[data-fl-cell="{i}"]')
        step = cell.get_by_role("button", name="Step")
        try:  # a widget's view renders after its cell has run, later on a busy machine: give it time
            step.first.wait_for(timeout=30_000)
        except Exception:
            pass  # counted as missing below
        if not step.count():
            if "Skipped:" in json.dumps(c_outputs(cells, i)):
                continue  # a cell that could not run here (no Triton) says so; nothing to step
            mimes = sorted({k for o in c_outputs(cells, i) for k in o.get("data", {})})
            shown = cell.locator(".output_area, .jp-OutputArea-child").all_inner_texts()
            if "models" in js:
                shown.insert(0, "models: " + page.evaluate(js["models"], i))
            problems.append(
                f"cell {i}: the trip animation is not a live widget (no Step button; the cell's outputs carry "
                f"{mimes}, the page shows {' | '.join(shown)[:400]!r})"
            )
            continue
        reset = cell.get_by_role("button", name="Reset")
        slider = cell.locator(".widget-slider, .widget-hslider")
        if not (reset.count() and slider.count()):
            problems.append(f"cell {i}: the trip animation lacks its Reset button or slider")
        step.first.scroll_into_view_if_needed()
        before = cell.locator(".widget-html-content").all_inner_texts()
        step.first.click()
        try:
            page.wait_for_function(
                "([sel, before]) => JSON.stringify([...document.querySelectorAll(sel + ' .widget-html-content')]"
                ".map(e => e.innerText)) !== JSON.stringify(before)",
                arg=[f'[data-fl-cell="{i}"]', before],
                timeout=20_000,
            )
            after = cell.locator(".widget-html-content").all_inner_texts()
            frames = [t for t in after if re.search(r"trip \d+ of \d+", t)]
            found["animations"].append({"cell": i, "after_step": frames[0][:80] if frames else after[:1]})
        except Exception:
            problems.append(f"cell {i}: a Step click did not change the trip animation")
        if i == anim_cells[0]:
            cell.screenshot(path=str(out / f"{name}-{stem}-trips.png"))

    # every timing-bar image: its PNG loaded, shown at the size it was drawn (or narrower)
    imgs = page.locator("img.widget-image")
    for k in range(imgs.count()):
        img = imgs.nth(k)
        img.scroll_into_view_if_needed()
        try:
            page.wait_for_function(
                "(el) => el.complete && el.naturalWidth > 0", arg=img.element_handle(), timeout=20_000
            )
        except Exception:
            pass
        natural, shown = page.evaluate(
            "(el) => [[el.naturalWidth, el.naturalHeight], el.getBoundingClientRect().width]", img.element_handle()
        )
        found["bars"].append({"png_px": natural, "shown_px": round(shown)})
        if not natural[0]:
            problems.append(f"timing-bar image {k} has no picture")
        elif shown > natural[0] + 1:
            problems.append(f"timing-bar image {k} is stretched: drawn {natural[0]} px, shown {shown:.0f} px")
    if any("TimingBars(" in c["source"] for c in cells) and not imgs.count():
        problems.append("the timing bars are not a live widget (no image widget in the notebook)")
    if imgs.count():
        imgs.first.screenshot(path=str(out / f"{name}-{stem}-bars.png"))

    if problems:
        raise AssertionError(f"{name} {lesson}: " + "; ".join(problems))
    return {
        **found,
        "cells_run": sum(1 for c in cells if isinstance(c["count"], int)),
        "seconds": {"open": round(loaded - t0, 1), "run_all": round(ran - loaded, 1)},
    }


def c_outputs(cells: list[dict], i: int) -> list:
    return next((c["outputs"] for c in cells if c["i"] == i), [])


def check_landing(page, server: Server, out: Path) -> dict:
    """The address the lab prints opens START_HERE.ipynb; its table links lesson 1's exercise, and the link
    opens it."""
    page.goto(server.printed)
    page.locator(".jp-RenderedMarkdown h2", has_text="The lessons").first.wait_for(timeout=60_000)
    current = page.evaluate("() => window.jupyterapp.shell.currentWidget.context.path")
    if current != "START_HERE.ipynb":
        raise AssertionError(f"the printed address {server.printed} opened {current!r}, not START_HERE.ipynb")
    _wait(page, LAB_JS["ready"], "START_HERE's kernel", 60, arg="START_HERE.ipynb")
    time.sleep(1)  # the kernel's info reply (language_info) lands after it turns idle
    # known (not asserted): the kernel's language_info (with this Python's version) marks it modified
    dirty = page.evaluate("() => window.jupyterapp.shell.currentWidget.context.model.dirty")
    page.screenshot(path=str(out / "lab-landing.png"))
    exercise = Path(LESSON).name
    link = page.locator(f'.jp-RenderedMarkdown a[href*="exercises/{exercise}"]')
    if not link.count():
        raise AssertionError(f"START_HERE.ipynb has no link to exercises/{exercise}")
    link.first.click()
    page.wait_for_function(
        "(p) => window.jupyterapp.shell.currentWidget && window.jupyterapp.shell.currentWidget.context"
        " && window.jupyterapp.shell.currentWidget.context.path === p",
        arg=f"exercises/{exercise}",
        timeout=60_000,
    )
    return {"landing": f"the printed address opens START_HERE.ipynb, which opens exercises/{exercise}", "dirty": dirty}


def _loopback_only(route) -> None:
    """The page talks to our server only (the Colab badge's image, for one, is not fetched)."""
    host = urllib.parse.urlparse(route.request.url).hostname
    route.continue_() if host in ("127.0.0.1", "localhost") else route.abort()


def course_copy(dest: Path) -> Path:
    """The course's notebooks in a temporary root: the browser's kernels and saves never touch the repository."""
    for folder in ("notebooks", "exercises", "solutions"):
        if (ROOT / folder).is_dir():
            shutil.copytree(ROOT / folder, dest / folder)
    shutil.copy2(ROOT / "START_HERE.ipynb", dest / "START_HERE.ipynb")
    return dest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lab-python", type=Path, default=ROOT / ".venv" / "bin" / "python")
    ap.add_argument("--classic-python", type=Path, default=Path("/tmp/nb7/bin/python"))
    ap.add_argument("--frontends", default="lab,classic")
    ap.add_argument("--lab-lessons", default=",".join(LAB_LESSONS), help="comma-separated notebook paths")
    ap.add_argument("--classic-lessons", default=",".join(CLASSIC_LESSONS), help="comma-separated notebook paths")
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    ap.add_argument("--out", type=Path, default=ROOT / "out" / "browser")
    ap.add_argument("--timeout", type=float, default=600, help="seconds for a notebook's cells to run")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    results, failures = {}, []
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fusionlab-browser-") as tmp, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=args.chromium, headless=True, args=CHROMIUM_ARGS)
        for kind in args.frontends.split(","):
            python = args.lab_python if kind == "lab" else args.classic_python
            work = Path(tmp) / kind
            t0 = time.monotonic()
            server = Server(kind, python, course_copy(work / "root"), work)
            context = browser.new_context(viewport={"width": 1280, "height": 900})
            context.route("**/*", _loopback_only)
            page = context.new_page()
            console = []
            # what the page could not load, by address, and what its scripts reported: a widget whose model
            # class fails to load leaves its output empty, and only these say why
            page.on(
                "console", lambda m, c=console: c.append(f"{m.type}: {m.text}") if m.type in ("error", "warning") else 0
            )
            frames = {"comm_info_reply": 0}  # the kernel's replies the page has received, by type
            page.on(
                "websocket",
                lambda ws, f=frames: ws.on(
                    "framereceived",
                    lambda p: (
                        f.__setitem__("comm_info_reply", f["comm_info_reply"] + 1)
                        if isinstance(p, str) and "comm_info_reply" in p
                        else None
                    ),
                ),
            )
            page.on("requestfailed", lambda r, c=console: c.append(f"request failed: {r.url} ({r.failure})"))
            page.on("response", lambda r, c=console: c.append(f"HTTP {r.status}: {r.url}") if r.status >= 400 else None)
            try:
                res = {}
                if kind == "lab":
                    res.update(check_landing(page, server, args.out))
                lessons = (args.lab_lessons if kind == "lab" else args.classic_lessons).split(",")
                failed = []
                for lesson in lessons:  # each checked on its own: one failure does not hide the next lesson's
                    try:
                        res[lesson] = run_lesson(page, server, args.out, args.timeout, lesson, frames)
                        print(f"  {kind} {lesson}: {json.dumps(res[lesson]['seconds'])}", flush=True)
                    except Exception as e:
                        failed.append(str(e))
                        res[lesson] = {"error": str(e)}
                        print(f"  FAIL {kind} {lesson}: {e}", flush=True)
                        page.screenshot(path=str(args.out / f"{kind}-{Path(lesson).stem}-failure.png"))
                    page.goto("about:blank")  # the lesson's page is left before its kernel is shut down
                    server.shutdown_kernels()
                res["seconds"] = round(time.monotonic() - t0, 1)
                res["browser_log"] = sorted(set(console))[:40]
                if failed:
                    raise AssertionError(" | ".join(failed))
                results[kind] = res
                print(f"PASS {kind}: {json.dumps(res)}", flush=True)
            except Exception as e:
                failures.append(f"{kind}: {e}")
                results[kind] = {"error": str(e), "browser_log": console[-40:]}
                print(f"FAIL {kind}: {e}", flush=True)
                for line in console[-20:]:
                    print(f"  browser console {line[:300]}")
                page.screenshot(path=str(args.out / f"{kind}-failure.png"))
            finally:
                context.close()
                server.stop()
                shutil.copy2(work / f"{kind}-server.log", args.out / f"{kind}-server.log")
        browser.close()
    results["seconds"] = round(time.monotonic() - start, 1)
    (args.out / "result.json").write_text(json.dumps(results, indent=1) + "\n")
    print(f"screenshots and result.json in {args.out}")
    t0 = os.environ.get("FUSIONLAB_BROWSER_T0")  # set by browser_test.sh: the time its set-up started
    if t0:
        print(f"browser test: {time.time() - float(t0):.0f} s in all, set-up included")
    passed, failed = len(results) - 1 - len(failures), len(failures)
    print(f"{passed} passed, {failed} failed")  # last: the line CI reads
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
