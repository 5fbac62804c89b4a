"""How much a busy machine slows the library down: an OCR-small mini-batch BCFW pass and a chain
`StructuredHingeLoss` forward + backward, with 0, 1, 2 and 4 busy background processes (pure-Python spin loops),
at torch's default thread count and at ``torch.set_num_threads(1)``.

Each round starts the busy processes of each level in turn, times every (setting, workload) pair under them
(interleaved), then kills them; the table gives each pair's median time without busy processes and its slowdown
under each level (median over rounds), next to the oversubscription ``(busy + threads) / cores``. The machine's
own load (other users) is recorded as ``os.getloadavg()`` per level. See docs/benchmarks/contention.md.

    python scripts/bench_contention.py                    # about 1-3 minutes on 2 cores
    OMP_WAIT_POLICY=passive python scripts/bench_contention.py --busy 0,4
    python scripts/bench_contention.py --batch-size 8 --compare-scope   # small steps, with and without
"""

from __future__ import annotations

import argparse
import atexit
import copy
import json
import os
import signal
import statistics
import subprocess
import sys
import time

import torch
from _bench_machine import code_version, cpu_description

# A busy process: spins until killed, or until its parent is gone (a crashed benchmark leaves no spinners behind).
SPIN = ("import os\np = os.getppid()\nwhile os.getppid() == p:\n    for _ in range(200000):\n        pass\n")
_children: list = []


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the parent dies (Linux), a second guard besides the spin's check."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def start_busy(k: int) -> list:
    procs = [subprocess.Popen([sys.executable, "-c", SPIN], preexec_fn=_die_with_parent) for _ in range(k)]
    _children.extend(procs)
    return procs


def stop_busy(procs) -> None:
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()
        if p in _children:
            _children.remove(p)


atexit.register(lambda: stop_busy(list(_children)))


def workloads(batch_size: int, loss_calls: int, names=("bcfw", "loss")):
    """``{name: (setup, run, reset)}`` of the workloads ``names`` (``bcfw``, ``loss``, ``nslack``): ``setup()``
    builds the state once per setting, ``run(state)`` is the timed call, ``reset(state)`` (or None), called before
    each timed call and not timed, puts back the state the first timed call started from: an n-slack pass costs
    more as its working sets grow, so each timed pass is the same second pass, whatever the level it runs beside."""
    import torchssvm as ts
    from torchssvm.structures.chain import ChainPotentials

    train = ts.data.ocr("train", "small")

    def bcfw_setup():
        model = ts.LinearChainModel(train.num_features, train.num_labels, sparse=train.sparse)
        solver = ts.optim.BCFW(model, train, lam=1e-2, seed=0, batch_size=batch_size)
        solver.step()  # compiles / loads the numba kernels, warms the caches
        return solver

    g = torch.Generator().manual_seed(0)
    B, T, K = 64, 10, train.num_labels  # a batch of OCR-like words

    def loss_setup():
        unary = torch.randn(B, T, K, dtype=torch.float64, generator=g, requires_grad=True)
        transition = torch.randn(K, K, dtype=torch.float64, generator=g, requires_grad=True)
        target = torch.randint(0, K, (B, T), generator=g)
        lengths = torch.randint(3, T + 1, (B,), generator=g)
        criterion = ts.StructuredHingeLoss(ts.Chain(K))
        state = (criterion, ChainPotentials(unary, transition, None, None), target, lengths)
        loss_run(state)
        return state

    def loss_run(state):
        criterion, pot, target, lengths = state
        for _ in range(loss_calls):
            criterion(pot, target, lengths).backward()

    def nslack_setup():
        model = ts.LinearChainModel(train.num_features, train.num_labels, sparse=train.sparse)
        solver = ts.optim.NSlackCuttingPlane(model, train, lam=1e-2, seed=0)
        solver.step()
        return solver, copy.deepcopy(solver.state_dict())

    every = {"bcfw": (f"BCFW pass (OCR-small, batch {batch_size})", bcfw_setup, lambda s: s.step(), None),
             "loss": (f"loss fwd+bwd x{loss_calls} (B={B}, T={T}, K={K})", loss_setup, loss_run, None),
             "nslack": ("n-slack pass (OCR-small, its second)", nslack_setup, lambda s: s[0].step(),
                        lambda s: s[0].load_state_dict(s[1]))}
    unknown = sorted(set(names) - set(every))
    if unknown:
        raise SystemExit(f"--workloads: unknown {unknown}; choose from {sorted(every)}")
    return {every[n][0]: every[n][1:] for n in names}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--busy", default="0,1,2,4", help="busy background processes per level (0 first)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--loss-calls", type=int, default=20)
    ap.add_argument("--workloads", default="bcfw,loss", help="comma-separated: bcfw, loss, nslack")
    ap.add_argument("--json", help="also write the measurements here")
    ap.add_argument("--compare-scope", "--compare-blas-scope", dest="compare_scope", action="store_true",
                    help="also the default threads with small steps on the thread teams (torchssvm._threads off)")
    args = ap.parse_args()
    levels = [int(x) for x in args.busy.split(",")]
    if levels[0] != 0:
        levels = [0] + levels
    cores = os.cpu_count() or 1
    default_threads = torch.get_num_threads()
    from torchssvm import _threads

    scope = _threads.SMALL_STEP_BLOCKS
    # name: (torch threads, the blocks up to which a step's products run on one MKL thread)
    settings = {f"default ({default_threads} threads)": (default_threads, scope), "set_num_threads(1)": (1, scope)}
    if args.compare_scope:
        settings[f"default, small steps on the teams ({default_threads} threads)"] = (default_threads, 0)

    work = workloads(args.batch_size, args.loss_calls, args.workloads.split(","))
    states = {}
    for s, (n, blocks) in settings.items():
        torch.set_num_threads(n)
        _threads.SMALL_STEP_BLOCKS = blocks
        for w, (setup, _, _) in work.items():
            states[s, w] = setup()
    times = {(s, w, k): [] for s in settings for w in work for k in levels}
    load = {k: [] for k in levels}
    changed = []
    t_start = time.time()
    for _ in range(args.rounds):
        for k in levels:
            procs = start_busy(k)
            try:
                time.sleep(0.3)
                load[k].append(os.getloadavg()[0])
                for s, (n, blocks) in settings.items():
                    for w, (_, run, reset) in work.items():
                        torch.set_num_threads(n)
                        _threads.SMALL_STEP_BLOCKS = blocks
                        if reset is not None:
                            reset(states[s, w])
                        t = time.perf_counter()
                        run(states[s, w])
                        times[s, w, k].append(time.perf_counter() - t)
                        if torch.get_num_threads() != n:
                            changed.append((s, w, torch.get_num_threads()))
            finally:
                stop_busy(procs)
    elapsed = time.time() - t_start

    env = {v: os.environ[v] for v in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "MKL_NUM_THREADS",
                                      "NUMBA_NUM_THREADS", "NUMBA_THREADING_LAYER") if v in os.environ}
    import numba

    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    try:
        layer = numba.threading_layer()
    except ValueError:  # no parallel kernel ran (a batch too small for one): the layer never started
        layer = "not started"
    head = (f"machine: {cpu_description()}; torch {torch.__version__}, numba {numba.__version__} "
            f"(layer {layer}); commit {code_version()}; {when}\n"
            f"env: {env or 'no thread variables set'}; {args.rounds} rounds, {elapsed:.0f} s; "
            f"load average (1 min) per level: " + ", ".join(f"{k} busy: {statistics.median(v):.1f}"
                                                           for k, v in load.items()))
    print(head)
    cols = " | ".join(f"{k} busy" for k in levels[1:])
    print(f"\n| setting | workload | 0 busy (s) | {cols} |")
    print("|" + "---|" * (3 + len(levels) - 1))
    rows = []
    for s, (n, _) in settings.items():
        for w in work:
            base = statistics.median(times[s, w, 0])
            cells = []
            for k in levels[1:]:
                r = statistics.median(times[s, w, k]) / base
                cells.append(f"{r:.1f}x (over {(k + n) / cores:.1f})")
                rows.append({"setting": s, "threads": n, "workload": w, "busy": k, "slowdown": r,
                             "oversubscription": (k + n) / cores})
            print(f"| {s} | {w} | {base:.3f} | " + " | ".join(cells) + " |")
    print("\nslowdown: median time with k busy processes / median time with none, in the same run; "
          "'over': (busy + threads) / cores.")
    (s_def, (n_def, _)), (s_one, _) = list(settings.items())[:2]
    if n_def != 1:
        print(f"\n{s_def} / {s_one}, time ratio at each level (same rounds):\n")
        print("| workload | " + " | ".join(f"{k} busy" for k in levels) + " |")
        print("|" + "---|" * (1 + len(levels)))
        med = {key: statistics.median(v) for key, v in times.items()}
        for w in work:
            print(f"| {w} | " + " | ".join(f"{med[s_def, w, k] / med[s_one, w, k]:.1f}x" for k in levels) + " |")
    if changed:
        print(f"WARNING: a call changed torch's thread count: {changed[:3]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"head": head, "rows": rows, "times": {"|".join(map(str, key)): v for key, v in times.items()},
                       "load": load}, f, indent=1)


if __name__ == "__main__":
    main()
