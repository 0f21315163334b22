"""A course without Triton (macOS, Windows): the torch cells run, the Triton cells say what they need.

Triton publishes wheels for Linux only. Without it, ``import fusionlab`` (see ``fusionlab.runtime``) calls
:func:`install`, which does two things, so that no notebook needs a line of its own for it:

- It puts a stand-in ``triton`` and ``triton.language`` in ``sys.modules``. A notebook's ``import triton``
  then works, ``@triton.jit`` / ``@triton.autotune`` definitions and ``tl.constexpr`` annotations
  evaluate, and the package's kernel modules import; but launching a kernel (``kernel[grid](...)``), or
  reaching for any other part of Triton (``triton.testing``, ``triton.compiler``...), raises
  :class:`TritonUnavailable`, which says plainly that the cell needs Linux or Colab.
- In IPython (Jupyter), it adds an AST transformer that wraps each cell so that a
  :class:`TritonUnavailable` becomes a printed note instead of an error: Run All goes on to the next
  cell (a cell's error would stop it). The cell's last expression is still displayed when nothing
  failed. The names a skipped cell would have defined are remembered: a later cell that fails with a
  ``NameError`` on one of them is skipped the same way, with a note naming it; any other error is
  raised as usual.
"""

from __future__ import annotations

import ast
import importlib.abc
import importlib.machinery
import platform
import sys
import types

#: the note a cell that needs Triton prints instead of failing
NEEDS = (
    "Triton is not installed here (Triton publishes wheels for Linux only), so this cell cannot run: "
    "run it on Linux or Colab. The lesson's torch cells still run."
)


class TritonUnavailable(ImportError):
    """Something needed Triton, which this machine does not have. (An ImportError, so code that already
    copes with a missing Triton module keeps doing so.)"""

    def __init__(self, what: str = ""):
        system = {"Darwin": "macOS"}.get(platform.system(), platform.system() or "this system")
        head = f"{what} needs Triton. " if what else ""
        super().__init__(
            f"{head}Triton is not installed for {system}: Triton publishes wheels for Linux only. "
            "Run the Triton cells on Linux or Colab; the torch cells run here."
        )


class _Kernel:
    """What ``@triton.jit`` (and ``@triton.autotune``, ``@triton.heuristics``) give without Triton: the
    function is kept (``.fn``, as Triton keeps it), and any launch raises :class:`TritonUnavailable`."""

    def __init__(self, fn):
        self.fn = fn
        self.__name__ = getattr(fn, "__name__", "kernel")
        self.__qualname__ = getattr(fn, "__qualname__", self.__name__)
        self.__module__ = getattr(fn, "__module__", __name__)
        self.__doc__ = getattr(fn, "__doc__", None)

    def _refuse(self, *args, **kwargs):
        raise TritonUnavailable(f"the Triton kernel {self.__name__}")

    def __getitem__(self, grid):
        return self._refuse

    __call__ = run = warmup = _refuse

    def __repr__(self) -> str:
        return f"<Triton kernel {self.__name__} (Triton is not installed: it cannot run here)>"


def _decorator(*args, **kwargs):
    """``@triton.jit`` or ``@triton.jit(...)``: both give a :class:`_Kernel`."""
    if len(args) == 1 and callable(args[0]) and not kwargs:
        fn = args[0]
        return fn if isinstance(fn, _Kernel) else _Kernel(fn)
    return lambda fn: fn if isinstance(fn, _Kernel) else _Kernel(fn)


class Config:
    """``triton.Config(kwargs, num_warps=..., ...)``, kept as given."""

    def __init__(self, kwargs=None, **options):
        self.kwargs, self.options = dict(kwargs or {}), options
        for k, v in options.items():
            setattr(self, k, v)


class _Placeholder:
    """``tl.float32``, ``tl.constexpr`` and the like: fine to name (in a signature, a default, an
    annotation), never to compute with."""

    def __init__(self, name: str):
        self._name = name

    def __call__(self, *args, **kwargs):
        raise TritonUnavailable(f"triton.language.{self._name}")

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder(f"{self._name}.{name}")

    def __repr__(self) -> str:
        return f"triton.language.{self._name} (Triton is not installed)"


class constexpr:  # noqa: N801  (Triton's name)
    """``tl.constexpr``: an annotation only here."""

    def __init__(self, value=None):
        self.value = value


def _cdiv(a, b):
    return -(-a // b)


def _next_power_of_2(n):
    return 1 << max(0, (int(n) - 1).bit_length())


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``triton.language.<module>`` (``extra.cuda``, ``extra.libdevice``...) imports as a stand-in whose
    names are placeholders, as ``triton.language``'s are; any other ``triton.<module>`` raises
    :class:`TritonUnavailable` on import."""

    def find_spec(self, name, path=None, target=None):
        if not name.startswith("triton.") or name in sys.modules:
            return None
        if name.startswith("triton.language."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        raise TritonUnavailable(name)

    def create_module(self, spec):
        return _module(spec.name, {}, _language_getattr)

    def exec_module(self, module):
        pass


def _module(name: str, attrs: dict, getattr_fn) -> types.ModuleType:
    mod = types.ModuleType(name, f"A stand-in for {name}: Triton is not installed (see fusionlab._no_triton).")
    mod.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    mod.__path__ = []
    mod.__dict__.update(attrs)
    mod.__getattr__ = getattr_fn
    mod.FUSIONLAB_STAND_IN = True
    return mod


def _triton_getattr(name):
    if name.startswith("__") and name != "__version__":
        raise AttributeError(name)
    raise TritonUnavailable(f"triton.{name}")


def _language_getattr(name):
    return _triton_getattr(name) if name.startswith("__") else _Placeholder(name)


def stand_ins() -> dict[str, types.ModuleType]:
    """The stand-in ``triton`` and ``triton.language`` modules (new ones each call)."""
    language = _module("triton.language", {"constexpr": constexpr}, _language_getattr)
    triton = _module(
        "triton",
        {
            "jit": _decorator,
            "autotune": lambda *a, **k: _decorator,
            "heuristics": lambda *a, **k: _decorator,
            "Config": Config,
            "cdiv": _cdiv,
            "next_power_of_2": _next_power_of_2,
            "language": language,
        },
        _triton_getattr,
    )
    return {"triton": triton, "triton.language": language}


def is_stand_in(mod) -> bool:
    return bool(getattr(mod, "__dict__", {}).get("FUSIONLAB_STAND_IN"))


# -- Jupyter: a cell that needs Triton prints a note, and Run All goes on --------------------------------------
#: the name under which the cell wrapper finds this module's helpers in the user's namespace
HELPER = "__fusionlab_no_triton__"


def assigned_names(tree: ast.AST) -> set[str]:
    """The names a cell binds at its top level (assignments, defs, imports, loop and with targets)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names if a.name != "*")
    return names


class Skipper:
    """The cell wrapper's helper: shows a cell's last value, and turns the cell's failure for want of
    Triton into a note (remembering what the cell would have defined)."""

    def __init__(self, shell=None):
        self.shell = shell
        self.missing: set[str] = set()  # names a skipped cell would have defined

    def show(self, value):
        if self.shell is not None and value is not None:
            self.shell.displayhook(value)

    def handle(self, error: BaseException, names: list[str]) -> None:
        if isinstance(error, NameError) and not isinstance(error, TritonUnavailable):
            name = getattr(error, "name", None)
            if name not in self.missing:
                raise error  # a real mistake, not a consequence of a skipped cell
            note = (
                f"Skipped: this cell uses `{name}`, which an earlier cell that needs Triton did not define. "
                "Run the lesson on Linux or Colab for it; the torch cells run here."
            )
        else:
            note = f"Skipped: {error}"
        self.missing.update(names)
        print(note)


class CellWrapper(ast.NodeTransformer):
    """Wraps a cell's code in ``try: ... except (TritonUnavailable, NameError)`` handed to :class:`Skipper`,
    keeping the display of the cell's last expression."""

    def visit_Module(self, node: ast.Module) -> ast.Module:
        body = list(node.body)
        if not body or any(isinstance(s, ast.ImportFrom) and s.module == "__future__" for s in body):
            return node
        names = sorted(assigned_names(node))
        if isinstance(body[-1], ast.Expr):  # the value IPython would display: shown by the helper instead
            show = ast.Call(ast.Attribute(ast.Name(HELPER, ast.Load()), "show", ast.Load()), [body[-1].value], [])
            body[-1] = ast.Expr(show)
        helper = ast.Name(HELPER, ast.Load())
        catch = ast.Tuple(
            [ast.Attribute(helper, "TritonUnavailable", ast.Load()), ast.Name("NameError", ast.Load())], ast.Load()
        )
        handler_call = ast.Call(
            ast.Attribute(ast.Name(HELPER, ast.Load()), "handle", ast.Load()),
            [ast.Name("__fusionlab_error__", ast.Load()), ast.Constant(tuple(names))],
            [],
        )
        wrapped = ast.Try(
            body=body,
            handlers=[ast.ExceptHandler(type=catch, name="__fusionlab_error__", body=[ast.Expr(handler_call)])],
            orelse=[],
            finalbody=[],
        )
        return ast.fix_missing_locations(ast.copy_location(ast.Module(body=[wrapped], type_ignores=[]), node))


class _Helper(Skipper):
    TritonUnavailable = TritonUnavailable


def install_in_ipython(shell) -> bool:
    """Add the cell wrapper to an IPython shell (once); returns whether it was added now."""
    if any(isinstance(t, CellWrapper) for t in shell.ast_transformers):
        return False
    shell.user_ns[HELPER] = _Helper(shell)
    shell.ast_transformers.append(CellWrapper())
    return True


def _torch_sees_no_triton() -> None:
    """Let torch look for Triton, and cache "none", before the stand-ins go in: torch.compile's CPU
    backend (C++) works without Triton, but a ``triton`` it can import would send it to Triton's."""
    try:
        from torch.utils import _triton

        _triton.has_triton_package()
        _triton.has_triton()
        import torch._inductor.runtime.triton_compat  # noqa: F401  (binds its own "no triton" at import)
    except Exception:  # a torch without these: nothing cached, nothing to protect
        pass


def install() -> None:
    """Put the stand-ins in place (when no real Triton is importable) and, in IPython, the cell wrapper."""
    if "triton" not in sys.modules:
        _torch_sees_no_triton()
        sys.modules.update(stand_ins())
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
    shell = None
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except ImportError:
        pass
    if shell is not None and hasattr(shell, "ast_transformers"):
        install_in_ipython(shell)
