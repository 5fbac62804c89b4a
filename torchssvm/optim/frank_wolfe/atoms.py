"""Explicit sparse duals per block: the active set and the cache in one store (Osokin et al., 2016).

Block i holds up to ``capacity`` atoms, each a labelling (identified by its labels, ``width`` long
entries padded with -1), its task loss ``L_i(y)`` (not scaled) and its dual weight ``alpha_i(y)``.
Slot 0 is the ground truth (``alpha = 1`` at the start) and is never evicted. Storage is dense tensors
``(n, capacity, ...)`` that grow (doubling the capacity) when a block must exceed it.
"""

from __future__ import annotations

import torch

from ..._device import host_to_device
from ...kernels import resolve
from .._state import checked_tensor, require_keys


class AtomStore:
    """``AtomStore(truth (n, width), capacity, backend="auto")``; ``backend`` runs `insert_batch` as torch ops or
    as the Triton kernel `insert_atoms_triton` (`torchssvm.kernels`: ``"auto"`` picks Triton on CUDA)."""

    def __init__(self, truth: torch.Tensor, capacity: int, backend: str = "auto"):
        n, width = truth.shape
        self.backend = backend
        self.capacity = max(2, int(capacity))
        dev = truth.device
        # int32 labels: the store is n x capacity x width (CoNLL, cap 50: 35M entries)
        self.labels = torch.full((n, self.capacity, width), -1, dtype=torch.int32, device=dev)
        self.labels[:, 0] = truth
        self.loss = torch.zeros(n, self.capacity, dtype=torch.float64, device=dev)
        self.alpha = torch.zeros(n, self.capacity, dtype=torch.float64, device=dev)
        self.alpha[:, 0] = 1.0
        self.count = torch.ones(n, dtype=torch.long, device=dev)
        # The counts on the host as well: the slots' shapes without asking the device (docs/benchmarks/host_syncs.md)
        self.count_host = torch.ones(n, dtype=torch.long)
        # False once a FW + cache eviction dropped an active atom: alpha no longer sums to the block.
        self.alpha_valid = torch.ones(n, dtype=torch.bool, device=dev)

    def grow(self, slots: int | None = None) -> None:
        """Double the slots per block, or (``slots`` given) make them at least ``slots``, growing by a quarter at
        least (each growth copies the store)."""
        n, C, W = self.labels.shape
        extra = C if slots is None else max(slots - C, C // 4, 1)
        self.labels = torch.cat([self.labels, self.labels.new_full((n, extra, W), -1)], 1)
        self.loss = torch.cat([self.loss, self.loss.new_zeros(n, extra)], 1)
        self.alpha = torch.cat([self.alpha, self.alpha.new_zeros(n, extra)], 1)

    def slots(self, idx: torch.Tensor, host_idx: torch.Tensor | None = None, all_slots: bool = False):
        """``(labels (B, C, W), loss (B, C), alpha (B, C))`` of blocks ``idx``, with ``C`` the largest count among
        them (read from the host's copy when ``host_idx``, ``idx`` on the host, is given), or every slot of the
        storage with ``all_slots`` (no read: the shapes are the store's); slots past a block's count are unused
        (`torchssvm.kernels.step.atoms_select_torch.used_slots`)."""
        if all_slots:
            return self.labels[idx].long(), self.loss[idx], self.alpha[idx]
        C = int(self.count_host[idx.cpu() if host_idx is None else host_idx].max())
        return self.labels[idx, :C].long(), self.loss[idx, :C], self.alpha[idx, :C]

    def find(self, i: int, label: torch.Tensor) -> int:
        c = int(self.count_host[i])
        hit = (self.labels[i, :c] == label).all(1).nonzero()
        return int(hit[0]) if hit.numel() else -1

    def insert(self, i: int, label: torch.Tensor, loss: float, scores: torch.Tensor, *, cap: int,
               keep_active: bool) -> int:
        """Slot of ``label`` in block i, adding it if absent.

        When the block holds ``cap`` atoms (``cap = 0``: no cache, only reuse free slots) the inactive
        atom with the lowest current score ``scores[slot] = H_i(y; w)`` is replaced. If every atom is
        active, the store grows when ``keep_active`` (pairwise / away steps: active atoms are never
        evicted); otherwise the lowest-scoring non-truth atom is evicted and the block's ``alpha`` is
        marked invalid (the FW + cache rule of [C])."""
        slot = self.find(i, label)
        if slot >= 0:
            return slot
        c = int(self.count_host[i])
        full = c >= cap if cap > 0 else True
        if full:
            cand = (self.alpha[i, 1:c] == 0).nonzero().squeeze(1) + 1
            if cand.numel():
                slot = int(cand[scores[cand].argmin()])
            elif not keep_active and c > 1:
                slot = int(scores[1:c].argmin()) + 1
                self.alpha_valid[i] = False
                self.alpha[i, slot] = 0.0
            else:
                full = False
        if not full:
            if c >= self.labels.shape[1]:
                self.grow()
            slot = c
            self.count[i] = self.count_host[i] = c + 1
        self.labels[i, slot] = label
        self.loss[i, slot] = loss
        self.alpha[i, slot] = 0.0
        return slot

    def insert_batch(self, idx: torch.Tensor, labels: torch.Tensor, loss: torch.Tensor, scores: torch.Tensor, *,
                     cap: int, keep_active: bool, host_idx: torch.Tensor | None = None,
                     sync_free: bool = False) -> torch.Tensor:
        """`insert` for distinct blocks ``idx (B,)`` at once, on the store's device: ``labels (B, width)``,
        ``loss (B,)``, ``scores (B, C)`` over the first ``C`` slots (at least the largest count among the blocks);
        ``host_idx``: ``idx`` on the host, if at hand. Returns the slots ``(B,)``; the same slots and store as
        calling `insert` block by block.

        The host reads one thing from the device: which blocks gain a slot (its copy of the counts, and whether
        the store must grow). The writes are whole-batch, blocks that hold their labelling already writing back
        what is there, so that no boolean mask makes the host wait. With ``sync_free`` it reads nothing: the
        caller has made room for every append (`grow`), and the host's copy of the counts is stale until
        `set_state`."""
        if sync_free:
            host_idx = None  # no host bookkeeping
        elif host_idx is None:
            host_idx = idx.cpu()
        if resolve("insert_atoms", self.backend, self.labels.device) == "triton":
            return self._insert_batch_triton(idx, labels, loss, scores, cap, keep_active, host_idx)
        return self._insert_batch_torch(idx, labels, loss, scores, cap, keep_active, host_idx)

    def _insert_batch_torch(self, idx, labels, loss, scores, cap, keep_active, host_idx) -> torch.Tensor:
        dev = self.labels.device
        c = self.count[idx]
        C = scores.shape[1]
        pos = torch.arange(C, device=dev)
        used = pos < c.unsqueeze(1)
        labels = labels.to(self.labels.dtype)
        match = (self.labels[idx, :C] == labels.unsqueeze(1)).all(2) & used
        found = match.any(1)
        alpha = self.alpha[idx, :C]
        replaceable = used & (pos >= 1)  # never the truth
        inactive = replaceable & (alpha == 0)
        has_cand = inactive.any(1)
        full = c >= cap if cap > 0 else torch.ones_like(found)
        slot = torch.where(full & has_cand, scores.masked_fill(~inactive, torch.inf).argmin(1), c)  # first lowest
        if keep_active:  # pairwise / away steps: a full block without an inactive atom grows
            append = ~(full & has_cand) & ~found
            evict = None
        else:  # FW steps: it evicts its lowest-scoring atom, and its alpha is no longer the block's
            evict = full & ~has_cand & (c > 1) & ~found
            slot = torch.where(evict, scores.masked_fill(~replaceable, torch.inf).argmin(1), slot)
            append = ~(full & has_cand) & ~evict & ~found
        slot = torch.where(found, match.to(torch.int8).argmax(1), slot)
        if host_idx is not None:
            self.count_host[host_idx] += append.cpu()
            if int(self.count_host[host_idx].max()) > self.labels.shape[1]:  # an append past the last slot
                self.grow()
        # A block that holds its labelling already writes back what is there: the same labels, its loss and alpha.
        self.labels[idx, slot] = labels
        self.loss[idx, slot] = torch.where(found, self.loss[idx, slot], loss.to(self.loss.dtype))
        self.alpha[idx, slot] = torch.where(found, self.alpha[idx, slot], 0.0)
        self.count[idx] = c + append
        if evict is not None:
            self.alpha_valid[idx] &= ~evict
        return slot

    def _insert_batch_triton(self, idx, labels, loss, scores, cap, keep_active, host_idx) -> torch.Tensor:
        """`insert_batch` as one kernel launch; blocks appending past the last slot are written here after the
        store grows (rare: the store doubles). ``host_idx`` None: no host bookkeeping (``sync_free``)."""
        from ...kernels.step.atoms_insert_triton import insert_atoms_triton

        last = self.labels.shape[1]
        slot, append = insert_atoms_triton(self.labels, self.loss, self.alpha, self.count, self.alpha_valid, idx,
                                           labels, loss.to(self.loss.dtype), scores, cap, keep_active)
        if host_idx is None:
            return slot
        self.count_host[host_idx] += append.cpu()
        beyond = self.count_host[host_idx] > last  # appended at slot `last`, which does not exist yet
        if bool(beyond.any()):
            self.grow()
            rows = host_to_device(beyond.nonzero().squeeze(1), idx.device)
            at = idx[rows]
            self.labels[at, last] = labels[rows].to(self.labels.dtype)
            self.loss[at, last] = loss[rows].to(self.loss.dtype)
            self.alpha[at, last] = 0.0
        return slot

    def state_dict(self) -> dict:
        return {"labels": self.labels.clone(), "loss": self.loss.clone(), "alpha": self.alpha.clone(),
                "count": self.count.clone(), "alpha_valid": self.alpha_valid.clone(), "capacity": self.capacity}

    def load_state_dict(self, s: dict) -> None:
        self.set_state(self.checked_state(s))

    def checked_state(self, s: dict) -> dict:
        """The store's tensors from `state_dict` ``s``, checked against this store's ``n``, ``width`` and capacity
        (the number of slots is the saved one: storage grows) and moved to its device; nothing is set here."""
        require_keys(s, ("labels", "loss", "alpha", "count", "alpha_valid", "capacity"), "state_dict['atoms']")
        if s["capacity"] != self.capacity:
            raise ValueError(f"state_dict['atoms'] was saved with capacity {s['capacity']!r}; this store has "
                             f"{self.capacity}")
        n, _, width = self.labels.shape
        labels = s["labels"]
        slots = labels.shape[1] if isinstance(labels, torch.Tensor) and labels.dim() == 3 else self.labels.shape[1]
        shapes = {"labels": (n, slots, width), "loss": (n, slots), "alpha": (n, slots), "count": (n,),
                  "alpha_valid": (n,)}
        out = {k: checked_tensor(s, k, shape, getattr(self, k), "state_dict['atoms']") for k, shape in shapes.items()}
        if out["count"].numel() and not (1 <= int(out["count"].min()) and int(out["count"].max()) <= slots):
            raise ValueError(f"state_dict['atoms']['count'] must be in [1, {slots}] (the truth and the stored atoms)")
        return out

    def set_state(self, checked: dict) -> None:
        for k, value in checked.items():
            setattr(self, k, value)
        self.count_host = self.count.to("cpu", copy=True)
