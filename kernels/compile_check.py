"""Compile every Triton kernel for NVIDIA GPUs ahead of time, on a machine without one.

The Triton interpreter (``TRITON_INTERPRET=1``, how CI runs the kernels) executes the Python body of a kernel
with numpy; it never builds the kernel's IR, so code that the GPU compiler rejects passes there. One example:
a loop variable reused after its loop with another integer width is an error only in the compiler. This
module closes that gap without a GPU:

1. *Record*: run each kernel's Python wrapper (``viterbi_triton``, ``spatial_tree_max_sum_triton``, ...) on
   CPU tensors at the shapes of `WORKLOADS`, with `triton.runtime.jit.JITFunction.run` replaced by a recorder.
   The recorder keeps what the launch would hand to the compiler (argument types, ``constexpr`` values,
   ``num_warps``, the grid) and, instead of running, fills the arguments the kernel writes (`OUTPUTS`) with
   zeros: valid indices, so wrappers that read a launch's output carry on.
2. *Compile* each distinct launch to a cubin with Triton's own pipeline (`triton.compile` with a
   `GPUTarget`; ``ptxas`` ships inside the Triton wheel) for each target architecture.
3. *Check the launch limits* a GPU enforces only when the kernel is loaded: registers per thread (255) and per
   block (65,536), shared memory per block (the opt-in maximum of the architecture), grid extents.
   ``cuobjdump --dump-resource-usage`` (also in the wheel) gives registers, the per-thread stack frame
   (registers spilled to local memory; these kernels keep no local arrays, so a non-zero frame means spills)
   and static shared memory; the compiler's metadata gives the dynamic shared memory.

Launches are compiled without the divisibility specialisation the JIT adds for 16-byte-aligned pointers and
sizes, so the figures are those of the generic variant; the JIT's variants differ only in vector widths.

Command line: ``python -m torchssvm.kernels.compile_check [--arch 80 90] [--json PATH] [--jobs N]``; it exits
non-zero when a kernel fails to compile, exceeds a limit, or a Triton kernel of this package has no workload.
It must run without ``TRITON_INTERPRET=1`` (under the interpreter ``triton.jit`` builds no compilable kernel).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import inspect
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch

TRITON_MODULES = ("step.atoms_insert_triton", "step.atoms_select_triton", "step.block_step_triton",
                  "step.box_qp_triton", "step.sampling_triton", "projections.box_equality_triton",
                  "chain.chain_hinge_triton", "chain.chain_marginals_triton", "chain.chain_score_triton",
                  "chain.guard_triton",
                  "tree.distance_transform_triton", "projections.simplex_triton", "chain.slack_chain_triton",
                  "tree.tree_triton", "chain.viterbi_triton")

# Opt-in maximum of shared memory per block (bytes), by compute capability: A100 163 KiB, H100/H200 227 KiB.
MAX_SHARED = {80: 166_912, 86: 101_376, 89: 101_376, 90: 232_448}
MAX_REGS_PER_THREAD = 255
MAX_REGS_PER_BLOCK = 65_536
MAX_GRID = (2 ** 31 - 1, 65_535, 65_535)

_DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.float64: "fp64",
           torch.int8: "i8", torch.int16: "i16", torch.int32: "i32", torch.int64: "i64", torch.uint8: "u8",
           torch.bool: "i1"}


# The arguments each kernel writes. The recorder zeroes them in place of running the kernel, so that a wrapper
# that reads a launch's output (the trees backtrack through argmax indices) gets valid values.
OUTPUTS = {
    "_box_equality_kernel": ("out_ptr",),
    "_select_atoms_kernel": ("gaps_ptr", "misses_ptr", "s_labels_ptr", "s_loss_ptr", "s_H_ptr", "away_ptr",
                             "away_H_ptr", "alpha_a_ptr", "labels_a_ptr", "loss_a_ptr"),
    "_insert_atoms_kernel": ("store_labels_ptr", "store_loss_ptr", "store_alpha_ptr", "count_ptr", "valid_ptr",
                             "slot_ptr", "append_ptr"),
    "_block_step_kernel": ("z_ptr", "ell_ptr", "alpha_ptr"),
    "_sampling_keys_kernel": ("keys_ptr",),
    "_qp_init_kernel": ("gamma_ptr", "grad_ptr", "state_ptr", "running_ptr"),
    "_qp_prepare_kernel": ("M_ptr", "descent_ptr"),
    "_qp_trials_kernel": ("trials_ptr",),
    "_qp_values_kernel": ("values_ptr",),
    "_qp_select_kernel": ("gamma_ptr", "grad_ptr", "state_ptr", "running_ptr"),
    "_chain_inner_kernel": ("out_ptr",),
    "_chain_bound_kernel": ("part_ptr",),
    "_hinge_prepare_kernel": ("aug_ptr", "gold_ptr", "len_out_ptr", "target_out_ptr"),
    "_hinge_grad_kernel": ("gu_ptr", "gt_ptr", "gs_ptr", "ge_ptr"),
    "_chain_marginals_kernel": ("out_ptr",),
    "_chain_score_kernel": ("out_ptr",),
    "_gdt_1d_kernel": ("v_ptr", "out_ptr", "arg_ptr"),
    "_simplex_kernel": ("out_ptr",),
    "_slack_viterbi_kernel": ("bp_ptr", "alpha_ptr", "out_ptr", "value_ptr"),
    "_tree_level_kernel": ("msg_ptr", "arg_ptr"),
    "_viterbi_kernel": ("bp_ptr", "alpha_ptr", "out_ptr", "score_ptr"),
    "_viterbi_seq_kernel": ("hist_ptr", "out_ptr", "score_ptr"),
    "_viterbi_grid_kernel": ("hist_ptr", "out_ptr", "score_ptr", "sync_ptr"),
}


@dataclasses.dataclass(frozen=True)
class Launch:
    """What one kernel launch hands to the compiler: argument types (``"*fp32"``, ``"i32"``, ``"constexpr"``),
    ``constexpr`` values and compile options; plus the grid, for the limit check."""

    module: str
    kernel: str
    signature: Tuple[Tuple[str, str], ...]
    constexprs: Tuple[Tuple[str, object], ...]
    options: Tuple[Tuple[str, object], ...]

    def describe(self) -> str:
        types = sorted({t[1:] for _, t in self.signature if t.startswith("*") and t[1:] in ("fp32", "fp64")})
        const = ", ".join(f"{k}={v}" for k, v in self.constexprs)
        opts = ", ".join(f"{k}={v}" for k, v in self.options)
        return "; ".join(s for s in ("/".join(types), const, opts) if s)


@dataclasses.dataclass
class Compiled:
    """One launch compiled for one architecture (``arch``: compute capability, 90 for sm_90)."""

    launch: Launch
    workloads: List[str]
    grids: List[Tuple[int, int, int]]
    arch: int
    ok: bool
    error: str = ""
    seconds: float = 0.0
    num_warps: int = 0
    registers: int = 0
    stack_bytes: int = 0
    shared_bytes: int = 0
    problems: List[str] = dataclasses.field(default_factory=list)

    def to_json(self) -> dict:
        out = dataclasses.asdict(self)
        out["launch"] = {"module": self.launch.module, "kernel": self.launch.kernel,
                         "signature": dict(self.launch.signature),
                         "constexprs": dict(self.launch.constexprs), "options": dict(self.launch.options),
                         "describe": self.launch.describe()}
        return out


def _arg_type(value) -> str:
    if isinstance(value, torch.Tensor):
        if value.dtype not in _DTYPES:
            raise TypeError(f"no Triton pointer type for {value.dtype}")
        return "*" + _DTYPES[value.dtype]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -2 ** 31 <= value < 2 ** 31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"no Triton argument type for {type(value).__name__}")


@contextlib.contextmanager
def recording() -> Iterator[List[Tuple[Launch, Tuple[int, int, int]]]]:
    """Replace `JITFunction.run` by a recorder for the duration; yields the list it appends
    ``(Launch, grid)`` to."""
    from triton.runtime.jit import JITFunction

    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("compile_check must run without TRITON_INTERPRET=1: the interpreter builds no "
                           "compilable kernel")
    launches: List[Tuple[Launch, Tuple[int, int, int]]] = []
    original = JITFunction.run

    def record(self, *args, grid, warmup, **kwargs):
        names = [p.name for p in self.params]
        options = {k: v for k, v in kwargs.items() if k not in names}
        bound = inspect.signature(self.fn).bind(*args, **{k: v for k, v in kwargs.items() if k in names})
        bound.apply_defaults()
        signature, constexprs = [], []
        for p in self.params:
            value = bound.arguments[p.name]
            # the JIT makes an integer argument equal to 1 a constant too (a kernel that calls a method of it, such
            # as ``.to``, compiles at 1 only if it works on a Python int)
            one = not getattr(p, "do_not_specialize", False) and type(value) is int and value == 1
            if p.is_constexpr or one:
                signature.append((p.name, "constexpr"))
                constexprs.append((p.name, value))
            else:
                signature.append((p.name, _arg_type(value)))
                if p.name in OUTPUTS.get(self.fn.__name__, ()):
                    value.zero_()
        g = grid(bound.arguments) if callable(grid) else grid
        g = tuple(int(x) for x in g) + (1,) * (3 - len(g))
        launches.append((Launch(self.fn.__module__.split(".kernels.", 1)[-1], self.fn.__name__, tuple(signature),
                                tuple(constexprs), tuple(sorted(options.items()))), g))

    JITFunction.run = record
    try:
        yield launches
    finally:
        JITFunction.run = original


# ---------------------------------------------------------------------------------------------- workloads
# Each builds CPU inputs and calls one wrapper. Together they reach every kernel and every branch that changes
# a constexpr or num_warps, at the shapes of the tests and benchmarks (the largest each kernel takes).

def _chain(B, T, K, dtype, per_position=False, start_end=True):
    g = torch.Generator().manual_seed(0)
    unary = torch.randn(B, T, K, generator=g, dtype=dtype)
    transition = torch.randn(*((B, T - 1) if per_position else ()), K, K, generator=g, dtype=dtype)
    se = torch.randn(K, generator=g, dtype=dtype) if start_end else None
    return unary, transition, se, se, torch.full((B,), T, dtype=torch.long)


def _viterbi(B, T, K, dtype, kernel="auto", guarded=False, **kw):
    def run():
        from .chain.guard_triton import chain_guard_partials
        from .chain.viterbi_triton import viterbi_triton

        chain = _chain(B, T, K, dtype, **kw)
        guard = chain_guard_partials(*chain[:4]) if guarded else None  # a device `max_oracle` / `decode`
        viterbi_triton(*chain, kernel=kernel, guard=guard)
    return run


def _slack(B, T, K, dtype, margin=1.0, **kw):
    def run():
        from .chain.slack_chain_triton import slack_viterbi_triton

        args = _chain(B, T, K, dtype, **kw)
        target = torch.zeros(B, T, dtype=torch.long)
        slack_viterbi_triton(*args, target, torch.ones(B, dtype=dtype), torch.zeros(B, dtype=dtype),
                             torch.full((), margin, dtype=dtype) if margin != 1 else margin)
    return run


def _chain_score(B, C, T, K, dtype, start_end=True):
    def run():
        from .chain.chain_score_triton import chain_labels_score_triton

        unary, transition, se, _, lengths = _chain(B, T, K, dtype, start_end=start_end)
        chain_labels_score_triton(unary, transition, se, se, torch.zeros(B, C, T, dtype=torch.long), lengths)
    return run


def _chain_inner(B, T, K, dtype, start_end=True):
    def run():
        from .chain.chain_score_triton import chain_inner_triton

        unary, transition, se, _, _ = _chain(B, T, K, dtype, start_end=start_end)
        chain_inner_triton(unary, transition, se, se, torch.zeros(B, T * K + K * K + 2 * K, dtype=f64))
    return run


def _chain_hinge(B, T, K, dtype, per_position=False, start_end=True, class_weights=False, lw_tensor=False,
                 unary_dtype=None):
    def run():
        from .chain.chain_hinge_triton import chain_hinge_grad_triton, chain_hinge_prepare_triton
        from .chain.viterbi_triton import viterbi_triton

        unary, transition, se, _, lengths = _chain(B, T, K, dtype, per_position=per_position, start_end=start_end)
        unary = unary.to(unary_dtype or dtype)
        target = torch.zeros(B, T, dtype=torch.long)
        lw = torch.ones(B, dtype=f64) if lw_tensor else 1.0
        cw = torch.ones(K, dtype=f64) if class_weights else None
        aug, gold, lengths, target, guard = chain_hinge_prepare_triton(unary, transition, se, se, lengths, target,
                                                                       lw, cw, True, dtype)
        viterbi_triton(aug, transition, se, se, lengths, guard=guard, scale_unary=False, gold=gold)  # the hinge's
        chain_hinge_grad_triton(target, target, lengths, torch.ones(B, dtype=dtype), unary, transition, se, se,
                                (True, True, True, True), dtype)
    return run


def _chain_marginals(B, T, K, minus):
    def run():
        from .chain.chain_marginals_triton import chain_marginals_triton

        labels = torch.zeros(B, T, dtype=torch.long)
        chain_marginals_triton(labels, torch.full((B,), T, dtype=torch.long), K, labels if minus else None)
    return run


def _insert_atoms(B, n, capacity, W, keep_active):
    def run():
        from .step.atoms_insert_triton import insert_atoms_triton

        store = torch.zeros(n, capacity, W, dtype=torch.int32)
        loss, alpha = torch.zeros(n, capacity, dtype=f64), torch.zeros(n, capacity, dtype=f64)
        count, valid = torch.ones(n, dtype=torch.long), torch.ones(n, dtype=torch.bool)
        insert_atoms_triton(store, loss, alpha, count, valid, torch.arange(B), torch.zeros(B, W, dtype=torch.long),
                            torch.zeros(B, dtype=f64), torch.zeros(B, capacity, dtype=f64), capacity, keep_active)
    return run


def _select_atoms(B, n, C, W, cached, away):
    def run():
        from .step.atoms_select_triton import select_atoms_triton

        z = lambda *shape: torch.zeros(*shape, dtype=f64)  # noqa: E731
        select_atoms_triton(z(B, C), torch.ones(n, dtype=torch.long), torch.zeros(B, C, W, dtype=torch.long),
                            z(B, C), z(B, C), torch.arange(B), z(B), z(B), z(n), torch.zeros(B, W, dtype=torch.long),
                            z(B), z(B), n, 0.25 if cached else None, 1e-3,
                            torch.zeros((), dtype=torch.long) if cached else None, away)
    return run


def _block_step(B, n, m, C, step):
    def run():
        from .step.block_step_triton import apply_block_step_triton

        z, ell = torch.zeros(n, m, dtype=f64), torch.zeros(n, dtype=f64)
        rows, row = torch.zeros(B, m, dtype=f64), torch.zeros(B, dtype=f64)
        slots = torch.zeros(B, dtype=torch.long)
        duals = () if C is None else (torch.zeros(n, C, dtype=f64), torch.ones(n, dtype=torch.bool), step, slots,
                                      None if step == "fw" else slots, row, slots if step == "away" else None)
        apply_block_step_triton(z, ell, torch.arange(B), rows, row, row, rows, row, *duals)
    return run


def _box_qp(B):
    def run():
        from .step.box_qp_triton import projected_newton_triton

        c = torch.ones(B, dtype=f64)
        projected_newton_triton(c, torch.eye(B, dtype=f64), c, 1, 1e-12, 100.0)
    return run


def _sampling(n, gap, counter_on_device):
    def run():
        from .step.sampling_triton import sampling_keys_triton

        gaps = torch.ones(n, dtype=f64) if gap else None
        sampling_keys_triton(gaps, gaps, 0, torch.zeros((), dtype=torch.long) if counter_on_device else 3, n, "cpu")
    return run


def _simplex(B, M, dtype, masked):
    def run():
        from .projections.simplex_triton import project_simplex_triton

        v = torch.randn(B, M, dtype=dtype)
        project_simplex_triton(v, torch.ones(B, M, dtype=torch.bool) if masked else None)
    return run


def _box(B, n, dtype, d2):
    def run():
        from .projections.box_equality_triton import project_box_equality_triton

        m = torch.randn(B, n, dtype=dtype)
        project_box_equality_triton(m, 0.0, 1.0, torch.ones(n, dtype=dtype), 1.0,
                                    torch.ones(B, n, dtype=dtype) if d2 else None)
    return run


def _tree(B, K, dtype, shared):
    def run():
        from .tree.tree_triton import tree_max_sum_triton

        parents = (-1, 0, 0, 1, 1, 2)
        unary = torch.randn(B, len(parents), K, dtype=dtype)
        pairwise = torch.randn(*(() if shared else (B,)), len(parents) - 1, K, K, dtype=dtype)
        tree_max_sum_triton(unary, pairwise, parents)
    return run


# The 26-node kinematic tree of the pose data (`torchssvm.data.pose.POSE_PARENTS`, -1: the root), written out here
# because the kernels sit below the data; a test checks that the two agree.
_POSE_PARENTS = (-1, 0, 1, 0, 3, 4, 5, 6, 0, 8, 9, 10, 11, 3, 13, 14, 15, 16, 17, 8, 19, 20, 21, 22, 23, 0)


def _spatial(B, side, dtype):
    def run():
        from .tree.tree_triton import spatial_tree_max_sum_triton

        E = len(_POSE_PARENTS) - 1
        unary = torch.randn(B, len(_POSE_PARENTS), side * side, dtype=dtype)
        weights = torch.tensor([0.0, 0.1, 0.0, 0.1], dtype=dtype).expand(E, 4)
        spatial_tree_max_sum_triton(unary, weights, torch.zeros(E, 2, dtype=dtype), _POSE_PARENTS, side, side)
    return run


f32, f64 = torch.float32, torch.float64
WORKLOADS: Dict[str, Callable[[], None]] = {
    "viterbi OCR (32,14,26)": _viterbi(32, 14, 26, f32),
    "viterbi CoNLL (512,100,45) float64": _viterbi(512, 100, 45, f64),
    "viterbi per-position, no start/end (8,20,26)": _viterbi(8, 20, 26, f32, per_position=True, start_end=False),
    "viterbi K=1 (4,10,1)": _viterbi(4, 10, 1, f32),
    "viterbi grid K=300 (8,50,300)": _viterbi(8, 50, 300, f32, kernel="grid"),
    "viterbi grid K=300 float64": _viterbi(8, 50, 300, f64, kernel="grid"),
    "viterbi grid K=1024 (8,50,1024)": _viterbi(8, 50, 1024, f32, kernel="grid"),
    "viterbi grid per-position, no start/end (4,10,130)": _viterbi(4, 10, 130, f32, kernel="grid", per_position=True,
                                                                   start_end=False),
    "viterbi grid by steps K=300 (8,50,300)": _viterbi(8, 50, 300, f32, kernel="grid-steps"),
    "viterbi legacy OCR (32,14,26)": _viterbi(32, 14, 26, f32, kernel="legacy"),
    "viterbi legacy (512,100,45) float64": _viterbi(512, 100, 45, f64, kernel="legacy"),
    "viterbi legacy tiled K=300 (8,50,300)": _viterbi(8, 50, 300, f32, kernel="legacy"),
    "viterbi legacy tiled K=300 float64": _viterbi(8, 50, 300, f64, kernel="legacy"),
    "viterbi guarded OCR (32,14,26)": _viterbi(32, 14, 26, f32, guarded=True),
    "viterbi guarded per-position float64 (8,20,26)": _viterbi(8, 20, 26, f64, per_position=True, guarded=True),
    "viterbi guarded grid K=1024 (8,50,1024)": _viterbi(8, 50, 1024, f32, kernel="grid", guarded=True),
    "viterbi guarded grid by steps K=300 (8,50,300)": _viterbi(8, 50, 300, f32, kernel="grid-steps", guarded=True),
    "viterbi guarded legacy OCR (32,14,26)": _viterbi(32, 14, 26, f32, kernel="legacy", guarded=True),
    "viterbi guarded legacy tiled K=300 (8,50,300)": _viterbi(8, 50, 300, f32, kernel="legacy", guarded=True),
    "slack chain OCR (32,14,26)": _slack(32, 14, 26, f32),
    "slack chain (8,100,45) float64": _slack(8, 100, 45, f64),
    "slack chain per-position (4,20,26)": _slack(4, 20, 26, f32, per_position=True),
    "slack chain guarded margin (32,14,26)": _slack(32, 14, 26, f32, margin=2.0 ** -3),
    "chain atom scores OCR (64,10,14,26) float64": _chain_score(64, 10, 14, 26, f64),
    "chain atom scores CoNLL (64,10,100,45), no start/end": _chain_score(64, 10, 100, 45, f32, start_end=False),
    "chain inner OCR (64,14,26) float64": _chain_inner(64, 14, 26, f64),
    "chain inner CoNLL (64,78,22), no start/end": _chain_inner(64, 78, 22, f32, start_end=False),
    "chain hinge CoNLL (512,100,45), no start/end": _chain_hinge(512, 100, 45, f32, start_end=False),
    "chain hinge OCR (32,14,26) bfloat16 unary, class and loss weights": _chain_hinge(
        32, 14, 26, f32, class_weights=True, lw_tensor=True, unary_dtype=torch.bfloat16),
    "chain hinge per-position (8,20,26) float64": _chain_hinge(8, 20, 26, f64, per_position=True),
    "chain hinge K=1024 (8,50,1024)": _chain_hinge(8, 50, 1024, f32, start_end=False),
    "chain hinge T=1, B=1 (1,1,26)": _chain_hinge(1, 1, 26, f32),
    "chain marginals OCR (64,14,26) pair": _chain_marginals(64, 14, 26, True),
    "chain marginals CoNLL (64,100,45)": _chain_marginals(64, 100, 45, False),
    "atom insertion OCR (64 of 6251, cache 10, width 14), pairwise": _insert_atoms(64, 6251, 10, 14, True),
    "atom insertion CoNLL (64 of 8936, cache 50, width 78), FW": _insert_atoms(64, 8936, 50, 78, False),
    "atom selection OCR (64 of 6251, cache 10, width 14), pairwise": _select_atoms(64, 6251, 10, 14, True, True),
    "atom selection CoNLL (64 of 8936, no cache, width 78), away": _select_atoms(64, 8936, 1, 78, False, True),
    "atom selection (64, cache 50, width 14), FW": _select_atoms(64, 6251, 50, 14, True, False),
    "block step OCR (64 of 6251, m 1092), FW, no atoms": _block_step(64, 6251, 1092, None, "fw"),
    "block step OCR (64 of 6251, m 1092, cache 10), FW": _block_step(64, 6251, 1092, 10, "fw"),
    "block step OCR (64 of 6251, m 1092, cache 10), pairwise": _block_step(64, 6251, 1092, 10, "pairwise"),
    "block step CoNLL (256 of 8936, m 2244, cache 50), away": _block_step(256, 8936, 2244, 50, "away"),
    "sampler keys, uniform, n=6251": _sampling(6251, False, False),
    "sampler keys, gap, n=6251, the draw on the device (a CUDA graph)": _sampling(6251, True, True),
    "box QP B=300 (one iteration)": _box_qp(300),
    "box QP B=4096 (one iteration)": _box_qp(4096),
    "simplex M=26": _simplex(64, 26, f32, False),
    "simplex M=26 masked float64": _simplex(64, 26, f64, True),
    "simplex M=16384 (largest row)": _simplex(4, 1 << 14, f32, False),
    "simplex M=16384 masked float64": _simplex(4, 1 << 14, f64, True),
    "box-equality n=26": _box(64, 26, f32, False),
    "box-equality n=26 float64 with d2": _box(64, 26, f64, True),
    "box-equality n=16384 (largest row)": _box(4, 1 << 14, f32, False),
    "box-equality n=16384 float64 with d2": _box(4, 1 << 14, f64, True),
    "tree K=3 shared": _tree(4, 3, f32, True),
    "tree K=70 per-example": _tree(4, 70, f32, False),
    "tree K=300 shared float64": _tree(2, 300, f64, True),
    "pose tree 32x32": _spatial(2, 32, f32),
    "pose tree 64x64 float64": _spatial(1, 64, f64),
    "pose tree 128x128": _spatial(1, 128, f32),
}


def record_workloads(names: Sequence[str]) -> Dict[Launch, Tuple[List[str], List[Tuple[int, int, int]]]]:
    """Run the named workloads under the recorder: each distinct launch with the workloads and grids that
    produced it."""
    seen: Dict[Launch, Tuple[List[str], List[Tuple[int, int, int]]]] = {}
    for name in names:
        with recording() as launches:
            WORKLOADS[name]()
        for launch, grid in launches:
            work, grids = seen.setdefault(launch, ([], []))
            if name not in work:
                work.append(name)
            if grid not in grids:
                grids.append(grid)
    return seen


def package_kernels() -> List[Tuple[str, str]]:
    """``(module, kernel)`` for every launchable `@triton.jit` function of this package (names ending in
    ``_kernel``; the others are device functions inlined into them)."""
    from triton.runtime.jit import JITFunction

    found = []
    for mod_name in TRITON_MODULES:
        mod = importlib.import_module(f"{__package__}.{mod_name}")
        for name, obj in vars(mod).items():
            if isinstance(obj, JITFunction) and name.endswith("_kernel"):
                found.append((mod_name, name))
    return sorted(found)


def _tool(name: str) -> str:
    import triton

    path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{name} is not in this Triton install ({path}); a Linux x86-64 wheel ships it")
    return path


def resource_usage(cubin: bytes) -> Dict[str, int]:
    """``REG``, ``STACK`` (bytes of stack frame per thread), ``SHARED`` (static) and ``LOCAL`` of the single
    function in ``cubin``, from ``cuobjdump --dump-resource-usage``."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "kernel.cubin")
        with open(path, "wb") as fh:
            fh.write(cubin)
        text = subprocess.run([_tool("cuobjdump"), "--dump-resource-usage", path], capture_output=True, text=True,
                              check=True).stdout
    usage = {k: int(v) for k, v in re.findall(r"\b(REG|STACK|SHARED|LOCAL):(\d+)", text)}
    if "REG" not in usage:
        raise RuntimeError(f"could not read the resource usage from cuobjdump:\n{text}")
    return usage


def launch_problems(registers: int, num_warps: int, shared_bytes: int, arch: int,
                    grids: Sequence[Tuple[int, int, int]]) -> List[str]:
    """The launch limits a kernel with this resource use breaks on ``sm_<arch>`` (empty: it loads)."""
    problems = []
    threads = 32 * num_warps
    if registers > MAX_REGS_PER_THREAD:
        problems.append(f"{registers} registers per thread > {MAX_REGS_PER_THREAD}")
    if registers * threads > MAX_REGS_PER_BLOCK:
        problems.append(f"{registers} registers x {threads} threads > {MAX_REGS_PER_BLOCK} per block")
    limit = MAX_SHARED.get(arch)
    if limit is None:
        problems.append(f"no shared-memory limit known for sm_{arch} (known: {sorted(MAX_SHARED)})")
    elif shared_bytes > limit:
        problems.append(f"{shared_bytes} bytes of shared memory > {limit} on sm_{arch}")
    for grid in grids:
        if any(g > m for g, m in zip(grid, MAX_GRID)):
            problems.append(f"grid {grid} exceeds {MAX_GRID}")
    return problems


def compile_launch(launch: Launch, work: List[str], grids: List[Tuple[int, int, int]], arch: int,
                   kernel=None) -> Compiled:
    """Compile one launch for ``sm_<arch>`` and check it against the launch limits. ``kernel``: the
    `JITFunction`, by default looked up from ``launch`` in this package."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if kernel is None:
        kernel = getattr(importlib.import_module(f"{__package__}.{launch.module}"), launch.kernel)
    res = Compiled(launch, work, grids, arch, ok=False)
    options = dict(launch.options)
    t0 = time.perf_counter()
    try:
        src = ASTSource(fn=kernel, signature=dict(launch.signature), constexprs=dict(launch.constexprs))
        binary = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)
        usage = resource_usage(binary.asm["cubin"])
    except Exception as exc:  # noqa: BLE001 - any compiler failure is the finding
        res.error = f"{type(exc).__name__}: {exc}"
        return res
    finally:
        res.seconds = time.perf_counter() - t0
    res.num_warps = binary.metadata.num_warps
    res.registers, res.stack_bytes = usage["REG"], usage.get("STACK", 0) + usage.get("LOCAL", 0)
    res.shared_bytes = usage.get("SHARED", 0) + binary.metadata.shared
    res.problems = launch_problems(res.registers, res.num_warps, res.shared_bytes, arch, grids)
    res.ok = not res.problems
    return res


def _compile_task(task) -> Compiled:
    """`compile_launch` of one ``(launch, work, grids, arch)``: the unit a worker process takes."""
    return compile_launch(*task)


def _usable_cpus() -> int:
    """The CPUs this process may run on (its affinity where the platform has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def run_check(names: Sequence[str], archs: Sequence[int], jobs: int = 1) -> Tuple[List[Compiled], List[str]]:
    """Record ``names``, compile every launch for every arch; returns the results (in launch order, whatever
    ``jobs``) and what the check itself misses: package kernels that no workload launches or that have no
    `OUTPUTS` entry. ``jobs > 1`` compiles in that many worker processes: Triton's compile is single-threaded
    Python and LLVM, so the check's time divides by about the number of cores (about 100 s of compiling on
    one core of a 2.5 GHz Xeon for sm_80 and sm_90)."""
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, got {jobs}")
    recorded = record_workloads(names)
    tasks = [(launch, work, grids, arch) for launch, (work, grids) in recorded.items() for arch in archs]
    if jobs > 1 and len(tasks) > 1:
        import concurrent.futures
        import multiprocessing

        # spawn, not fork: the parent has started torch's OpenMP pool, which a forked child cannot use
        with concurrent.futures.ProcessPoolExecutor(min(jobs, len(tasks)),
                                                    mp_context=multiprocessing.get_context("spawn")) as pool:
            results = list(pool.map(_compile_task, tasks))
    else:
        results = [_compile_task(task) for task in tasks]
    launched = {(launch.module, launch.kernel) for launch in recorded}
    kernels = package_kernels()
    gaps = [f"{m}.{k}: no workload launches it; add one to WORKLOADS" for m, k in kernels if (m, k) not in launched]
    gaps += [f"{m}.{k}: no OUTPUTS entry" for m, k in kernels if k not in OUTPUTS]
    return results, gaps


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", type=int, nargs="+", default=[80, 90],
                        help="compute capabilities to compile for (default: 80 90)")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--jobs", type=int, default=_usable_cpus(),
                        help="worker processes compiling at once (default: the usable CPUs, here %(default)s)")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    names = tuple(WORKLOADS)
    results, gaps = run_check(names, args.arch, args.jobs)
    for r in results:
        what = f"sm_{r.arch} {r.launch.kernel} [{r.launch.describe()}]"
        if r.error:
            print(f"FAIL  {what}: {r.error}")
        else:
            flag = "ok  " if r.ok else "FAIL"
            print(f"{flag}  {what}: {r.registers} regs, {r.stack_bytes} B stack, {r.shared_bytes} B shared, "
                  f"{r.num_warps} warps ({r.seconds:.1f} s){'; ' + '; '.join(r.problems) if r.problems else ''}")
    for gap in gaps:
        print(f"FAIL  {gap}")
    if args.json:
        import triton

        with open(args.json, "w") as fh:
            json.dump({"triton": triton.__version__, "torch": torch.__version__, "archs": list(args.arch),
                       "workloads": list(names), "kernels": [".".join(k) for k in package_kernels()], "gaps": gaps,
                       "results": [r.to_json() for r in results]}, fh, indent=1, default=str)
    failed = sum(not r.ok for r in results) + len(gaps)
    print(f"{len(results)} compilations, {failed} failures")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
