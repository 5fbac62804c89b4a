"""Every Triton kernel compiles for sm_80 and sm_90 and fits the launch limits, checked without a GPU
(`torchssvm.kernels.compile_check`). The interpreter the other kernel tests run under never builds a kernel's
IR, so these are the only CI tests that see what the GPU compiler sees."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
from torchssvm.kernels import compile_check

pytest.importorskip("triton")
try:
    compile_check._tool("ptxas")
    compile_check._tool("cuobjdump")
except FileNotFoundError as exc:  # a Triton wheel without the NVIDIA backend (not Linux x86-64)
    pytest.skip(str(exc), allow_module_level=True)


def _without_interpreter(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")  # compile for real, not from an earlier run's cache
    return env


def test_every_kernel_compiles_for_sm80_and_sm90_within_the_launch_limits(tmp_path):
    out = tmp_path / "compile.json"
    proc = subprocess.run([sys.executable, "-m", "torchssvm.kernels.compile_check", "--arch", "80", "90",
                           "--json", str(out)], env=_without_interpreter(tmp_path), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    report = json.loads(out.read_text())
    assert report["gaps"] == []
    results = report["results"]
    assert all(r["ok"] and not r["error"] and not r["problems"] for r in results)
    compiled = {(r["launch"]["module"], r["launch"]["kernel"], r["arch"]) for r in results}
    kernels = {tuple(name.rsplit(".", 1)) for name in report["kernels"]}
    assert len(kernels) == 23
    assert compiled == {(m, k, arch) for m, k in kernels for arch in (80, 90)}
    assert all(r["registers"] > 0 and r["num_warps"] >= 1 for r in results)
    # The dispatch rules reach every constexpr branch: both Viterbi tilings, both masks, both float types.
    viterbi = {(r["launch"]["constexprs"]["SINGLE"], r["launch"]["signature"]["unary_ptr"])
               for r in results if r["launch"]["kernel"] == "_viterbi_kernel"}
    assert viterbi == {(True, "*fp32"), (True, "*fp64"), (False, "*fp32"), (False, "*fp64")}
    # The newer Viterbi kernels: one program per sequence (both float types, shared and per-position transitions),
    # the GPU-wide one persistent (grid barrier) and by launches per step, forward and backtrack apart.
    seq = {(r["launch"]["constexprs"]["PER_POSITION"], r["launch"]["signature"]["unary_ptr"])
           for r in results if r["launch"]["kernel"] == "_viterbi_seq_kernel"}
    assert seq >= {(False, "*fp32"), (False, "*fp64"), (True, "*fp32")}
    grid = {tuple(r["launch"]["constexprs"][k] for k in ("STEPS", "BACKTRACK", "SYNC"))
            for r in results if r["launch"]["kernel"] == "_viterbi_grid_kernel"}
    assert grid == {(True, True, True), (True, False, False), (False, True, False)}
    # its running maximum fits the registers (at 64 floats a thread, 8 warps spilled); sm_80 keeps an 8-byte frame
    # in the forward-only variant (Triton 3.9)
    assert all(r["stack_bytes"] <= 16 for r in results if r["launch"]["kernel"] == "_viterbi_grid_kernel")
    # Long rows are spread over more warps (simplex_triton.row_warps). With 4 warps, as before, a 16384-entry
    # float64 row spilled 1,160 bytes per thread for the simplex and 19,944 for the box-equality projection
    # (Triton 3.9, sm_90); now the simplex does not spill and the box-equality row spills about 2 KB.
    stack = {}  # the largest frame over both float types and both architectures
    for r in results:
        if r["launch"]["kernel"] in ("_simplex_kernel", "_box_equality_kernel"):
            key = (r["launch"]["kernel"], r["launch"]["constexprs"]["BLOCK"])
            stack[key] = max(stack.get(key, 0), r["stack_bytes"])
    assert len(stack) == 4
    assert stack[("_simplex_kernel", 32)] == stack[("_box_equality_kernel", 32)] == 0
    assert stack[("_simplex_kernel", 16384)] < 256 and stack[("_box_equality_kernel", 16384)] < 5000


BROKEN = '''
import triton
import triton.language as tl


@triton.jit
def _loop_variable_kernel(x_ptr, n):
    for q in range(1, n):
        tl.store(x_ptr + q, q)
    for p in range(0, n):
        q = tl.load(x_ptr + p)  # q was int32 in the first loop: only the compiler rejects this
        tl.store(x_ptr + p, q + 1)
'''


def test_the_check_catches_what_the_interpreter_does_not(tmp_path):
    """The bug the check found in the 1-D distance transform (a loop variable reloaded as int64 after its
    loop): the interpreter runs the kernel, the compiler rejects it, and `compile_launch` reports the error."""
    (tmp_path / "broken_kernel.py").write_text(BROKEN)
    code = textwrap.dedent(f"""
        import json, sys, torch
        sys.path.insert(0, {str(tmp_path)!r})
        import broken_kernel
        from torchssvm.kernels import compile_check as c
        x = torch.zeros(8, dtype=torch.int64)
        with c.recording() as launches:
            broken_kernel._loop_variable_kernel[(1,)](x, 8)
        (launch, grid), = launches
        res = c.compile_launch(launch, ["broken"], [grid], 90, kernel=broken_kernel._loop_variable_kernel)
        print(json.dumps({{"signature": dict(launch.signature), "grid": grid, "ok": res.ok, "error": res.error}}))
    """)
    proc = subprocess.run([sys.executable, "-c", code], env=_without_interpreter(tmp_path), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["signature"] == {"x_ptr": "*i64", "n": "i32"} and res["grid"] == [1, 1, 1]
    assert not res["ok"] and "Loop-carried variable q" in res["error"]

    # The same kernel runs under the interpreter (how the other kernel tests run it) without complaint.
    env = dict(_without_interpreter(tmp_path), TRITON_INTERPRET="1")
    run = (f"import sys, torch; sys.path.insert(0, {str(tmp_path)!r}); import broken_kernel; "
           "x = torch.zeros(8, dtype=torch.int64); broken_kernel._loop_variable_kernel[(1,)](x, 8); "
           "print(x.tolist())")
    proc = subprocess.run([sys.executable, "-c", run], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.split("\n")[-2] == str([1, 2, 3, 4, 5, 6, 7, 8])


def test_launch_limits():
    assert compile_check.launch_problems(64, 32, 0, 90, [(1, 1, 1)]) == []
    assert "65536 per block" in compile_check.launch_problems(65, 32, 0, 90, [(1, 1, 1)])[0]
    assert "registers per thread" in compile_check.launch_problems(256, 1, 0, 90, [(1, 1, 1)])[0]
    assert compile_check.launch_problems(32, 4, 232_448, 90, [(1, 1, 1)]) == []
    assert "shared memory" in compile_check.launch_problems(32, 4, 232_449, 90, [(1, 1, 1)])[0]
    assert "shared memory" in compile_check.launch_problems(32, 4, 200_000, 80, [(1, 1, 1)])[0]
    assert "exceeds" in compile_check.launch_problems(32, 4, 0, 90, [(8, 70_000, 1)])[0]
    assert "no shared-memory limit" in compile_check.launch_problems(32, 4, 0, 70, [(1, 1, 1)])[0]


def test_jobs_must_be_positive(capsys):
    with pytest.raises(ValueError, match="jobs must be at least 1, got 0"):
        compile_check.run_check(tuple(compile_check.WORKLOADS)[:1], (90,), jobs=0)
    with pytest.raises(SystemExit):
        compile_check.main(["--jobs", "0"])
    assert "--jobs must be at least 1, got 0" in capsys.readouterr().err


def test_recording_refuses_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(RuntimeError, match="without TRITON_INTERPRET"):
        with compile_check.recording():
            pass


def test_every_module_with_triton_kernels_is_checked():
    """`TRITON_MODULES` names every module of the package that defines a `@triton.jit` function: a new one left out
    would compile nowhere before a GPU runs it (the overflow guard's module was, at first)."""
    import importlib
    import pkgutil

    import torchssvm.kernels as kernels
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    jitted = (JITFunction, InterpretedFunction)  # what @triton.jit makes, without and with TRITON_INTERPRET=1
    found = set()
    for info in pkgutil.walk_packages(kernels.__path__, "torchssvm.kernels."):
        if info.ispkg or not info.name.endswith("_triton"):
            continue
        mod = importlib.import_module(info.name)
        if any(isinstance(obj, jitted) and obj.fn.__module__ == mod.__name__ for obj in vars(mod).values()):
            found.add(info.name.removeprefix("torchssvm.kernels."))
    assert found == set(compile_check.TRITON_MODULES)
