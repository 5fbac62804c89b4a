"""Block-coordinate Frank-Wolfe for the SSVM dual, with the variants of "Minding the gaps".

Osokin, Alayrac, Lukasewitz, Dokania, Lacoste-Julien, ICML 2016. Every combination of

- sampling: ``"uniform"`` (Alg. 1) or ``"gap"`` (Alg. 2: ``P(i) ~ g_i`` with stale estimates, an exact
  refresh every ``gap_check_every`` passes counted as a pass, negative estimates clamped to 0, and the
  never-seen blocks visited first in a random order);
- step: ``"fw"`` (Alg. 1), ``"pairwise"`` (BCPFW, Alg. 3) or ``"away"`` (BCAFW, Alg. 4, with ``w_d`` of
  Osokin et al., 2016);
- a cache of labellings per block (Alg. 5: hit when ``g_hat >= max(F g_i, nu/n g_global)``; eviction of
  the lowest-scoring inactive atom, never an active atom under pairwise / away steps);
- box constraints ``lower <= w <= upper`` (App. H, Alg. 9: the oracle runs at ``w = clip(v)``);
- mini-batches of ``batch_size`` distinct blocks with one batched oracle call and the exact coordinated
  box-QP step of docs/design.md ("The exact mini-batch step") (``batch_size=1`` is the paper's algorithm step for step).
"""

from __future__ import annotations

import math
import numbers
import time

import torch

from ..._device import host_to_device
from ..._threads import one_thread, small_step
from ...kernels import apply_block_step, select_atoms
from ...kernels.step.atoms_select_torch import away_atoms_torch, cache_test_torch, used_slots
from .._state import checked_generator_state, checked_scalars, checked_tensor, require_keys
from ..dual_solver import DualSolver
from .atoms import AtomStore
from .box_qp import METHODS as QP_METHODS
from .box_qp import box_qp
from .device_sampling import sample_gap, sample_uniform

SAMPLINGS = ("uniform", "gap")
STEPS = ("fw", "pairwise", "away")
# The smallest batch for which a device problem takes the host-free step by default: where it became the faster
# step on an H200 (docs/benchmarks/host_free_step.md).
HOST_FREE_MIN_BATCH = 512


class BCFW(DualSolver):
    """``solver = BCFW(model, dataset, lam=1e-3, sampling="gap", step="pairwise", cache_size=50)``;
    ``solver.step()`` runs one pass (n block visits) and returns a report; `fit` loops.

    Args:
        model, dataset, lam, box, writer, structure, backend, rescaling: see `DualSolver`.
        sampling: ``"uniform"`` or ``"gap"``.
        step: ``"fw"``, ``"pairwise"`` or ``"away"``.
        cache_size: labellings cached per block (0: no cache; the paper's experiments use 50).
        cache_factor, cache_nu: F and nu of the cache-hit test (defaults of the paper: 0.25, 0.01).
        gap_check_every: an exact gap pass (n oracle calls, counted as one pass) after every this many
            passes; it refreshes the gap estimates and certifies the gap. 0 disables it (the paper's
            "Gap Inf", which does not converge with gap sampling).
        batch_size: blocks per update (one batched oracle call, coordinated step).
        qp_method: solver of the mini-batch box QP (`box_qp`): ``"newton"`` (projected Newton to the QP's optimum:
            on the host with numba, for a device's tensors up to B = 256; without numba in numpy up to B = 64;
            else on the tensors' device) or ``"sweeps"`` (coordinate sweeps on the host).
        qp_max_iter: Newton iterations or coordinate sweeps of the mini-batch QP (at most; the host-free step runs
            exactly this many, an iterate frozen once converged). Default 50, and 10 for the host-free step, where
            Newton needs 2 to 4 on the QPs we recorded; a QP still short of the tolerance after them is counted in
            the reports' ``qp_unconverged`` (its step is still a descent step: the certificate is unaffected).
        seed: seed of the solver's own random generator (sampling).
        host_free: run each step without the host reading anything from the device (default: on any device but
            the CPU from ``batch_size >= 512``, where it is the faster step; below, the host's compiled QP beats the
            device's iteration of many small kernels: ``docs/benchmarks/host_free_step.md``). Blocks are drawn on
            the device (`device_sampling`: a counter-based generator, Gumbel-top-k for gap sampling, the law of
            the host's draw without replacement), the chain problems pad every batch to the data set's longest
            sequence (static shapes), the cache's counts stay on the device (the store
            keeps room for the steps until the next read, which comes with the pass's report), and the box QP is
            solved on the device (`box_qp(..., sync_free=True)`: ``qp_max_iter`` projected Newton iterations, an
            iterate frozen once it meets the tolerance; on CUDA four Triton kernels, a product and a solve per
            iteration). On the CPU it is a way to run the device's algorithm; ``False`` keeps the host's sampler
            and QP (the CPU's default, bitwise as before).
        cuda_graph: replay each host-free step of a given size as one CUDA graph (captured after an eager step
            of that size, again after the store grows, a state is loaded or an exact pass moves the cache's
            floor; eager, with a warning, if the capture fails), for the problems whose step launches no copy
            from the host (``problem.graph_safe``: the chains). Default: on for the host-free step of such a
            problem on CUDA (on an H200 at B = 256 the replayed step took half the eager one's time, the GPU busy
            79% of a pass against 51%; ``tests/test_gpu.py`` compares the two there and, on the simulated device,
            ``tests/test_bcfw_host_free.py``); ``False`` launches every kernel from Python.

    Reports (`step`): ``primal``, ``dual``, ``gap`` and ``gap_exact`` (True after an exact pass, else
    ``gap`` is the sum of the stale block-gap estimates and ``primal = dual + gap``), ``passes``
    (oracle calls / n, the papers' effective passes; on a device the oracle decodes every block of a mini-batch
    and the cache hits discard its answer, so ``oracle_calls`` counts the calls the algorithm makes, the
    misses), ``oracle_calls``, ``cache_hits``,
    ``cache_hit_rate``, ``time`` (solver seconds).

    The initial global gap of the cache test is the exact gap at the start, ``(1/n) sum_i max_y L_i(y)``
    (free: no oracle call), between the paper's +inf (no hit before the first exact pass) and the
    reference code's constant 1 (Osokin et al., 2016).
    """

    tag = "bcfw"

    def __init__(self, model, dataset=None, lam: float = 1e-2, *, sampling: str = "uniform", step: str = "fw",
                 cache_size: int = 0, cache_factor: float = 0.25, cache_nu: float = 0.01,
                 gap_check_every: int = 10, batch_size: int = 1, qp_method: str = "newton",
                 qp_max_iter: int | None = None,
                 box=None, seed: int = 0, host_free: bool | None = None, cuda_graph: bool | None = None,
                 writer=None, structure=None, backend: str = "auto", rescaling: str = "margin"):
        if sampling not in SAMPLINGS:
            raise ValueError(f"sampling must be one of {SAMPLINGS}, got {sampling!r}")
        if step not in STEPS:
            raise ValueError(f"step must be one of {STEPS}, got {step!r}")
        for name, value in (("cache_size", cache_size), ("gap_check_every", gap_check_every)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        if cache_size == 1:
            raise ValueError("cache_size must be 0 (no cache) or >= 2 (the truth takes one slot)")
        if qp_method not in QP_METHODS:
            raise ValueError(f"qp_method must be one of {QP_METHODS}, got {qp_method!r}")
        for name, value in (("batch_size", batch_size), ("qp_max_iter", 1 if qp_max_iter is None else qp_max_iter)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        for name, value in (("cache_factor", cache_factor), ("cache_nu", cache_nu)):
            if not (isinstance(value, (int, float)) and value >= 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        super().__init__(model, dataset, lam, box=box, writer=writer, structure=structure, backend=backend,
                         rescaling=rescaling)
        # the step's bookkeeping kernels (the atoms, the end of the step) have torch and Triton forms only: "numba"
        # (the distance transforms of tree problems) leaves them to "auto"
        self.backend = backend if backend in ("torch", "triton") else "auto"
        if batch_size > self.n:
            raise ValueError(f"batch_size must be <= n = {self.n}, got {batch_size}")
        self.sampling, self.step_type = sampling, step
        self.cache_size, self.cache_factor, self.cache_nu = cache_size, float(cache_factor), float(cache_nu)
        self.gap_check_every, self.batch_size = gap_check_every, batch_size
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
            raise TypeError(f"seed must be an int, got {type(seed).__name__} {seed!r}")
        self.seed = int(seed)
        self.generator = torch.Generator().manual_seed(self.seed)
        dev = self.problem.device
        if host_free is None:
            host_free = dev.type != "cpu" and batch_size >= HOST_FREE_MIN_BATCH
        self.host_free = bool(host_free)
        if cuda_graph and not (self.host_free and dev.type == "cuda"):
            raise ValueError("cuda_graph needs host_free=True and a problem on a CUDA device")
        if cuda_graph is None:  # replay where a capture is known to work (tests/test_gpu.py on an H200)
            cuda_graph = self.host_free and dev.type == "cuda" and getattr(self.problem, "graph_safe", False)
        if cuda_graph and not getattr(self.problem, "graph_safe", False):
            raise ValueError(f"cuda_graph: the host-free step of {type(self.problem).__name__} is not known to "
                             "capture (graph_safe: the chain problems)")
        self.cuda_graph = bool(cuda_graph)
        if self.host_free and qp_method == "sweeps":
            raise ValueError("qp_method='sweeps' solves the QP on the host: use it with host_free=False")
        self.qp_method = qp_method
        self.qp_max_iter = qp_max_iter if qp_max_iter is not None else 10 if self.host_free else 50
        # host-free QPs that ended on qp_max_iter short of the tolerance, counted on the device
        self._qp_unconverged = torch.zeros((), dtype=torch.long, device=dev) if self.host_free else None
        self.qp_unconverged = 0
        p = self.problem
        self.atoms = AtomStore(p.truth, cache_size, self.backend) if (cache_size > 0 or step != "fw") else None
        self._away_min_mass = math.sqrt(torch.finfo(self.z.dtype).eps)  # away steps: see _update
        self.global_gap = float(p.max_loss(torch.arange(self.n, device=p.device)).sum()) / self.n
        self.first_visit = torch.randperm(self.n, generator=self.generator)  # Alg. 2's g_i = inf blocks
        self.first_visit_pos = 0
        self.draws = 0  # host-free sampling: draws taken from the counter-based generator
        if self.host_free:
            self._first_rank = self._first_visit_ranks().to(p.device)
            # the store's slots are known to suffice for this many more steps (pairwise / away steps add at most
            # one atom per block and step); refreshed by a read of the counts
            self._room = 0
            self._select_params = torch.zeros(2, dtype=torch.float64, device=p.device)
            self._select_values = None
        self._graphs = None  # {B: (signature, CUDA graph)} of the captured steps
        self._graph_warm = {}  # {B: the signature of its last eager step}
        self._capture_stream = None  # a side stream of the problem's device for the captures
        self.graph_captures = 0
        self.cache_hits = 0
        self.visits = 0
        # On a device the cache test runs without the host: the oracle decodes the whole mini-batch and the misses'
        # answers are taken (a GPU decodes 64 sequences in the time of 7), the misses are counted on the device
        # and read with the pass's report. On the CPU the oracle decodes the misses only.
        on_device = p.device.type != "cpu" or self.host_free
        self._misses = torch.zeros((), dtype=torch.long, device=p.device) if on_device else None
        self._visits_unread = 0

    # -- sampling -------------------------------------------------------------------------------
    def _sample(self, B: int) -> torch.Tensor:
        n, gen = self.n, self.generator
        if self.sampling == "uniform":
            if B == 1:
                return torch.randint(n, (1,), generator=gen)
            return torch.randperm(n, generator=gen)[:B]
        gaps = self.block_gaps.cpu()  # on a device, the one read of gap sampling
        picked = []
        while len(picked) < B and self.first_visit_pos < n:
            j = int(self.first_visit[self.first_visit_pos])
            self.first_visit_pos += 1
            if math.isinf(float(gaps[j])):
                picked.append(j)
        if len(picked) < B:
            weights = gaps.clamp_min(0)
            weights[torch.isinf(weights)] = 0.0  # only unseen blocks already taken above remain inf
            if picked:
                weights[picked] = 0.0
            need = B - len(picked)
            positive = int((weights > 0).sum())
            if positive >= need:
                picked += torch.multinomial(weights, need, replacement=False, generator=gen).tolist()
            else:  # fewer blocks with a positive gap than needed: all of them, then uniform over the rest
                if positive:
                    picked += (weights > 0).nonzero().squeeze(1).tolist()
                rest = torch.ones(n, dtype=torch.float64)
                rest[picked] = 0.0
                picked += torch.multinomial(rest, B - len(picked), replacement=False, generator=gen).tolist()
        return torch.tensor(picked, dtype=torch.long)

    # -- one block update -----------------------------------------------------------------------
    def _host_free_step(self, B: int) -> None:
        """One host-free step of ``B`` blocks: the device work (`_device_step`, eager or replayed as a CUDA graph),
        then the host's counters, which depend on ``B`` and the configuration only."""
        if self._store_grows:
            self._make_room()
        # the cache test's constants as a device tensor (written by two fills when they change, outside any graph)
        factor = self.cache_factor if self.cache_size > 0 else 0.0
        floor = self.cache_nu / self.n * self.global_gap
        if self._select_values != (factor, floor):
            self._select_params[0].fill_(factor)  # a fill: assigning a number would copy it from the host
            self._select_params[1].fill_(floor)
            self._select_values = (factor, floor)
        if self.cuda_graph:
            self._graph_step(B)
        else:
            self._device_step(B, self.draws)
        self.draws += 1
        self._room -= 1
        self.visits += B
        if self._misses is not None and self.cache_size > 0:
            self._visits_unread += B
        else:
            self.oracle_calls += B

    def _device_step(self, B: int, draw) -> None:
        idx = self.problem.static_block_index(self._sample_device_at(B, draw))
        self._update(None, idx)

    def _sample_device_at(self, B: int, draw) -> torch.Tensor:
        """``B`` distinct blocks drawn on the device (`device_sampling`), ``(B,)`` long; no host read: draw number
        ``draw`` (an int, or a 0-dim int64 tensor on the device) of the generator ``seed``."""
        p = self.problem
        if self.sampling == "uniform":
            return sample_uniform(self.seed, draw, self.n, B, p.device, backend=self.backend)
        return sample_gap(self.block_gaps, self._first_rank, self.seed, draw, B, backend=self.backend)

    def _graph_signature(self, B: int) -> tuple:
        """What a captured step bakes in: the scalars it takes as constants, and the tensors it reads and writes
        (held here, compared by identity: a rebound tensor or a grown store is a new signature, and the graph's
        memory stays alive while the signature holds it). A step is captured again when any of them changed."""
        store = self.atoms
        tensors = (self.z, self.ell, self.v, self.w, self.block_gaps, self._misses, self._qp_unconverged,
                   self._select_params, self._first_rank)
        if store is not None:
            tensors += (store.labels, store.loss, store.alpha, store.count, store.alpha_valid)
        scalars = (B, self.lam, self.global_gap, self.seed, self.sampling, self.step_type, self.qp_max_iter,
                   self.cache_size, self.cache_factor, self.cache_nu)
        return scalars, tensors

    @staticmethod
    def _same(a, b) -> bool:
        return a is not None and b is not None and a[0] == b[0] and len(a[1]) == len(b[1]) and \
            all(x is y for x, y in zip(a[1], b[1]))

    def _graph_step(self, B: int) -> None:
        """`_device_step` replayed from a CUDA graph (torch.cuda.CUDAGraph): one launch for the whole step. After
        any change of what a graph bakes in (`_graph_signature`), one step runs eagerly (it compiles the Triton
        kernels for new shapes and warms the allocator) and the next is captured. If a capture fails the solver
        warns once and stays eager."""
        if self._graphs is None:
            self._graphs = {}
            self._draw_on_device = torch.zeros((), dtype=torch.long, device=self.problem.device)
        sig = self._graph_signature(B)
        entry = self._graphs.get(B)
        if entry is None or not self._same(entry[0], sig):
            if not self._same(self._graph_warm.get(B), sig):
                self._graph_warm[B] = sig
                self._graphs.pop(B, None)
                self._device_step(B, self.draws)
                return
            graph = self._capture(B)
            if graph is None:
                self._device_step(B, self.draws)
                return
            entry = self._graphs[B] = (sig, graph)
        self._draw_on_device.fill_(self.draws)
        with torch.cuda.device(self.problem.device):
            entry[1].replay()

    def _capture(self, B: int):
        import warnings

        dev = self.problem.device
        try:
            # on the problem's device and a capture stream of that device: torch.cuda.graph's default stream is
            # one per process, made on the device current at its first use, and kernels for another device's
            # tensors would run outside the capture and leave an empty graph
            with torch.cuda.device(dev):
                if self._capture_stream is None:
                    self._capture_stream = torch.cuda.Stream(device=dev)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, stream=self._capture_stream):
                    self._device_step(B, self._draw_on_device)
        except Exception as e:  # noqa: BLE001 - any failure of the capture leaves the eager step
            warnings.warn(f"BCFW: capturing the step as a CUDA graph failed ({type(e).__name__}: {e}); the steps run "
                          "eagerly", RuntimeWarning, stacklevel=3)
            self.cuda_graph = False
            self._graphs = None
            return None
        self.graph_captures += 1
        return graph

    def _first_visit_ranks(self) -> torch.Tensor:
        """``(n,)`` float64 on the host: each block's position in `first_visit` (the device sampler's first tier)."""
        rank = torch.empty(self.n, dtype=torch.float64)
        rank[self.first_visit] = torch.arange(self.n, dtype=torch.float64)
        return rank

    @property
    def _store_grows(self) -> bool:
        """Whether the host-free step must keep room in the atom store: pairwise / away steps never evict an active
        atom (FW steps with a cache stay within ``cache_size``)."""
        return self.host_free and self.atoms is not None and self.step_type != "fw"

    def _room_steps(self) -> int:
        """Steps the store keeps room for between reads of its counts: a pass's steps, at most 32 (the store's
        extra slots, which every step scores: a pass of more steps reads the counts every 32)."""
        return max(1, min(-(-self.n // self.batch_size), 32))

    def _make_room(self, max_count: int | None = None) -> None:
        """Pairwise / away steps never evict an active atom, so a block may outgrow the store. Before a step that
        the store's room does not cover, read the largest count (one host read, or ``max_count`` read with the
        report) and grow the store to hold it plus `_room_steps` more atoms."""
        if max_count is None:
            if self._room > 0:
                return
            max_count = int(self.atoms.count.max())
        store, steps = self.atoms, self._room_steps()
        if max_count > store.labels.shape[1]:  # never: each read leaves room for the steps until the next
            raise RuntimeError(f"BCFW: a block holds {max_count} atoms in a store of {store.labels.shape[1]} slots")
        if store.labels.shape[1] < max_count + steps:
            store.grow(max_count + steps)
            self._graphs = None  # the captured steps hold the old storage
        self._room = steps

    @torch.no_grad()
    def _update(self, host_idx: torch.Tensor | None, idx: torch.Tensor | None = None) -> None:
        """One (mini-batch) block update of the distinct blocks ``host_idx (B,)`` (on the host), or, for the
        host-free step, ``idx (B,)`` drawn on the device (`_host_free_step` then keeps the host's counters, and
        nothing here reads the device).

        With ``host_idx``, on a device the host waits for it at most twice (docs/benchmarks/host_syncs.md): for which
        blocks gained a cache slot (`AtomStore.insert_batch`) and for the B x B box QP (`box_qp`, on the host for
        B <= 256 with numba). Everything else is whole-batch tensor work, each quantity computed once (kernel
        launches: the same page)."""
        p, n = self.problem, self.n
        host_free = idx is not None  # the counters are the caller's (`_host_free_step`)
        if idx is None:
            idx = p.block_index(host_idx)
        B = idx.shape[0]
        theta = p.potentials(self.w, idx)
        zi = self.z.index_select(0, idx)  # a gather without the OpenMP fork-join of z[idx] (contention.md)
        ell_i = self.ell[idx]
        base = p.inner(theta, zi)  # <theta_i, z_i> = lam n <w, w_i>
        store = self.atoms
        find_away = self.step_type != "fw"  # pairwise / away steps (which also keep their active atoms)
        if store is not None:
            a_labels, a_loss, a_alpha = store.slots(idx, host_idx, all_slots=host_free)
            # H_i(y; w) = L_i(y) - <theta_i, m(y_i) - m(y)> of every stored atom; slot 0 holds the truth y_i
            a_score = p.labels_score(theta, idx, a_labels)
            a_H = a_loss - a_score[:, :1] + a_score
        if store is not None and (self._misses is not None or self.cache_size == 0):
            # One oracle call for the whole batch (on a device, see __init__; without a cache, every block), then the
            # cache test and the away atoms in one go (`select_atoms`: on CUDA one kernel)
            labels, loss, H = p.oracle(theta, idx)
            cached = self.cache_size > 0
            s_labels, s_loss, s_H, away_atom = select_atoms(
                a_H, store.count, a_labels, a_loss, a_alpha, idx, base, ell_i, self.block_gaps, labels, loss, H,
                n, self.cache_factor if cached else None, self.cache_nu / n * self.global_gap,
                self._misses if cached else None, find_away, backend=store.backend,
                params=self._select_params if host_free else None)
            if not host_free:  # the host-free step counts on the host, in `_host_free_step`
                if cached:
                    self._visits_unread += B
                else:
                    self.oracle_calls += B
        else:  # on the CPU with a cache (the oracle decodes the misses only), or FW steps without atoms
            used = None if store is None else used_slots(store.count, idx, a_H.shape[1])
            if self.cache_size > 0:
                rows = torch.arange(B, device=p.device)
                hit, best, best_H = cache_test_torch(a_H, used, base, ell_i, self.block_gaps[idx], n,
                                                     self.cache_factor, self.cache_nu / n * self.global_gap)
                s_labels = torch.where(hit.unsqueeze(1), a_labels[rows, best], p.truth[idx])
                s_loss = torch.where(hit, a_loss[rows, best], 0.0)
                s_H = torch.where(hit, best_H, 0.0)
                miss = (~hit).cpu()
                misses = int(miss.sum())
                self.cache_hits += B - misses
            else:
                misses = B
            if misses:
                if misses == B:  # without a cache, or when every block missed it
                    at, mi, theta_m = None, idx, theta
                else:
                    at = host_to_device(miss.nonzero().squeeze(1), p.device)  # the missing rows of the batch
                    mi = p.block_index(host_idx[miss])
                    theta_m = p.potentials(self.w, mi)
                labels, loss, H = p.oracle(theta_m, mi)
                H = H.clamp_min(0)
                if at is None:
                    s_labels, s_loss, s_H = labels, loss, H
                    self.block_gaps[mi] = (base + H) / n - ell_i
                else:
                    s_labels[at], s_loss[at], s_H[at] = labels, loss, H
                    self.block_gaps[mi] = (base[at] + H) / n - ell_i[at]
                if not host_free:
                    self.oracle_calls += misses
            away_atom = away_atoms_torch(a_H, used, a_alpha, a_labels, a_loss) if find_away else None
        if not host_free:
            self.visits += B

        # Insert the FW atoms. The away atoms are active atoms, which insertion leaves where they are (it fills an
        # inactive or a new slot, and evicts only under FW steps): they are read from the atoms before it.
        if store is not None:
            if B == 1 and not host_free:  # the sequential solver: host-side insertion, fewer operations
                s_slot = torch.tensor([store.insert(int(host_idx[0]), s_labels[0], float(s_loss[0]), a_H[0],
                                                    cap=self.cache_size, keep_active=find_away)], device=p.device)
            else:
                s_slot = store.insert_batch(idx, s_labels, s_loss, a_H, cap=self.cache_size, keep_active=find_away,
                                            host_idx=host_idx, sync_free=host_free)
        kind = None  # of an away step's blocks: 0 FW, 2 away
        if self.step_type == "fw":
            direction = p.fw_direction(idx, s_labels, zi)
            d_ell = s_loss / n - ell_i
            c = (base + s_H) / n - ell_i  # the FW gap
            upper = torch.ones_like(c)
        else:
            away, away_H, alpha_a, labels_a, loss_a = away_atom
            if self.step_type == "pairwise":
                direction = p.corner_difference(idx, s_labels, labels_a)
                d_ell = (s_loss - loss_a) / n
                c = (s_H - away_H) / n
                # the FW atom may be the away atom: a zero direction, whatever rounding says about c
                upper = torch.where(s_slot == away, 0.0, alpha_a)
            else:
                g_fw, g_away = (base + s_H) / n - ell_i, ell_i - (base + away_H) / n
                # |S_i| > 1 iff alpha(y_a) < 1; but the step bound alpha_a / (1 - alpha_a) multiplies a direction
                # z_i - corner(a) that holds z's rounding error, so the other atoms need a mass above
                # sqrt(eps): below, a 1-ulp remainder made an O(1) move off the simplex
                use_away = (g_away > g_fw) & (alpha_a < 1 - self._away_min_mass)
                direction = torch.where(use_away.unsqueeze(1), zi - p.corner(idx, labels_a),
                                        p.fw_direction(idx, s_labels, zi))
                d_ell = torch.where(use_away, ell_i - loss_a / n, s_loss / n - ell_i)
                c = torch.where(use_away, g_away, g_fw)
                upper = torch.where(use_away, alpha_a / (1 - alpha_a).clamp_min(1e-300), 1.0)
                kind = torch.where(use_away, 2, 0)

        gamma = self._step_sizes(idx, direction, c, upper, host_free)
        # A zero step changes nothing: skip its work where asking costs nothing (on a device the host would wait).
        if gamma.device.type == "cpu" and not host_free and not bool((gamma > 0).any()):
            return
        # z, l and (for a mini-batch) the atoms' weights in one go (`apply_block_step`: on CUDA one kernel)
        duals = {}
        if store is not None and (B > 1 or host_free):
            duals = dict(alpha=store.alpha, alpha_valid=store.alpha_valid, s_slot=s_slot, upper=upper, kind=kind,
                         away=None if self.step_type == "fw" else away)
        apply_block_step(self.z, self.ell, idx, zi, ell_i, gamma, direction, d_ell, step=self.step_type,
                         backend=self.backend, **duals)
        self._move(idx, direction, gamma)
        if store is not None and B == 1 and not host_free:
            self._update_alpha(idx, gamma, upper, s_slot, None if self.step_type == "fw" else away, kind)

    def _step_sizes(self, idx: torch.Tensor, direction: torch.Tensor, c: torch.Tensor, upper: torch.Tensor,
                    host_free: bool) -> torch.Tensor:
        """``gamma (B,)``: the minimizer of ``f(gamma) = -c^T gamma + 1/2 gamma^T H gamma`` over ``0 <= gamma <=
        upper``, ``H_bc = <Phi_b d_b, Phi_c d_c> / (lam n^2)`` (docs/design.md, "The exact mini-batch step"; B = 1:
        the line search ``clip(c / H, 0, upper)`` of Lacoste-Julien et al., 2013). `torchssvm.distributed` overrides
        it to build ``H`` from the blocks of every rank."""
        p, n, lam = self.problem, self.n, self.lam
        curvature = p.gram(idx, direction) / (lam * n * n) if idx.shape[0] > 1 else \
            (p.sqnorm(idx, direction) / (lam * n * n)).view(1, 1)
        return box_qp(c, curvature, upper, method=self.qp_method, max_iter=self.qp_max_iter, sync_free=host_free,
                      unconverged=self._qp_unconverged, backend=self.backend)

    def _move(self, idx: torch.Tensor, direction: torch.Tensor, gamma: torch.Tensor) -> None:
        """``v += sum_b gamma_b Phi_b d_b / (lam n)`` and ``w = clip(v)``."""
        self.problem.accumulate(self.v, idx, direction, gamma / (self.lam * self.n))
        self._sync_w()

    def _sync_w(self) -> None:
        if self.host_free and self.box is not None:  # in place: a captured step reads this tensor
            torch.maximum(torch.minimum(self.v, self.box[1]), self.box[0], out=self.w)
        else:
            super()._sync_w()

    def _update_alpha(self, idx, gamma, upper, s_slot, away, kind) -> None:
        """The explicit duals of the sequential solver's block (``kind``, of an away step: 0 FW, 2 away) on the
        host; a mini-batch's are updated by `apply_block_step`, with the same arithmetic."""
        store = self.atoms
        for b in range(idx.shape[0]):
            i, g = int(idx[b]), float(gamma[b])
            if g == 0.0 or not bool(store.alpha_valid[i]):
                continue
            a = store.alpha[i]
            s = int(s_slot[b])
            k = {"fw": 0, "pairwise": 1}.get(self.step_type) if kind is None else int(kind[b])
            if k == 0:  # FW: alpha <- (1 - gamma) alpha + gamma e_s
                if g >= 1.0:
                    a.zero_()
                    a[s] = 1.0
                else:
                    a.mul_(1.0 - g)
                    a[s] += g
            elif k == 1:  # pairwise: mass gamma from the away atom to the FW atom
                j = int(away[b])
                a[s] += g
                a[j] = 0.0 if g >= float(upper[b]) else a[j] - g
            else:  # away: alpha <- (1 + gamma) alpha - gamma e_a
                j = int(away[b])
                a.mul_(1.0 + g)
                a[j] = 0.0 if g >= float(upper[b]) else a[j] - g
            a.clamp_(min=0.0)

    # -- passes ---------------------------------------------------------------------------------
    def _refresh(self) -> dict:
        """The exact gap pass: n oracle calls (counted), fresh block gaps for sampling and the cache."""
        gaps, hinge = self._full_pass()
        self.oracle_calls += self.n
        self.block_gaps.copy_(gaps)  # in place: a captured step reads this tensor
        gap, ww, hinge_sum = torch.stack([gaps.sum(), self.w @ self.w, hinge.sum()]).tolist()  # one read
        self.global_gap = gap
        primal = 0.5 * self.lam * ww + hinge_sum / self.n
        self.last_exact = {"primal": primal, "gap": self.global_gap, "passes": self.oracle_calls / self.n}
        return self.last_exact

    def _certify(self) -> dict:
        t0 = time.perf_counter()
        self._refresh()
        self.seconds += time.perf_counter() - t0
        return self._report(exact=True)

    def step(self) -> dict:
        """One pass: n block visits (``ceil(n / batch_size)`` updates), then the exact gap pass when
        ``gap_check_every`` divides the number of passes done."""
        t0 = time.perf_counter()
        done = 0
        small = small_step(self.batch_size, self.problem.d, self.problem.m, self.problem.device)
        while done < self.n:
            B = min(self.batch_size, self.n - done)
            # a small step on one thread, without a fork-join per operation (`torchssvm._threads`); the progress
            # hook and the writer outside
            with one_thread(small):
                if self.host_free:
                    self._host_free_step(B)
                else:
                    self._update(self._sample(B))
            done += B
            self._tick("pass", done, self.n)
        self.steps_done += 1
        exact = self.gap_check_every > 0 and self.steps_done % self.gap_check_every == 0
        if exact:
            self._refresh()
        self.problem.write_model(self.w)
        self.seconds += time.perf_counter() - t0
        r = self._report(exact)
        self._log(r)
        return r

    def _report(self, exact: bool) -> dict:
        reads = [self._dual_tensor()]
        if not exact:  # the gap estimate: the sum of the block gaps last seen
            reads.append(self.block_gaps.clamp_min(0).sum())
        if self._misses is not None:
            reads.append(self._misses.to(torch.float64))
        if self.host_free:
            reads.append(self._qp_unconverged.to(torch.float64))
        grows = self._store_grows
        if grows:  # the store's room for the next pass, read here rather than by its first step
            reads.append(self.atoms.count.max().to(torch.float64))
        values = torch.stack(reads).tolist()  # one read from the device
        if grows:
            self._make_room(int(values.pop()))
        if self.host_free:
            self.qp_unconverged = int(values.pop())
        if self._misses is not None:
            self._count_misses(int(values.pop()))
        dual = values[0]
        if exact:
            gap, primal = self.last_exact["gap"], self.last_exact["primal"]
        else:
            gap = values[1]
            primal = dual + gap
        return {"primal": primal, "dual": dual, "gap": gap, "gap_exact": exact, "passes": self.oracle_calls / self.n,
                "oracle_calls": self.oracle_calls, "cache_hits": self.cache_hits,
                "cache_hit_rate": self.cache_hits / max(1, self.visits), "time": self.seconds,
                **({"qp_unconverged": self.qp_unconverged} if self.host_free else {})}

    def _read_qp_unconverged(self) -> int:
        """The host-free QPs short of the tolerance so far (one read; 0 for the host step)."""
        if self._qp_unconverged is not None:
            self.qp_unconverged = int(self._qp_unconverged)
        return self.qp_unconverged

    def _count_misses(self, misses: int) -> None:
        """Add the cache misses counted on the device since the last read (``misses`` of them) to the counters."""
        self.oracle_calls += misses
        self.cache_hits += self._visits_unread - misses
        self._visits_unread = 0
        self._misses.zero_()

    # -- regularization path support ------------------------------------------------------------
    @torch.no_grad()
    def rescale_lambda(self, lam_new: float) -> torch.Tensor:
        """Move to ``lam_new < lam`` keeping the primal (Prop. 1): ``alpha_i(y) <- rho alpha_i(y)`` for
        ``y != y_i`` with ``rho = lam_new / lam`` and the rest on ``y_i``; i.e. ``z <- rho z``,
        ``l <- rho l``, ``w`` unchanged. The block-gap estimates move by ``(1 - rho) delta_i`` with
        ``delta_i = l_i - lam <w, w_i>`` (exact for exact gaps). Returns ``delta (n,)``. A `state_dict` saved after
        it loads into a solver built with ``lam_new``."""
        from ..dual_solver import _check_lam

        lam_new = _check_lam(lam_new)
        if lam_new > self.lam:
            raise ValueError(f"lam_new must be <= the current lam {self.lam}, got {lam_new}")
        rho = lam_new / self.lam
        delta = self.ell - self._block_inner() / self.n
        self.z.mul_(rho)
        self.ell.mul_(rho)
        self.block_gaps.add_((1 - rho) * delta)
        self.global_gap = self.global_gap + (1 - rho) * float(delta.sum())
        if self.atoms is not None:
            a = self.atoms.alpha
            a[:, 1:] *= rho
            a[:, 0] = 1.0 - a[:, 1:].sum(1)
        self.lam = lam_new
        self.last_exact = None
        return delta

    def _block_inner(self) -> torch.Tensor:
        """``<theta_i(w), z_i>`` for every block (= ``lam n <w, w_i>``)."""
        p = self.problem
        out = torch.empty(self.n, dtype=torch.float64, device=p.device)
        for idx in p.chunks():
            out[idx] = p.inner(p.potentials(self.w, idx), self.z[idx])
        return out

    # -- state ----------------------------------------------------------------------------------
    def _extra_state(self) -> dict:
        if self._misses is not None and self._visits_unread:  # before the counters are read (`Solver.state_dict`)
            self._count_misses(int(self._misses))
        s = super()._extra_state()
        s.update({"global_gap": self.global_gap, "first_visit": self.first_visit.clone(),
                  "first_visit_pos": self.first_visit_pos, "cache_hits": self.cache_hits, "visits": self.visits,
                  "generator": self.generator.get_state(), "draws": self.draws, "seed": int(self.seed),
                  "qp_unconverged": self._read_qp_unconverged(),
                  "atoms": None if self.atoms is None else
                  self.atoms.state_dict()})
        return s

    def _checked_state(self, state: dict) -> dict:
        require_keys(state, ("global_gap", "first_visit", "first_visit_pos", "cache_hits", "visits", "generator",
                             "atoms"))
        out = super()._checked_state(state)
        if (state["atoms"] is None) != (self.atoms is None):
            saved, mine = ("with", "without") if self.atoms is None else ("without", "with")
            raise ValueError(f"state_dict was saved {saved} an atom store (kept by cache_size > 0 or step = 'pairwise' "
                             f"/ 'away'); this solver runs {mine} one (cache_size = {self.cache_size}, step = "
                             f"{self.step_type!r}): build it with the run's cache_size and step")
        first_visit = checked_tensor(state, "first_visit", (self.n,), self.first_visit)
        if not torch.equal(first_visit.sort().values, torch.arange(self.n)):
            raise ValueError(f"state_dict['first_visit'] must be a permutation of range({self.n})")
        out["first_visit"] = first_visit
        out.update(checked_scalars(state, {"global_gap": float, "first_visit_pos": int, "cache_hits": int,
                                           "visits": int}))
        # host-free sampling's generator: the seed and the draws taken (a state saved before they were kept has
        # none: this solver's seed, no draw), and the count of QPs short of the tolerance
        extra = {"draws": state.get("draws", 0), "seed": state.get("seed", int(self.seed)),
                 "qp_unconverged": state.get("qp_unconverged", 0)}
        out.update(checked_scalars(extra, {"draws": int, "seed": int, "qp_unconverged": int}))
        for key in ("draws", "qp_unconverged"):
            if out[key] < 0:
                raise ValueError(f"state_dict[{key!r}] must be >= 0, got {out[key]}")
        out["_generator"] = checked_generator_state(state)
        out["_atoms"] = None if self.atoms is None else self.atoms.checked_state(state["atoms"])
        if self.step_type != "fw" and out["_atoms"] is not None and not bool(out["_atoms"]["alpha_valid"].all()):
            # FW steps with a cache evict atoms that carry weight: those blocks' weights no longer describe z, and
            # pairwise / away steps, which move weight between atoms, would skip them for the rest of the run
            bad = int((~out["_atoms"]["alpha_valid"]).sum())
            raise ValueError(f"state_dict was saved with step='fw' ({bad} blocks' atom weights are not tracked); "
                             f"step={self.step_type!r} needs every block's weights: resume with step='fw'")
        return out

    def _check_consistency(self, c: dict) -> None:
        """`DualSolver._check_consistency`, then the atoms (the store of the cache and the active sets, `AtomStore`)
        against the blocks (`DualSolver._check_working_set`)."""
        super()._check_consistency(c)
        a = c.get("_atoms")
        if a is not None:
            used = torch.arange(a["labels"].shape[1], device=a["count"].device).unsqueeze(0) < a["count"].unsqueeze(1)
            self._check_working_set(c, a["labels"], a["loss"], a["alpha"], used, a["alpha_valid"],
                                    "state_dict['atoms']")

    def _set_state(self, checked: dict) -> None:
        self.generator.set_state(checked.pop("_generator"))
        atoms = checked.pop("_atoms")
        if atoms is not None:
            self.atoms.set_state(atoms)
        if self._misses is not None:  # the saved counters include every miss counted on the device
            self._misses.zero_()
            self._visits_unread = 0
        block_gaps = checked.pop("block_gaps")
        qp_unconverged = checked.pop("qp_unconverged")
        super()._set_state(checked)
        self.block_gaps.copy_(block_gaps)  # in place, as `_refresh` writes it
        self._graphs = None  # the captured steps hold the old tensors
        self._graph_warm = {}
        self.qp_unconverged = qp_unconverged
        if self.host_free:
            self._room = 0
            self._qp_unconverged.fill_(qp_unconverged)
            self._first_rank.copy_(self._first_visit_ranks())  # the loaded order, in place
