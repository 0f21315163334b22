import os

import pytest
import torch

from fusionlab import runtime

pytestmark = pytest.mark.lesson1


@pytest.mark.parametrize(
    "requested, cap, env, mode",
    [
        ("auto", None, None, "interpreter"),  # laptop, CI
        ("auto", (9, 0), None, "gpu"),  # H100/H200
        ("auto", (8, 0), None, "gpu"),  # A100
        ("auto", (7, 5), None, "interpreter"),  # Colab's T4: Triton's floor is sm_80
        ("gpu", (7, 5), None, "gpu"),  # ... unless the learner insists
        ("interpreter", (9, 0), None, "interpreter"),
        ("auto", (9, 0), "1", "interpreter"),  # TRITON_INTERPRET set by hand wins
        ("AUTO", (9, 0), "0", "gpu"),
    ],
)
def test_decide_mode(requested, cap, env, mode):
    got, reason = runtime.decide_mode(requested, cap, env)
    assert got == mode
    assert reason


def test_t4_reason_says_what_to_do():
    _, reason = runtime.decide_mode("auto", (7, 5), None)
    assert "7.5" in reason and "FUSIONLAB_MODE=gpu" in reason


@pytest.mark.parametrize(
    "requested, cap, env, match",
    [
        ("gpu", None, None, "no CUDA GPU"),
        ("gpu", (9, 0), "1", "TRITON_INTERPRET"),
        ("fast", (9, 0), None, "not one of"),
    ],
)
def test_decide_mode_refuses_contradictions(requested, cap, env, match):
    with pytest.raises((RuntimeError, ValueError), match=match):
        runtime.decide_mode(requested, cap, env)


def test_module_state_is_consistent():
    if runtime.is_interpreter():
        assert os.environ.get("TRITON_INTERPRET") == "1"
        assert runtime.DEVICE.type == "cpu"
        assert torch.bfloat16 not in runtime.DTYPES  # the interpreter has no bf16
        assert runtime.HALF == torch.float16
    else:
        assert runtime.DEVICE.type == "cuda"
        assert torch.bfloat16 in runtime.DTYPES
    assert runtime.pick(gpu="big", interpreter="small") == ("big" if runtime.is_gpu() else "small")


def test_info_reports_versions():
    info = runtime.info()
    assert info.mode == runtime.MODE
    assert info.torch == torch.__version__.split("+")[0]
    text = str(info)
    for key in ("mode", "device", "torch", "triton", "python"):
        assert key in text
    assert info.torch in info.label()


def test_triton_imported_before_fusionlab_still_works_in_the_interpreter():
    # Triton's own @triton.jit helpers (tl.sigmoid, tl.cdiv) are compiled when triton is imported; if
    # that happens before fusionlab turns the interpreter on, fusionlab must mend them.
    import subprocess
    import sys

    code = (
        "import triton, triton.language as tl, torch\n"
        "import fusionlab\n"
        "from fusionlab.kernels.bias_gelu import bias_gelu\n"
        "x, b = torch.randn(37, 129), torch.randn(129)\n"
        "err = (bias_gelu(x, b, 'tanh') - torch.nn.functional.gelu(x + b, approximate='tanh')).abs().max()\n"
        "assert err < 1e-5, err\n"
        "print('ok')\n"
    )
    env = {**os.environ, "FUSIONLAB_MODE": "interpreter"}
    env.pop("TRITON_INTERPRET", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
