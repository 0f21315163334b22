"""``python -m fusionlab grade NOTEBOOK [...]``: grade a learner's notebook, exercise by exercise.

In a notebook a checker runs in the learner's own process: what the answer runs could read the
expected values off the checker's frame or patch the comparison. Here every exercise is graded with
two processes:

- the **learner's process** (fresh, one per exercise) runs the notebook's code cells up to the
  exercise, with every checker call taken out, and then serves the answer: it calls the learner's
  function on the inputs it is sent, inside the grading sandbox (launches, torch ops, guard zones),
  and sends back the result, the inputs as they are after the call and what the sandbox saw;
- the **grader's process** (this one) runs the exercise's checker, with the learner's function replaced
  by a proxy to the other process: it draws the seeds and the sizes (fresh ones: under the command,
  checkers add cases drawn at random, :data:`fusionlab.grading.GRADING`), computes every reference and
  makes every comparison. Nothing the learner's code does can reach them: results come back as data
  (``torch.load(weights_only=True)``, no code), never as objects that run on arrival.

The learner's process also refuses an answer that changed the grading machinery itself (an attribute
of ``fusionlab.grading``, ``fusionlab.instrument``, the sandbox or Triton's launch hooks, compared with
their state before the notebook ran). Each exercise's verdict is printed; the command exits non-zero
when one failed.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import importlib
import inspect
import io
import json
import linecache
import os
import re
import struct
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import dataclass

from . import _exercise, _triton, bench, grading, instrument, ledger
from ._triton import _base_fn

#: `from fusionlab.lessons.l4 import checkers as ex`: the alias of a lesson's checkers in a notebook
_IMPORT = re.compile(r"from\s+fusionlab\.lessons\.(l\d+[a-z]?)\s+import\s+checkers\s+as\s+(\w+)")
#: checkers whose answer is not a function of inputs the grader can send (they compile the learner's
#: function in the grader's own process): graded in the notebook only
NOT_REMOTE = {"check_what_it_fused"}


@dataclass
class Exercise:
    lesson: str  # "l4"
    checker: str  # "check_softmax"
    cell: int  # index of the cell that calls it
    call: str  # the call's source


def _cell_source(cell) -> str:
    src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
    # IPython magics and shell lines are not Python: left out
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in src.splitlines())


def _checker_calls(tree: ast.Module, aliases: dict[str, str]):
    """The top-level statements of ``tree`` that call a lesson's checker: (statement, lesson, checker)."""
    for stmt in tree.body:
        call = stmt.value if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) else None
        f = call.func if call is not None else None
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in aliases:
            if f.attr.startswith("check_"):
                yield stmt, aliases[f.value.id], f.attr


def read_notebook(path: str) -> tuple[list[str], list[Exercise]]:
    """The notebook's code cells (sources, magics left out) and its exercises, in order."""
    with open(path, encoding="utf-8") as f:
        nb = json.load(f)
    cells = [_cell_source(c) for c in nb["cells"] if c.get("cell_type") == "code"]
    aliases: dict[str, str] = {}
    exercises = []
    for i, src in enumerate(cells):
        aliases.update({alias: lesson for lesson, alias in _IMPORT.findall(src)})
        try:
            tree = ast.parse(src)
        except SyntaxError:
            continue
        for stmt, lesson, checker in _checker_calls(tree, aliases):
            exercises.append(Exercise(lesson, checker, i, ast.get_source_segment(src, stmt) or checker))
    return cells, exercises


# -- the wire: length-prefixed torch.save frames ----------------------------------------------------------
def _send(stream, obj) -> None:
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    data = buf.getvalue()
    stream.write(struct.pack("<Q", len(data)) + data)
    stream.flush()


def _recv(stream, *, trusted: bool):
    import torch

    head = stream.read(8)
    if len(head) < 8:
        raise EOFError("the learner's process ended")
    (n,) = struct.unpack("<Q", head)
    data = stream.read(n)
    if trusted:
        return torch.load(io.BytesIO(data), weights_only=False)
    with torch.serialization.safe_globals(_safe_globals()):
        return torch.load(io.BytesIO(data), weights_only=True)


def _safe_globals() -> list:
    """What may come back from the learner's process besides tensors and plain data: the ledgers an
    exercise returns and the measured ceilings a checker call is handed (data classes of the package's own)."""

    owners = (ledger, bench)
    return [v for m in owners for v in vars(m).values() if isinstance(v, type) and dataclasses.is_dataclass(v)]


# -- the learner's process ---------------------------------------------------------------------------------
def _machinery() -> dict:
    """Every attribute of the grading machinery, by (owner, name): compared before each call."""
    import torch.utils._python_dispatch as pd

    owners = [grading, instrument, _triton, _exercise, grading.Sandbox, instrument.LaunchCounter, pd.TorchDispatchMode]
    owners += [c for c in vars(grading).values() if isinstance(c, type) and c.__module__.startswith("fusionlab")]
    # Triton's own run paths: a run patched by the notebook would run inside the sandbox's kernel runs,
    # where the concealed inputs hold their real values
    owners += _triton._kernel_classes()
    with contextlib.suppress(ImportError):
        from triton.runtime import interpreter

        owners += [interpreter.GridExecutor, interpreter.InterpreterBuilder]
    return {(getattr(o, "__name__", repr(o)), k): v for o in owners for k, v in list(vars(o).items())}


def _tampered(before: dict) -> list[str]:
    after = _machinery()
    return sorted(f"{o}.{k}" for (o, k), v in before.items() if after.get((o, k), None) is not v)


def _signature(fn) -> list | None:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    return [(p.name, int(p.kind), p.default is not inspect.Parameter.empty) for p in sig.parameters.values()]


def _jit_sources(ns: dict) -> dict[str, str]:
    """The source of every Triton kernel and jit helper the notebook defined, by name."""

    out = {}
    for name, obj in list(ns.items()):
        base = _base_fn(obj)
        if base is not obj and inspect.isfunction(base):
            try:
                out[name] = textwrap.dedent(inspect.getsource(base))
            except (OSError, TypeError):
                pass
    return out


def _locate(tensors, t) -> tuple | None:
    ptr = t.untyped_storage().data_ptr()
    for i, a in enumerate(tensors):
        if a.untyped_storage().data_ptr() == ptr:
            return i
    return None


def _serve(notebook: str, index: int, proto_in, proto_out) -> None:
    """The learner's process: run the notebook up to exercise ``index``, then answer calls."""

    import torch
    from torch.utils._pytree import tree_leaves

    machinery = _machinery()
    cells, exercises = read_notebook(notebook)
    ex = exercises[index]
    ns: dict = {"__name__": "__main__", "display": lambda *a, **k: None}
    errors = []
    for i, src in enumerate(cells[: ex.cell + 1]):
        tree = ast.parse(src)
        aliases = {alias: lesson for j in range(i + 1) for lesson, alias in _IMPORT.findall(cells[j])}
        calls = {id(stmt) for stmt, _, _ in _checker_calls(tree, aliases)}
        tree.body = [s for s in tree.body if id(s) not in calls]
        name = f"<cell {i}>"
        linecache.cache[name] = (len(src), None, src.splitlines(True), name)  # tracebacks show the line
        try:
            exec(compile(tree, name, "exec"), ns)
        except BaseException as e:  # a cell that fails is reported; the exercise may still stand
            errors.append(f"cell {i}: {type(e).__name__}: {str(e).strip()[:200]}")
    call = ast.parse(ex.call).body[0].value
    values, fns = [], []
    for node in (*call.args, *(k.value for k in call.keywords)):
        try:
            v = eval(compile(ast.Expression(node), "<checker call>", "eval"), ns)
        except Exception as e:
            v = e
        if callable(v) and not isinstance(v, (type, BaseException)):
            values.append(("fn", len(fns), _signature(v)))
            fns.append(v)
        elif isinstance(v, BaseException):
            values.append(("missing", f"{type(v).__name__}: {v}"))
        else:
            values.append(("value", v))
    keywords = [k.arg for k in call.keywords]
    _send(proto_out, {"values": values, "keywords": keywords, "errors": errors, "sources": _jit_sources(ns)})
    while True:
        msg = _recv(proto_in, trusted=True)
        if msg["op"] == "stop":
            return
        fn = fns[msg["fn"]]
        args, kwargs = msg["args"], msg["kwargs"]
        changed = _tampered(machinery)
        if changed:
            _send(proto_out, {"tampered": changed})
            continue
        box_cls = importlib.import_module(msg["box"][0])
        for part in msg["box"][1].split("."):
            box_cls = getattr(box_cls, part)
        box = box_cls(**msg["box"][2])
        arg_tensors = [a for a in tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        # the real inputs are in this process from here on: hidden from the answer but in its kernels' runs
        box.conceal([arg_tensors[i] for i in msg.get("conceal", [])], decoys=msg.get("decoys"))
        reply = {}
        _exercise.DEPTH[0] += 1
        try:
            with box:
                out = fn(*args, **kwargs)
            if type(out).__module__ == "numpy" and hasattr(out, "item"):
                out = out.item()  # a numpy scalar travels as the number it is
            reply["out"] = out
        except BaseException as e:
            hint = grading.stub_hint(e)
            reply["raised"] = {
                "type": type(e).__name__,
                "text": str(e),
                "stub": hint,
                "answer_key": isinstance(e, _exercise.AnswerKeyCalled),
                "line": grading._learner_frame(e.__traceback__),
            }
            out = None
        finally:
            _exercise.DEPTH[0] -= 1
        out_tensors = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        launches = []
        for la in box.launches:
            where = []
            for t in la.tensors:
                i = _locate(arg_tensors, t)
                j = _locate(out_tensors, t) if i is None else None
                where.append(("arg", i) if i is not None else ("out", j) if j is not None else None)
            launches.append((la.name, la.module, where))
        reply.update(box.report(), launches=launches, args_after=arg_tensors, tampered=_tampered(machinery))
        reply["after"] = box.written_after(out)
        reply["unstored"] = box.not_stored(out)
        try:
            _send(proto_out, reply)
        except Exception as e:  # an answer that returned something that cannot travel as data
            reply.pop("out", None)
            reply["unsendable"] = f"{type(e).__name__}: {e}"
            _send(proto_out, reply)


def _serve_main(argv: list[str]) -> None:
    # the protocol keeps the real stdout; whatever the notebook prints goes to stderr
    proto_out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    _serve(argv[0], int(argv[1]), sys.stdin.buffer, proto_out)


# -- the grader's process -----------------------------------------------------------------------------------
class Learner:
    """The learner's process for one exercise."""

    def __init__(self, notebook: str, index: int, *, timeout: float, log):
        env = dict(os.environ, MPLBACKEND="Agg", PYTHONHASHSEED="random")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fusionlab.grade", notebook, str(index)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            env=env,
        )
        self.timeout, self.expired = timeout, False
        self.timer = threading.Timer(timeout, self._expire)  # a hung answer ends its process, not the grading
        self.timer.daemon = True
        self.timer.start()
        try:
            self.manifest = self._recv()
        except BaseException:  # nothing readable came: the process goes, the grader gives a verdict
            self.timer.cancel()
            self.proc.kill()
            self.proc.wait()
            raise

    def _expire(self) -> None:
        self.expired = True
        self.proc.kill()

    def _recv(self):
        return _recv(self.proc.stdout, trusted=False)

    def call(self, fn: int, args, kwargs, box, conceal: list[int], decoys: list) -> dict:
        spec = box.remote_spec() if hasattr(box, "remote_spec") else {}
        cls = type(box)
        _send(self.proc.stdin, {"op": "call", "fn": fn, "args": args, "kwargs": kwargs, "conceal": conceal,
                                "decoys": decoys,
                                "box": (cls.__module__, cls.__qualname__, spec)})  # fmt: skip
        return self._recv()

    def close(self) -> None:
        self.timer.cancel()
        try:
            _send(self.proc.stdin, {"op": "stop"})
            self.proc.wait(timeout=10)
        except Exception:
            self.proc.kill()
            self.proc.wait()


class RemoteAnswer:
    """The learner's function, living in the learner's process: called like it, from a checker."""

    def __init__(self, learner: Learner, index: int, signature, sources: dict[str, str]):
        self._learner, self._index = learner, index
        self.kernel_sources = sources  # what lesson 7's checker reads the kernel's loop from
        self.__name__ = self.__qualname__ = "answer"
        if signature is not None:
            self.__signature__ = inspect.Signature(
                [
                    inspect.Parameter(n, inspect._ParameterKind(k), default=None if d else inspect.Parameter.empty)
                    for n, k, d in signature
                ]
            )

    def __call__(self, *args, **kwargs):
        import torch
        from torch.utils._pytree import tree_leaves

        box = grading.ACTIVE[-1] if grading.ACTIVE else grading.Sandbox()
        # the transfer and the bookkeeping are not the answer's work: out of the sandbox's sight
        mine = [a for a in tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        hidden = box.concealed() if hasattr(box, "concealed") else set()
        conceal = [i for i, t in enumerate(mine) if grading._storage(t) in hidden]
        # the grader's decoys travel too: a result computed from them is then recognised here
        decoys = [box.decoy_of(mine[i]) for i in conceal]
        # the inputs go with their real values (concealed again in the learner's process)
        show = box.showing_real() if hasattr(box, "showing_real") else contextlib.nullcontext()
        with torch._C._DisableTorchDispatch(), show:
            reply = self._learner.call(self._index, args, kwargs, box, conceal, decoys)
            if reply.get("tampered"):
                raise grading.CheckFailed(
                    "the notebook changes fusionlab's grading machinery ("
                    + ", ".join(reply["tampered"][:3])
                    + "): an answer is graded as it is, not with the checks switched off."
                )
            for t, after in zip(mine, reply["args_after"], strict=True):  # what the answer did to its inputs
                whole, mine_whole = after.untyped_storage(), t.untyped_storage()
                if whole.nbytes() == mine_whole.nbytes() and after.storage_offset() == t.storage_offset():
                    # the buffer the input sits in, guard behind it included: a store past the input's end
                    # (an in-place update's chunk mask) is then seen here as in the notebook
                    mine_whole.copy_(whole)
                elif not torch.equal(grading._bits(t), grading._bits(after)):
                    t.copy_(after.to(t.device))
            if "unsendable" in reply:
                raise TypeError(f"the answer returned something that is not data: {reply['unsendable']}")
            out = reply.get("out")
            outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
            launches = []
            for name, module, where in reply["launches"]:
                tensors = [
                    mine[w[1]] if w and w[0] == "arg" else outs[w[1]] if w else torch.empty(1) for w in where
                ]  # fmt: skip
                launches.append(grading.Launch(name, module, tensors))
            box.take_report({**reply, "launches": launches})
        raised = reply.get("raised")
        if raised:
            if raised["answer_key"]:
                raise _exercise.AnswerKeyCalled(raised["text"])
            if raised["stub"] is not None:
                raise NotImplementedError(f"Exercise: {raised['stub']}")
            err = type(raised["type"], (Exception,), {})(raised["text"])
            err.learner_line = raised["line"]
            raise err
        return out


@dataclass
class Verdict:
    exercise: Exercise
    passed: bool
    message: str
    seconds: float
    skipped: bool = False


def grade_exercise(notebook: str, index: int, ex: Exercise, *, timeout: float, log) -> Verdict:

    t0 = time.perf_counter()
    if ex.checker in NOT_REMOTE:
        why = "not graded here: check it in the notebook (its checker compiles the learner's function)"
        return Verdict(ex, True, why, 0.0, skipped=True)
    try:
        learner = Learner(notebook, index, timeout=timeout, log=log)
    except EOFError:
        why = "the learner's process ended before the exercise (--log FILE shows why)"
        return Verdict(ex, False, why, time.perf_counter() - t0)
    except Exception as e:  # what it sent cannot be read as data: a verdict all the same, and the rest graded
        why = f"the exercise's arguments cannot travel as data ({type(e).__name__}: {str(e).strip().splitlines()[0]})"
        return Verdict(ex, False, why, time.perf_counter() - t0)
    try:
        man = learner.manifest
        args = []
        for v in man["values"]:
            if v[0] == "fn":
                args.append(RemoteAnswer(learner, v[1], v[2], man["sources"]))
            elif v[0] == "missing":
                return Verdict(ex, False, f"the answer is not defined: {v[1]}", time.perf_counter() - t0)
            else:
                args.append(v[1])
        n_kw = len(man["keywords"])
        pos, kw = args[: len(args) - n_kw], dict(zip(man["keywords"], args[len(args) - n_kw :], strict=True))
        checker = getattr(importlib.import_module(f"fusionlab.lessons.{ex.lesson}.checkers"), ex.checker)
        grading.GRADING[0] = True
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out):
                res = checker(*pos, **kw)
            return Verdict(ex, True, str(res), time.perf_counter() - t0)
        except grading.CheckFailed as e:
            return Verdict(ex, False, str(e), time.perf_counter() - t0)
        except EOFError as e:
            why = f"the answer took longer than {timeout:g} s (--timeout)" if learner.expired else str(e)
            return Verdict(ex, False, why, time.perf_counter() - t0)
        except Exception as e:  # the checker itself broke: a verdict all the same, and the rest graded
            why = f"the checker raised {type(e).__name__}: {e} (not the answer's fault: report it)"
            return Verdict(ex, False, why, time.perf_counter() - t0)
        finally:
            grading.GRADING[0] = False
    finally:
        learner.close()


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("notebooks", nargs="+", metavar="NOTEBOOK", help="learners' notebooks (.ipynb)")
    p.add_argument("--only", action="append", default=[], metavar="CHECKER",
                   help="grade only this exercise (its checker's name, e.g. check_softmax); repeatable")  # fmt: skip
    p.add_argument("--timeout", type=float, default=1800, help="seconds an exercise may take")
    p.add_argument("--log", metavar="FILE", help="where the learners' processes write (default: nowhere)")


def main(args: argparse.Namespace) -> int:
    log = open(args.log, "ab") if args.log else subprocess.DEVNULL  # noqa: SIM115
    failed = 0
    try:
        for nb in args.notebooks:
            _, exercises = read_notebook(nb)
            print(f"{nb}: {len(exercises)} exercises")
            for i, ex in enumerate(exercises):
                if args.only and ex.checker not in args.only:
                    continue
                v = grade_exercise(nb, i, ex, timeout=args.timeout, log=log)
                failed += not v.passed
                lines = v.message.splitlines() or [""]
                mark = "SKIP" if v.skipped else "PASS" if v.passed else "FAIL"
                print(f"  {mark} {ex.lesson}.{ex.checker} ({v.seconds:.0f} s): " + "\n      ".join(lines[:6]))
    finally:
        if args.log:
            log.close()
    print(f"{failed} failed" if failed else "all passed")
    return 1 if failed else 0


if __name__ == "__main__":
    _serve_main(sys.argv[1:])
