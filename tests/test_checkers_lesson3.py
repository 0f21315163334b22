"""Lesson 3's checkers (and the inductor_code helpers the lesson reads code with).

Compiling costs seconds on a CPU, so the module compiles each exercise function once: the checker
caches what Inductor generated per function and inputs, and every test below reuses that cache.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fusionlab import inductor as ic
from fusionlab.grading import CheckFailed
from fusionlab.lessons.l3 import checkers as ex
from fusionlab.lessons.l3 import generated_code

pytestmark = [
    pytest.mark.lesson3,
    # raised inside torch when Inductor starts, not by this code
    pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"),
]


# the two functions of exercise 1, as the solutions notebook defines them
def scale_shift_relu(x, w, b):
    return (x * w + b).relu() * 2


def residual_gelu_matmul(x, r, w):
    return F.gelu(x + r) @ w


INPUTS_A = (torch.randn(64, 256), torch.randn(256), torch.randn(256))
INPUTS_B = (torch.randn(64, 128), torch.randn(64, 128), torch.randn(128, 256) / 128**0.5)


@pytest.fixture(scope="module")
def truth():
    """What Inductor does on this machine (two compiles for the whole module)."""
    return {"a": ex.what_it_fused(scale_shift_relu, INPUTS_A), "b": ex.what_it_fused(residual_gelu_matmul, INPUTS_B)}


def _solution(fn, inputs):
    """The solution notebook's answer: count with fusionlab.inductor_code (one more compile each)."""
    code = ic.generated_code(fn, *inputs)
    return {
        "n_eager": len(ic.eager_ops(fn, *inputs)),
        "n_generated": ic.count_kernels(code),
        "n_library": len(ic.extern_calls(code)),
    }


# -- exercise 1 ---------------------------------------------------------------------------------------
def test_truth_on_cpu_is_what_the_lesson_says(truth):
    assert truth["a"].eager == ("mul", "add", "relu", "mul")
    assert len(truth["a"].generated) == 1 and truth["a"].library == ()
    assert ic.fused_name(truth["a"].generated[0]) == "add_mul_relu"
    assert truth["b"].eager == ("add", "gelu", "mm")
    assert len(truth["b"].generated) == 1 and truth["b"].library == ("mm",)


def test_solution_passes(truth, capsys):
    msg_a = ex.check_what_it_fused(scale_shift_relu, INPUTS_A, **_solution(scale_shift_relu, INPUTS_A))
    msg_b = ex.check_what_it_fused(residual_gelu_matmul, INPUTS_B, **_solution(residual_gelu_matmul, INPUTS_B))
    assert str(msg_a) == "✓ scale_shift_relu: eager runs 4 kernels; compiled, 1 generated + 0 library = 1 launch"
    assert str(msg_b) == "✓ residual_gelu_matmul: eager runs 3 kernels; compiled, 1 generated + 1 library = 2 launches"
    out = capsys.readouterr().out
    assert str(msg_a) in out and out.count("✓") == 2  # printed once each, never twice


def test_truth_is_cached_per_function_and_shapes(truth):
    assert ex.what_it_fused(scale_shift_relu, INPUTS_A) is truth["a"]
    # other values of the same shapes: the same compile
    assert ex.what_it_fused(scale_shift_relu, tuple(torch.randn_like(t) for t in INPUTS_A)) is truth["a"]


@pytest.mark.parametrize(
    "fn, inputs, answer, match",
    [
        (scale_shift_relu, INPUTS_A, dict(n_eager=3, n_generated=1, n_library=0), r"n_eager = 3 .* `\* 2`"),
        (scale_shift_relu, INPUTS_A, dict(n_eager=4, n_generated=4, n_library=0), "That is the eager count"),
        (scale_shift_relu, INPUTS_A, dict(n_eager=4, n_generated=1, n_library=1), "n_library = 1 is not right"),
        (
            residual_gelu_matmul,
            INPUTS_B,
            dict(n_eager=3, n_generated=2, n_library=1),
            "You counted the library call as well",
        ),
        (residual_gelu_matmul, INPUTS_B, dict(n_eager=3, n_generated=1, n_library=0), "extern_calls"),
        (residual_gelu_matmul, INPUTS_B, dict(n_eager=3, n_generated=0, n_library=1), "count_kernels"),
    ],
    ids=[
        "eager-miscounted",
        "generated-is-eager",
        "library-where-none",
        "library-counted-as-generated",
        "library-missed",
        "generated-zero",
    ],
)
def test_wrong_counts_are_explained(truth, fn, inputs, answer, match):
    with pytest.raises(CheckFailed, match=match):
        ex.check_what_it_fused(fn, inputs, **answer)


@pytest.mark.parametrize(
    "bad, match",
    [(["mul", "add"], "count it with len"), (1.0, "whole number"), (None, "whole number"), (True, "whole number")],
)
def test_counts_must_be_whole_numbers(truth, bad, match):
    with pytest.raises(CheckFailed, match=match):
        ex.check_what_it_fused(scale_shift_relu, INPUTS_A, n_eager=bad, n_generated=1, n_library=0)


# -- exercise 2 ---------------------------------------------------------------------------------------
def test_layer_speedup_solution_passes():
    assert ex.check_layer_speedup(lambda mm, se, sc: (mm + se) / (mm + sc)).startswith("✓ layer speedup")


@pytest.mark.parametrize(
    "wrong, match",
    [
        (lambda mm, se, sc: se / sc, "speedup of the small ops alone"),
        (lambda mm, se, sc: (mm + sc) / (mm + se), "Upside down"),
        (lambda mm, se, sc: (mm + se) / mm if mm else se / sc, "costing nothing at all"),
        (lambda mm, se, sc: 1 + (se - sc), "expected"),
        (lambda mm, se, sc: None, "finite number"),
    ],
    ids=["small-ops-only", "inverted", "ceiling", "difference", "none"],
)
def test_layer_speedup_mistakes(wrong, match):
    with pytest.raises(CheckFailed, match=match):
        ex.check_layer_speedup(wrong)


def test_layer_speedup_reference_is_amdahl():
    mm, se, sc = 1.6385, 0.5012, 0.2098  # the recorded H200 run
    f, s = se / (mm + se), se / sc
    assert ex.layer_speedup(mm, se, sc) == pytest.approx(1 / ((1 - f) + f / s))
    assert ex.layer_speedup(0.0, se, sc) == pytest.approx(s)  # no matmul: the small ops' own speedup


# -- exercise 3 ---------------------------------------------------------------------------------------
def test_fusion_ceiling_solution_passes():
    assert ex.check_fusion_ceiling(lambda mm, se: (mm + se) / mm).startswith("✓ ceiling")


@pytest.mark.parametrize(
    "wrong, match",
    [
        (lambda mm, se: mm / (mm + se), "Upside down"),
        (lambda mm, se: se / mm, "time saved over the time left"),
        (lambda mm, se: float("inf"), "finite number"),
    ],
    ids=["inverted", "saved-over-left", "inf"],
)
def test_fusion_ceiling_mistakes(wrong, match):
    with pytest.raises(CheckFailed, match=match):
        ex.check_fusion_ceiling(wrong)


# -- the inductor_code helpers the lesson reads code with ------------------------------------------
# Inductor's GPU output for bias + GELU, as saved in the package from an H200 run (lesson 3 shows the
# same file to CPU learners): the parsers are tested on the real thing, without a GPU.
GPU_CODE = generated_code.saved_generated()["bias_gelu_fp32"]


def test_triton_kernel_source_and_excerpt():
    src = ic.kernel_source(GPU_CODE)
    assert src.startswith("@triton.jit\ndef triton_poi_fused_add_gelu_0(")
    assert src.rstrip().endswith("tl.store(out_ptr0 + (x2), tmp10, None)")
    assert "device_str" not in src and "triton_heuristics" not in src
    assert (src.count("tl.load("), src.count("erf("), src.count("tl.store(")) == (2, 1, 1)
    assert ic.kernel_excerpt(GPU_CODE) == src
    assert ic.fused_name("triton_poi_fused_add_gelu_0") == "add_gelu"
    assert ic.launch_lines(GPU_CODE) == [
        "triton_poi_fused_add_gelu_0.run(arg0_1, arg1_1, buf0, 268435456, stream=stream0)"
    ]


@pytest.mark.parametrize(
    "name, fused",
    [
        ("cpp_fused_add_gelu_0", "add_gelu"),
        ("cpp_fused_gelu_0", "gelu"),
        ("triton_per_fused__softmax_1", "_softmax"),
        ("graph_0_cpp_fused_add_mul_relu_sigmoid_0", "add_mul_relu_sigmoid"),
    ],
)
def test_fused_name(name, fused):
    assert ic.fused_name(name) == fused


def test_kernel_source_errors():
    with pytest.raises(ValueError, match="no kernel 'nope'"):
        ic.kernel_source(GPU_CODE, "nope")
    with pytest.raises(ValueError, match="no generated kernel"):
        ic.kernel_source("def call(args):\n    extern_kernels.mm(a, b, out=c)\n")


def test_saved_generated_roundtrip_on_cpu(tmp_path):
    """save_generated writes a header and the code; saved_generated and header read them back
    (on the CPU, tiny shapes, one function: one compile)."""
    assert generated_code.saved_generated(tmp_path / "missing") == {}
    (path,) = generated_code.save_generated(tmp_path, device="cpu", names=["bias_gelu_fp32"], small=True)
    assert path.name == "bias_gelu_fp32.py"
    saved = generated_code.saved_generated(tmp_path)
    assert list(saved) == ["bias_gelu_fp32"]
    text = saved["bias_gelu_fp32"]
    assert text.startswith("# ruff: noqa\n")
    head = generated_code.header(text)
    assert "ruff" not in head
    for field in (
        "# function: lesson 2's bias + GELU",
        "# device: CPU",
        "# date: ",
        "# torch ",
        "# generated kernels: cpp_fused_add_gelu_0",
        "# library calls: none",
        "def bias_gelu_eager(",
    ):
        assert field in head, field
    compile(text, str(path), "exec")  # a valid Python module, as Inductor wrote it
    assert "for(" in ic.kernel_excerpt(text) and ".store(" in ic.kernel_excerpt(text)
    with pytest.raises(ValueError, match="unknown names"):
        generated_code.save_generated(tmp_path, device="cpu", names=["nope"], small=True)


def test_main_refuses_cuda_without_a_gpu(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert generated_code.main(["--save", str(tmp_path)]) == 2
    assert "no CUDA GPU" in capsys.readouterr().err


def test_profiled_kernels_on_cpu(truth):
    compiled, code = ic.compile_with_code(scale_shift_relu, *INPUTS_A)
    assert ic.profiled_kernels(scale_shift_relu, *INPUTS_A) == ["aten::mul", "aten::add", "aten::relu", "aten::mul"]
    x, w, b = INPUTS_B[0], INPUTS_B[2], torch.randn(256)
    eager_layer = ic.profiled_kernels(lambda x, w, b: F.gelu(x @ w + b), x, w, b)
    assert eager_layer == ["aten::matmul", "aten::add", "aten::gelu"]  # as called: matmul, not the mm inside
    assert ic.profiled_kernels(compiled, *INPUTS_A) == ic.kernel_names(code)


def test_an_error_in_the_learners_function_is_a_message():
    def broken(x):
        return (x @ x.t()) @ torch.ones(3, 3)  # (4, 4) @ (3, 3): a shape error

    with pytest.raises(CheckFailed, match=r"your code raised \w*RuntimeError"):
        ex.check_what_it_fused(broken, (torch.randn(4, 5),), n_eager=1, n_generated=1, n_library=1)
    with pytest.raises(CheckFailed, match="pass the function and a tuple"):
        ex.check_what_it_fused(broken, torch.randn(4, 5), n_eager=1, n_generated=1, n_library=1)


@pytest.mark.parametrize("check", ["check_layer_speedup", "check_fusion_ceiling"])
def test_a_formula_that_divides_by_zero_is_a_message(check):
    with pytest.raises(CheckFailed, match="ZeroDivisionError"):
        getattr(ex, check)(lambda *a: 1 / 0)
