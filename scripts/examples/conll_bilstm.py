"""CoNLL-2000 chunking with word + POS embeddings, a BiLSTM and a chain on top, trained twice with the
same network, data order and optimizer: once with the structured hinge loss (SSVM) and once with the
CRF negative log-likelihood (forward algorithm over the same chain potentials) as the comparison.

    python scripts/examples/conll_bilstm.py --epochs 8 [--device cuda] [--loss hinge|crf|both]
        [--transition shared|per-position] [--hamming normalized|count]

Prints test chunk F1 (conlleval) and seconds per epoch for each loss, logs both to TensorBoard
(``runs/conll_bilstm-<loss>-*``), and with ``--history`` saves the curves as JSON.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import torchssvm as ts
from torchssvm.evaluation import evaluate_chain
from torchssvm.logging import log_scalars, make_writer, progress


class BiLSTMTagger(nn.Module):
    """Chain potentials from token ids ``(B, T, 2)`` (word, POS).

    ``transition="shared"``: one learned ``(K, K)`` matrix. ``"per-position"``: the shared matrix plus an
    input-dependent term ``(B, T-1, K, K)`` that is bilinear in the BiLSTM states of the two adjacent
    tokens (low rank ``r``), so the transition scores depend on the words around each boundary.
    """

    def __init__(self, num_words, num_pos, num_labels, *, word_dim=100, pos_dim=32, hidden=128, dropout=0.3,
                 transition="shared", rank=8):
        super().__init__()
        self.word = nn.Embedding(num_words, word_dim)
        self.pos = nn.Embedding(num_pos, pos_dim)
        self.lstm = nn.LSTM(word_dim + pos_dim, hidden, batch_first=True, bidirectional=True)
        self.drop = nn.Dropout(dropout)
        self.out = nn.Linear(2 * hidden, num_labels)
        self.transition = nn.Parameter(torch.zeros(num_labels, num_labels))
        self.start = nn.Parameter(torch.zeros(num_labels))
        self.end = nn.Parameter(torch.zeros(num_labels))
        self.per_position = transition == "per-position"
        if self.per_position:
            self.left = nn.Linear(2 * hidden, rank * num_labels)
            self.right = nn.Linear(2 * hidden, rank * num_labels)
            self.rank, self.num_labels = rank, num_labels

    def forward(self, x, lengths):
        B, T, _ = x.shape
        e = self.drop(torch.cat([self.word(x[..., 0]), self.pos(x[..., 1])], dim=-1))
        packed = pack_padded_sequence(e, lengths.cpu(), batch_first=True, enforce_sorted=False)
        h, _ = self.lstm(packed)
        h, _ = pad_packed_sequence(h, batch_first=True, total_length=T)
        h = self.drop(h)
        unary = self.out(h)
        transition = self.transition
        if self.per_position and T > 1:
            K, r = self.num_labels, self.rank
            a = self.left(h[:, :-1]).view(B, T - 1, r, K)
            b = self.right(h[:, 1:]).view(B, T - 1, r, K)
            transition = self.transition + torch.einsum("btri,btrj->btij", a, b) / r
        return ts.ChainPotentials(unary, transition, self.start, self.end)


def forward(model, batch):
    return model(batch.x, batch.lengths)


def train_one(loss_name, train, test, args, device):
    torch.manual_seed(args.seed)
    chain = ts.Chain(train.num_labels, normalize=args.hamming == "normalized")
    model = BiLSTMTagger(len(train.meta["words"]), len(train.meta["pos"]), train.num_labels,
                         transition=args.transition).to(device)
    criterion = ts.StructuredHingeLoss(chain) if loss_name == "hinge" else ts.CRFLoss(chain)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    writer = make_writer(args.logdir, f"conll_bilstm-{loss_name}") if args.logdir else None
    gen = torch.Generator().manual_seed(args.seed)
    steps = (len(train) + args.batch_size - 1) // args.batch_size
    train_dev = train.to(device)
    history, step = [], 0
    for epoch in range(1, args.epochs + 1):
        model.train()
        t0 = time.perf_counter()
        total = 0.0
        bar = progress(train_dev.batches(args.batch_size, shuffle=True, generator=gen), total=steps,
                       desc=f"{loss_name} epoch {epoch}/{args.epochs}")
        for batch in bar:
            x = batch.x
            if args.word_dropout > 0:  # unknown-word dropout: teaches the <unk> embedding
                drop = torch.rand(x.shape[:2], device=x.device) < args.word_dropout
                x = x.clone()
                x[..., 0] = torch.where(drop, torch.zeros_like(x[..., 0]), x[..., 0])
            loss = criterion(model(x, batch.lengths), batch.y, batch.lengths)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            opt.step()
            step += 1
            value = float(loss.detach())
            total += value * len(batch.lengths)
            bar.set_postfix(loss=f"{value:.4f}")
        if device.type == "cuda":
            torch.cuda.synchronize()
        epoch_seconds = time.perf_counter() - t0
        te = evaluate_chain(model, chain, test, device=device, forward=forward)
        row = {"epoch": epoch, "loss": total / len(train), "epoch_seconds": epoch_seconds,
               "test_chunk_f1": te["chunk_f1"], "test_token_error": te["token_error"]}
        history.append(row)
        log_scalars(writer, {"loss": row["loss"], "epoch_seconds": epoch_seconds}, epoch, "train")
        log_scalars(writer, {"chunk_f1": te["chunk_f1"], "token_error": te["token_error"]}, epoch, "test")
        print(f"{loss_name:5s} epoch {epoch:2d}  loss {row['loss']:.4f}  test chunk F1 {te['chunk_f1']:.2f}  "
              f"token error {te['token_error']:.4f}  ({epoch_seconds:.1f}s/epoch)", flush=True)
    if writer is not None:
        writer.close()
    return history


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--word-dropout", type=float, default=0.05)
    p.add_argument("--loss", choices=("hinge", "crf", "both"), default="both")
    p.add_argument("--transition", choices=("shared", "per-position"), default="shared")
    p.add_argument("--hamming", choices=("normalized", "count"), default="normalized",
                   help="hinge task loss: Hamming divided by the length (the papers') or the raw count")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--root", default=None)
    p.add_argument("--logdir", default="runs")
    p.add_argument("--history", default=None, help="write per-epoch metrics of every loss to this JSON file")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--limit", type=int, default=None, help="use the first N train and test sequences (smoke test)")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    train = ts.data.conll2000("train", features="tokens", root=args.root)
    test = ts.data.conll2000("test", features="tokens", root=args.root)
    if args.limit:
        train, test = train.subset(range(args.limit)), test.subset(range(args.limit))
    print(f"{train!r}\n{test!r}\ndevice {device}, transition {args.transition}")
    results = {}
    for name in (["hinge", "crf"] if args.loss == "both" else [args.loss]):
        results[name] = train_one(name, train, test, args, device)
    for name, hist in results.items():
        best = max(hist, key=lambda r: r["test_chunk_f1"])
        mean_epoch = sum(r["epoch_seconds"] for r in hist) / len(hist)
        print(f"{name}: final test chunk F1 {hist[-1]['test_chunk_f1']:.2f} (best {best['test_chunk_f1']:.2f} at "
              f"epoch {best['epoch']}), {mean_epoch:.1f} s/epoch")
    if args.history:
        with open(args.history, "w") as f:
            json.dump({"args": vars(args), "device": str(device), "results": results}, f, indent=2)
    return results


if __name__ == "__main__":
    main()
