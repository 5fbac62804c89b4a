"""The linear-chain SSVM of a `LinearChainModel` on a `SequenceDataset`, in marginal coordinates.

Block vector layout (flat, size ``m = T K + K^2 + 2 K`` with T the dataset's padded length):
``[unary marginals (T, K) | transition counts (K, K) | start (K) | end (K)]``. The joint feature map of
the model (``phi = d <model(x), mu> / d w``, `torchssvm.models`) is applied in factored form: for dense inputs
the emission part of ``Phi_i z`` is ``X_i^T z_unary``, and a mini-batch's ``Phi_b z_b`` are built as one
``(B, d)`` matrix (its Gram matrix and the update of w are one product each); for sparse attributes the Gram
matrix is built from (block, attribute) rows (`sparse_gram`), never a dense ``d``-vector per block.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..._validation import check_finite, check_labels, check_square_sums, check_tensor
from ...data.sequence_dataset import SequenceDataset
from ...data.token_features import TokenFeatures, check_token_features
from ...kernels import chain_inner, chain_labels_score, chain_marginals, resolve, viterbi
from ...models import LinearChainModel
from ...structures.chain import Chain, ChainPotentials
from .base import DualProblem
from .sparse_gram import add_attribute_rows, attribute_rows, sparse_emission_gram, sparse_emission_sqnorm
from .sparse_gram_numba import add_attribute_rows_numba, attribute_rows_numba, sparse_emission_gram_numba
from .sparse_unary import sparse_unary
from .sparse_unary_numba import sparse_unary_numba


def _check_sequences(dataset: SequenceDataset) -> None:
    """The training sequences, checked as the model and `Chain` check a batch (a ValueError / TypeError naming the
    field): the problem reads them directly, and a label out of range inside a length (clamped to 0 in the loss) or a
    NaN feature would give a certificate of another problem or of inf. Checked once here, the problem's kernel calls in
    every solver step skip the kernels' own argument checks (``check=False``)."""
    x, D = dataset.x, dataset.num_features
    if isinstance(x, TokenFeatures):
        check_token_features("dataset.x", x, D, finite=True)
        width = x.ids.shape[1]
    else:
        check_tensor("dataset.x", x, ndim=3)
        if not x.is_floating_point():
            raise TypeError("dataset holds token ids; the linear chain SSVM needs float features or TokenFeatures")
        if x.shape[2] != D:
            raise ValueError(f"dataset.x must have num_features = {D} features in its last dimension, got shape "
                             f"{tuple(x.shape)}")
        width = x.shape[1]
        check_finite({"dataset.x": x})
    y = check_tensor("dataset.y", dataset.y, ndim=2, integer=True)
    lengths = check_tensor("dataset.lengths", dataset.lengths, ndim=1, integer=True, device=y.device)
    width = min(width, y.shape[1])
    lo, hi = torch.stack([lengths.min(), lengths.max()]).tolist()
    if lo < 1 or hi > width:
        raise ValueError(f"dataset.lengths must be in [1, {width}] (the padded length), got a length of "
                         f"{lo if lo < 1 else hi}")
    valid = torch.arange(y.shape[1], device=y.device).unsqueeze(0) < lengths.unsqueeze(1)
    check_labels("dataset.y", y, tuple(y.shape), dataset.num_labels, y.device, valid=valid)


def _unmodified(kept: torch.Tensor, version: int, t: torch.Tensor) -> bool:
    """``t`` is the very tensor ``kept``, not written in place since its ``_version`` was ``version``: the key of the
    problem's memos of a step's index and direction tensors (`_batch_T`, `_x`, `gram` for `accumulate`)."""
    return kept is t and version == t._version


class ChainProblem(DualProblem):
    """Args:
        model: the `LinearChainModel` whose parameters are ``w`` (its flattened ``parameters()``).
        dataset: the training sequences (dense float features or `TokenFeatures`).
        structure: the task loss; default ``Chain(K)`` (Hamming normalized by length, as in Osokin et al., 2016).
        backend: the kernels' backend (`torchssvm.kernels`): ``"auto"`` runs the compiled twins (numba) of Viterbi,
            the scores, the corners, the sparse potentials, Gram rows and update of w on the CPU when numba
            imports, the Triton kernels on CUDA; ``"torch"``, ``"triton"`` and ``"numba"`` force one (the slack
            oracle has no numba twin: it runs under ``"auto"`` then).
    """

    def __init__(self, model: LinearChainModel, dataset: SequenceDataset, structure: Optional[Chain] = None,
                 *, backend: str = "auto"):
        if not isinstance(model, LinearChainModel):
            raise TypeError(f"model must be a LinearChainModel, got {type(model).__name__}")
        if not isinstance(dataset, SequenceDataset):
            raise TypeError(f"dataset must be a SequenceDataset, got {type(dataset).__name__}")
        if model.num_labels != dataset.num_labels or model.num_features != dataset.num_features:
            raise ValueError(f"model has (num_features, num_labels) = ({model.num_features}, {model.num_labels}) "
                             f"but dataset has ({dataset.num_features}, {dataset.num_labels})")
        if model.sparse != dataset.sparse:
            raise ValueError(f"model.sparse={model.sparse} but the dataset's features are "
                             f"{'sparse' if dataset.sparse else 'dense'}")
        if len(dataset) == 0:
            raise ValueError("dataset is empty")
        _check_sequences(dataset)
        self.structure = structure if structure is not None else Chain(dataset.num_labels)
        if not isinstance(self.structure, Chain) or self.structure.num_labels != dataset.num_labels:
            raise ValueError(f"structure must be a Chain with {dataset.num_labels} labels, got {self.structure!r}")
        self.model, self.backend = model, backend
        self.device = model.emission.device
        resolved = resolve("viterbi", backend, self.device)  # the oracle's form: a bad name fails here
        # the slack oracle has torch and Triton forms only: "numba" (the other chain kernels' compiled twins) leaves
        # it to "auto"
        self._slack_backend = "auto" if backend == "numba" else backend
        # the sparse attributes' potentials, the Gram matrix's sort-and-join steps and the update of w: compiled on
        # the CPU where the chain kernels are (`"auto"`, `"numba"`)
        compiled = resolved == "numba" and model.emission.dtype in (torch.float32, torch.float64)
        self._sparse_unary = sparse_unary_numba if compiled else sparse_unary
        self._attribute_rows = attribute_rows_numba if compiled else attribute_rows
        self._sparse_gram = sparse_emission_gram_numba if compiled else sparse_emission_gram
        self._add_rows = add_attribute_rows_numba if compiled else add_attribute_rows
        self.K, self.D = model.num_labels, model.num_features
        self.label_bound = self.K
        self.sparse = model.sparse
        self.n = len(dataset)
        self.lengths = dataset.lengths.to(self.device)
        self.T = int(self.lengths.max())
        self._lengths_host = dataset.lengths.to("cpu", torch.long)
        self.label_width = self.T
        self.truth = dataset.y[:, : self.T].to(self.device).clone()
        self.truth[torch.arange(self.T, device=self.device).unsqueeze(0) >= self.lengths.unsqueeze(1)] = -1
        if self.sparse:
            vals = dataset.x.values
            self.x = TokenFeatures(dataset.x.ids[:, : self.T].to(self.device),
                                   None if vals is None else vals[:, : self.T].to(self.device, self.dtype))
        else:
            self.x = dataset.x[:, : self.T].to(self.device, self.dtype)
        values = self.x.values if self.sparse else self.x
        if values is not None:  # a joint feature sums T positions' features: its squared norm, up to 4 T^2 theirs
            check_square_sums("dataset.x.values" if self.sparse else "dataset.x", values,
                              dtype=model.emission.dtype, factor=4.0 * self.T ** 2)
        K, T = self.K, self.T
        # Loss augmentation of the unary potentials (Hamming is decomposable): the cost of label k at
        # position t of example i, 0 at the truth and on padding. L_i(y) = sum_t aug[i, t, y_t].
        pos_w = self.structure.position_loss_weights(self.truth, self.lengths).to(self.dtype)
        wrong = torch.ones(self.n, T, K, dtype=self.dtype, device=self.device)
        wrong.scatter_(2, self.truth.clamp_min(0).unsqueeze(2), 0.0)
        self.loss_aug = pos_w.unsqueeze(2) * wrong
        self.m = T * K + K * K + 2 * K
        self._cut = (T * K, T * K + K * K, T * K + K * K + K)
        # Parameter slices of w in model.parameters() order (joint_feature's order).
        self._slices, off = {}, 0
        for name in ("emission", "transition", "bias", "start", "end"):
            p = getattr(model, name)
            if p is not None:
                self._slices[name] = (off, off + p.numel(), tuple(p.shape))
                off += p.numel()
        self.d = off
        # z's tail [transition | start | end] without the parts w lacks: one product applies it (`gram`, `accumulate`)
        a, b, _ = self._cut
        self._tail = slice(a, self.m if "start" in self._slices else b)
        if ("start" in self._slices) != ("end" in self._slices):
            raise ValueError("a chain model has both the start and the end biases or neither")
        self._gram_memo = None  # (idx, z, versions, T, attribute rows or joint features) of the last gram or sqnorm
        self._T_memo = []  # (idx, its version, T) of the last few index tensors (`_batch_T`, `block_index`)
        self._x_memo = None  # (idx, its version, T, features) of the last dense gather (`_x`)

    # -- parameters -----------------------------------------------------------------------------
    def parameter_slices(self) -> dict:
        return dict(self._slices)

    def _part(self, w: torch.Tensor, name: str) -> Optional[torch.Tensor]:
        if name not in self._slices:
            return None
        a, b, shape = self._slices[name]
        return w[a:b].view(shape)

    def initial_w(self) -> torch.Tensor:
        return torch.zeros(self.d, dtype=self.dtype, device=self.device)

    @torch.no_grad()
    def write_model(self, w: torch.Tensor) -> None:
        for name in self._slices:
            p = getattr(self.model, name)
            p.copy_(self._part(w, name).to(p.dtype))

    # -- helpers --------------------------------------------------------------------------------
    def _split(self, z: torch.Tensor, T: int):
        B, K = z.shape[0], self.K
        a, b, c = self._cut
        return (z[:, :a].view(B, self.T, K)[:, :T], z[:, a:b].view(B, K, K), z[:, b:c], z[:, c:])

    # the host-free BCFW step on these problems launches a fixed sequence of kernels with no copy from the host
    # (tested on a GPU): BCFW replays it as a CUDA graph by default
    graph_safe = True

    _T_MEMO_SIZE = 4

    def _batch_T(self, idx: torch.Tensor) -> int:
        """The longest length among blocks ``idx``. One mini-batch step asks for it several times with the same
        ``idx`` (potentials, gram, accumulate, ...) and with the subset that missed the cache, and on a GPU each
        read is a host synchronisation (docs/benchmarks/host_syncs.md): the answers for the last few unmodified
        index tensors are kept, and `block_index` computes them from the host copy."""
        for memo in self._T_memo:
            if _unmodified(memo[0], memo[1], idx):
                return memo[2]
        lengths = self._lengths_host if idx.device.type == "cpu" else self.lengths
        T = int(lengths[idx].max())
        self._remember_T(idx, T)
        return T

    def _remember_T(self, idx: torch.Tensor, T: int) -> None:
        self._T_memo = [(idx, idx._version, T)] + self._T_memo[: self._T_MEMO_SIZE - 1]

    def block_index(self, idx: torch.Tensor) -> torch.Tensor:
        on_device = super().block_index(idx)
        if idx.numel():
            self._remember_T(on_device, int(self._lengths_host[idx.cpu()].max()))
        return on_device

    def static_block_index(self, idx: torch.Tensor) -> torch.Tensor:
        self._remember_T(idx, self.T)
        return idx

    def _x(self, idx: torch.Tensor, T: int):
        """The padded features of blocks ``idx`` (on the problem's device, non-negative: `block_index`) up to T."""
        if self.sparse:
            return self.x[idx][:, :T]
        # a step gathers the same blocks' features twice (their potentials, then `gram`'s joint features): the last
        # gather is kept for the same unmodified index tensor, as `_batch_T` keeps T
        memo = self._x_memo
        if memo is not None and _unmodified(memo[0], memo[1], idx) and memo[2] == T:
            return memo[3]
        # index_select, not x[idx, :T]: advanced indexing forks an OpenMP team for a source this large even to gather
        # a few rows (docs/benchmarks/contention.md)
        x = self.x[:, :T].index_select(0, idx)
        self._x_memo = (idx, idx._version, T, x)
        return x

    # -- the contract ---------------------------------------------------------------------------
    def potentials(self, w: torch.Tensor, idx: torch.Tensor) -> ChainPotentials:
        T = self._batch_T(idx)
        E = self._part(w, "emission")
        if self.sparse:  # read from the data set's attributes in place (padding positions stay 0)
            unary = self._sparse_unary(self.x.ids, self.x.values, idx, self.lengths, E, T)
        else:
            unary = self._x(idx, T) @ E
        bias = self._part(w, "bias")
        if bias is not None:
            unary = unary + bias
        return ChainPotentials(unary, self._part(w, "transition"), self._part(w, "start"), self._part(w, "end"))

    def _pad(self, labels: torch.Tensor) -> torch.Tensor:
        B, T = labels.shape
        if T == self.T:
            return labels
        out = labels.new_full((B, self.T), -1)
        out[:, :T] = labels
        return out

    def oracle(self, theta: ChainPotentials, idx: torch.Tensor):
        T = theta.unary.shape[1]
        aug = self.loss_aug[idx, :T]
        lengths = self.lengths[idx]
        labels, value = viterbi(theta.unary + aug, theta.transition, theta.start, theta.end, lengths,
                                backend=self.backend)
        loss = aug.gather(2, labels.clamp_min(0).unsqueeze(2)).squeeze(2).sum(1)  # padding costs 0
        truth_score = chain_labels_score(*theta, self.truth[idx].unsqueeze(1), lengths, backend=self.backend,
                                         check=False)
        return self._pad(labels), loss, value - truth_score.squeeze(1)

    def slack_oracle(self, theta: ChainPotentials, idx: torch.Tensor):
        """The exact error-count DP (`Chain.slack_max_oracle`); needs a Chain without class weights."""
        T = theta.unary.shape[1]
        lengths = self.lengths[idx]
        labels, value = self.structure.unchecked.slack_max_oracle(theta, self.truth[idx, :T], lengths,
                                                                  backend=self._slack_backend)
        loss = self.loss_aug[idx, :T].gather(2, labels.clamp_min(0).unsqueeze(2)).squeeze(2).sum(1)
        return self._pad(labels), loss, value.to(self.dtype)

    def decode(self, theta: ChainPotentials, idx: torch.Tensor) -> torch.Tensor:
        return self._pad(self.structure.unchecked.decode(theta, self.lengths[idx], backend=self.backend))

    def labels_score(self, theta: ChainPotentials, idx: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return chain_labels_score(*theta, labels, self.lengths[idx], backend=self.backend, check=False)

    def task_loss(self, idx: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        B, C, _ = labels.shape
        truth = self.truth[idx].repeat_interleave(C, dim=0)
        lengths = self.lengths[idx].repeat_interleave(C)
        return self.structure.unchecked.task_loss(labels.reshape(B * C, self.T), truth, lengths).view(B, C)

    def corner(self, idx: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        # m(y_i) - m(y), flat (the module's layout)
        return chain_marginals(self.truth[idx], self.lengths[idx], self.K, labels, self.dtype, backend=self.backend,
                               check=False)

    def fw_direction(self, idx: torch.Tensor, labels: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        # the counts minus z, row by row in one pass with the numba twin (the B x m rows are the step's largest)
        return chain_marginals(self.truth[idx], self.lengths[idx], self.K, labels, self.dtype, backend=self.backend,
                               subtract=z, check=False)

    def corner_difference(self, idx: torch.Tensor, labels: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
        # m(other) - m(labels): counts, so the same floats as the difference of the two corners, in one scatter
        return chain_marginals(other, self.lengths[idx], self.K, labels, self.dtype, backend=self.backend, check=False)

    def inner(self, theta: ChainPotentials, z: torch.Tensor) -> torch.Tensor:
        return chain_inner(*theta, z, backend=self.backend, check=False)

    def _emission(self, idx: torch.Tensor, zu: torch.Tensor, T: int) -> torch.Tensor:
        """Emission part of ``Phi_b z_b`` for dense inputs, ``(B, D K)``."""
        return torch.bmm(self._x(idx, T).transpose(1, 2), zu).reshape(zu.shape[0], self.D * self.K)

    def _joint_features(self, idx: torch.Tensor, z: torch.Tensor, T: int) -> torch.Tensor:
        """``Phi_b z_b`` for dense inputs, ``(B, d)`` in w's layout: one row per block, built in a few kernels (the
        Gram matrix and the update of w are then one product each)."""
        u, t, s, e = self._split(z, T)
        parts = {"emission": self._emission(idx, u, T), "transition": t.flatten(1)}
        if "bias" in self._slices:
            parts["bias"] = u.sum(1)
        parts["start"], parts["end"] = s, e
        return torch.cat([parts[name] for name in self._slices], 1)

    def batch_width(self, idx: torch.Tensor) -> int:
        """The padded length of a batch of blocks ``idx``: its longest sentence (what `gram` and `accumulate` pad
        the batch's rows to)."""
        return self._batch_T(idx)

    def joint_features(self, idx: torch.Tensor, z: torch.Tensor, width: Optional[int] = None) -> torch.Tensor:
        """``(B, d)``: the rows ``Phi_b z_b`` of dense-input blocks ``idx (B,)`` with ``z (B, m)``, in w's layout,
        their sentences padded to ``width`` (default `batch_width`; at least that). These are the rows `gram`
        multiplies for a batch padded to ``width``, bitwise: the matrix product's rounding follows the padded
        length, so a caller that needs one batch's bits for a part of it (a shard of `torchssvm.distributed`) pads
        the part to the whole batch's width."""
        if self.sparse:
            raise ValueError("joint_features: the rows of sparse token features are not built densely (d may be "
                             "millions): use sparse_batch / sparse_batch_gram")
        T = self._batch_T(idx)
        width = T if width is None else int(width)
        if width < T:
            raise ValueError(f"width must be at least the batch's longest sentence {T}, got {width}")
        if width == T:
            return self._joint_features(idx, z, T)
        u, t, s, e = self._split(z, T)
        pad = (0, 0, 0, width - T)
        u = torch.nn.functional.pad(u, pad)
        x = torch.nn.functional.pad(self._x(idx, T), pad)
        B = idx.shape[0]
        parts = {"emission": torch.bmm(x.transpose(1, 2), u).reshape(B, self.D * self.K),
                 "transition": t.flatten(1), "start": s, "end": e}
        if "bias" in self._slices:
            parts["bias"] = u.sum(1)
        return torch.cat([parts[name] for name in self._slices], 1)

    def gram(self, idx_a, z_a, idx_b=None, z_b=None) -> torch.Tensor:
        same = idx_b is None
        if same:
            idx_b, z_b = idx_a, z_a
        T = max(self._batch_T(idx_a), self._batch_T(idx_b))
        if not self.sparse:  # the joint features Phi_b z_b, one product (kept for `accumulate`, which applies them)
            Pa = self._joint_features(idx_a, z_a, T)
            if same:
                self._gram_memo = (idx_a, z_a, (idx_a._version, z_a._version), T, Pa)
                return Pa @ Pa.T
            return Pa @ self._joint_features(idx_b, z_b, T).T
        # factored: no (B, D K) vectors (sparse_gram.py)
        ua = self._split(z_a, T)[0]
        ub = ua if same else self._split(z_b, T)[0]
        if same:
            G, rows = self._sparse_batch_gram(self.x, ua, z_a[:, self._tail], index=idx_a)
            # kept (with the tensors themselves, so identity is unambiguous) for `accumulate`
            self._gram_memo = (idx_a, z_a, (idx_a._version, z_a._version), T, rows)
            return G
        xa, xb, Ba = self._x(idx_a, T), self._x(idx_b, T), ua.shape[0]
        vals = None if xa.values is None else torch.cat([xa.values, xb.values])
        G = self._sparse_gram(torch.cat([xa.ids, xb.ids]), vals, torch.cat([ua, ub]))[:Ba, Ba:]
        G = G + z_a[:, self._tail] @ z_b[:, self._tail].T  # transition, start and end: one product
        if "bias" in self._slices:
            G = G + ua.sum(1) @ ub.sum(1).T
        return G

    def _sparse_batch_gram(self, x: TokenFeatures, u: torch.Tensor, tail: torch.Tensor, index=None):
        """``(G (B, B), rows)``: the Gram matrix of a sparse batch's ``Phi_b z_b`` from their attributes ``x`` (the
        data set's, read at rows ``index``, or the batch's own ``(B, T, A)`` when ``index`` is None), unary parts
        ``u (B, T, K)`` and tails ``tail (B, L)``, with the (block, attribute) rows that `_sparse_batch_add` applies."""
        rows = self._attribute_rows(x.ids, x.values, u, index=index)
        G = self._sparse_gram(x.ids, x.values, u, rows=rows)
        G = G + tail @ tail.T  # transition, start and end: one product
        if "bias" in self._slices:
            G = G + u.sum(1) @ u.sum(1).T
        return G, rows

    def _sparse_batch_add(self, w: torch.Tensor, rows, u: torch.Tensor, tail: torch.Tensor,
                          coef: torch.Tensor) -> None:
        """``w += Phi^T coef`` of a sparse batch from its (block, attribute) ``rows``, unary parts and tails."""
        self._add_rows(self._part(w, "emission"), rows, coef)
        self._add_tail(w, u, tail, coef)

    def _add_tail(self, w: torch.Tensor, u: torch.Tensor, tail: torch.Tensor, coef: torch.Tensor) -> None:
        tail = tail.T @ coef  # transition, start and end: one product
        KK = self.K * self.K
        self._part(w, "transition").view(-1).add_(tail[:KK])
        if "start" in self._slices:
            lo, hi = self._slices["start"][0], self._slices["end"][1]
            w[lo:hi].add_(tail[KK:])
        if "bias" in self._slices:
            self._part(w, "bias").add_(u.sum(1).T @ coef)

    # -- a sparse batch from what determines its rows (`torchssvm.distributed`) -------------------------
    def sparse_batch(self, idx: torch.Tensor, z: torch.Tensor):
        """``(x, u, tail)``: what determines the rows ``Phi_b z_b`` of a sparse chain's blocks ``idx (B,)`` with
        ``z (B, m)``: their attributes ``x`` (`TokenFeatures` ``(B, T, A)``), unary parts ``u (B, T, K)`` (``T``: the
        batch's longest sentence) and tails ``tail (B, L)`` (transition, start and end parts that ``w`` has). Another
        process holding these values (e.g. received from the rank that holds the blocks) rebuilds the batch's Gram
        matrix and update with `sparse_batch_gram` and `sparse_batch_accumulate`, bitwise as `gram` and `accumulate`
        compute them here."""
        if not self.sparse:
            raise ValueError("sparse_batch: the problem's features are dense (its rows are `gram`'s own)")
        T = self._batch_T(idx)
        return self._x(idx, T), self._split(z, T)[0], z[:, self._tail]

    def sparse_batch_gram(self, x: TokenFeatures, u: torch.Tensor, tail: torch.Tensor):
        """``(G (B, B), rows)``: ``gram(idx, z)`` of the batch that `sparse_batch` describes by ``(x, u, tail)`` (the
        sentences padded to one length ``T``, ``-1`` ids beyond); ``rows`` (the batch's (block, attribute) rows) go
        to `sparse_batch_accumulate`. The same bits as `gram` on the problem that holds the blocks when ``u`` and
        ``tail`` are laid out as there, views of a fresh ``(B, m)`` of its ``m`` (a BLAS product's rounding can
        follow its operands' strides and alignment)."""
        return self._sparse_batch_gram(x, u, tail)

    def sparse_batch_accumulate(self, w: torch.Tensor, x: TokenFeatures, u: torch.Tensor, tail: torch.Tensor,
                                coef: torch.Tensor, rows=None) -> None:
        """``w += sum_b coef_b Phi_b z_b`` of the batch that ``(x, u, tail)`` describe (`sparse_batch`): the update
        `accumulate` makes after `gram` or `sqnorm`, bitwise. ``rows``: those `sparse_batch_gram` returned for the
        batch, if the caller has them."""
        if rows is None:
            rows = self._attribute_rows(x.ids, x.values, u)
        self._sparse_batch_add(w, rows, u, tail, coef.to(self.dtype))

    def sqnorm(self, idx: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        T = self._batch_T(idx)
        u = self._split(z, T)[0]
        if self.sparse:
            rows = self._attribute_rows(self.x.ids, self.x.values, u, index=idx)
            self._gram_memo = (idx, z, (idx._version, z._version), T, rows)  # for `accumulate`, as `gram`'s
            out = sparse_emission_sqnorm(self.x.ids, self.x.values, u, rows=rows)
        else:
            E = self._emission(idx, u, T)
            out = (E * E).sum(1)
        tail = z[:, self._tail]  # transition, start and end
        out = out + (tail * tail).sum(1)
        if "bias" in self._slices:
            out = out + (u.sum(1) ** 2).sum(1)
        return out

    def accumulate(self, w: torch.Tensor, idx: torch.Tensor, z: torch.Tensor, coef: torch.Tensor) -> None:
        T = self._batch_T(idx)
        coef = coef.to(self.dtype)
        memo = self._gram_memo_for(idx, z, T)
        self._gram_memo = None  # used once: do not keep the (B, d) features or the rows alive
        if memo is not None and not self.sparse:  # w += Phi^T coef with the joint features `gram` built for this z
            w.addmv_(memo.T, coef)
            return
        E = self._part(w, "emission")
        u = self._split(z, T)[0]
        if memo is not None:  # the (block, attribute) rows `gram` or `sqnorm` built for this z
            self._sparse_batch_add(w, memo, u, z[:, self._tail], coef)
            return
        if not self.sparse:  # one product over every token of the batch (no (B, d) matrix: any batch size)
            uc = u * coef.view(-1, 1, 1)
            E.add_(self._x(idx, T).reshape(-1, self.D).T @ uc.reshape(-1, self.K))
        else:  # one row per present token attribute
            uc = u * coef.view(-1, 1, 1)
            x = self._x(idx, T)
            ids = x.ids.reshape(-1)
            flat = ((x.ids >= 0) & (uc != 0).any(2).unsqueeze(2)).reshape(-1).nonzero().squeeze(1)
            vals = uc.reshape(-1, self.K).index_select(0, flat // x.ids.shape[2])
            if x.values is not None:
                vals = vals * x.values.reshape(-1)[flat].unsqueeze(1)
            E.index_add_(0, ids[flat], vals)
        self._add_tail(w, u, z[:, self._tail], coef)

    def _gram_memo_for(self, idx: torch.Tensor, z: torch.Tensor, T: int):
        """The attribute rows (sparse) or joint features (dense) of the last `gram` if it was called on these very,
        unmodified ``idx`` and ``z`` (the coordinated step calls gram, then accumulate on the same direction)."""
        memo = self._gram_memo
        if memo is None:
            return None
        m_idx, m_z, versions, m_T, rows = memo
        if _unmodified(m_idx, versions[0], idx) and _unmodified(m_z, versions[1], z) and m_T == T:
            return rows
        return None

    def max_loss(self, idx: torch.Tensor) -> torch.Tensor:
        return self.structure.unchecked.max_task_loss(self.truth[idx], self.lengths[idx])  # 0 for one label

    def block_losses(self, idx: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        # L_i(y) = sum_t aug[i, t, y_t] = <aug_i, m_unary(y)> with L_i(y_i) = 0: sum_y alpha L = -<aug_i, z_unary>
        u = z[:, : self._cut[0]].view(-1, self.T, self.K)
        return -(self.loss_aug[idx] * u).sum((1, 2))

    def block_violation(self, idx: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """The linear constraints every ``z_i = m(y_i) - mu_i`` meets (``mu_i`` a mixture of labellings' marginals):
        the unary marginals ``mu_t = onehot(y_it) - z_unary_t`` in [0, 1] with rows summing to 1 inside the length
        and 0 on padding; the start and end parts equal to the unary part at positions 0 and ``len - 1`` (one
        labelling's start is its first label); the mixture's transition counts ``N = m_trans(y_i) - z_trans``
        >= 0 with row sums ``sum_{t < len-1} mu_t`` and column sums ``sum_{t >= 1} mu_t``.

        Necessary, not sufficient: ``N`` sums the per-position pair marginals, and a table with these sums need
        not split into them (``a b a`` has the sums of ``a a`` and ``b b``), so `block_violation_exact` is False."""
        B, T, K = z.shape[0], self.T, self.K
        a, b, c = self._cut
        truth, L = self.truth[idx], self.lengths[idx]
        pos = torch.arange(T, device=z.device).unsqueeze(0)
        valid = (pos < L.unsqueeze(1)).unsqueeze(2)
        u = z[:, :a].view(B, T, K)
        mu = torch.where(valid, -u, 0.0)
        mu.scatter_add_(2, truth.clamp_min(0).unsqueeze(2), valid.to(z.dtype))
        pad = torch.where(valid, 0.0, u.abs()).amax((1, 2))
        box = torch.maximum((mu - 1).clamp_min(0), (-mu).clamp_min(0)).amax((1, 2))
        rows = torch.where(valid.squeeze(2), (mu.sum(2) - 1).abs(), 0.0).amax(1)
        trans, start, end = z[:, a:b].view(B, K, K), z[:, b:c], z[:, c:]
        last = u.gather(1, (L - 1).clamp_min(0).view(B, 1, 1).expand(B, 1, K)).squeeze(1)
        ends = torch.maximum((start - u[:, 0]).abs().amax(1), (end - last).abs().amax(1))
        # the truth's transition counts: N = counts - z_trans >= 0
        yc = truth.clamp_min(0)
        pair = (yc[:, :-1] * K + yc[:, 1:]) if T > 1 else yc[:, :0]
        inside = (pos[:, 1:] < L.unsqueeze(1)).to(z.dtype)
        counts = torch.zeros(B, K * K, dtype=z.dtype, device=z.device).scatter_add_(1, pair, inside).view(B, K, K)
        negative = (trans - counts).clamp_min(0).amax((1, 2))
        # row and column sums of z_trans: the unary parts at positions t < len - 1 and t >= 1
        head = torch.where(pos.unsqueeze(2) < (L - 1).view(B, 1, 1), u, 0.0).sum(1)
        tail = torch.where(pos.unsqueeze(2) >= 1, u, 0.0).sum(1)
        flows = torch.maximum((trans.sum(2) - head).abs().amax(1), (trans.sum(1) - tail).abs().amax(1))
        return torch.stack([pad, box, rows, ends, negative, flows], 1).amax(1)

    block_violation_exact = False
