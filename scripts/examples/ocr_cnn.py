"""Deep structured learning on OCR: a CNN over the 16x8 letter images gives the unary potentials of a
chain SSVM with learned transitions, trained with the structured hinge loss and AdamW.

An ordinary PyTorch loop: the library supplies the loss, the oracles, the data and the metrics.

    python scripts/examples/ocr_cnn.py --epochs 15 [--device cuda] [--root ../shared/data]

Logs train loss, train/test letter and word error, learning rate and seconds to TensorBoard
(``runs/ocr_cnn-*``), prints one line per epoch, and with ``--history`` saves the curves as JSON.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from torch import nn

import torchssvm as ts
from torchssvm.evaluation import evaluate_chain
from torchssvm.logging import log_scalars, make_writer, progress


class LetterCNN(nn.Module):
    """Unary potentials ``(B, T, 26)`` from letter images ``(B, T, 128)``, plus chain parameters.

    Only the real letters (``lengths``) go through the CNN; padding gets zero potentials.
    """

    def __init__(self, num_labels: int = 26, width: int = 32, dropout: float = 0.3):
        super().__init__()
        self.num_labels = num_labels
        self.features = nn.Sequential(
            nn.Conv2d(1, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.BatchNorm2d(2 * width), nn.ReLU(),
            nn.MaxPool2d(2),  # 8 x 4
            nn.Conv2d(2 * width, 4 * width, 3, padding=1), nn.BatchNorm2d(4 * width), nn.ReLU(),
            nn.MaxPool2d(2),  # 4 x 2
        )
        self.head = nn.Sequential(
            nn.Flatten(), nn.Dropout(dropout), nn.Linear(4 * width * 8, 256), nn.ReLU(), nn.Dropout(dropout),
            nn.Linear(256, num_labels),
        )
        self.transition = nn.Parameter(torch.zeros(num_labels, num_labels))
        self.start = nn.Parameter(torch.zeros(num_labels))
        self.end = nn.Parameter(torch.zeros(num_labels))

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> ts.ChainPotentials:
        B, T, _ = x.shape
        valid = torch.arange(T, device=x.device) < lengths.unsqueeze(1)
        letters = x[valid].view(-1, 1, 16, 8)
        unary = x.new_zeros(B, T, self.num_labels)
        unary[valid] = self.head(self.features(letters)).to(unary.dtype)
        return ts.ChainPotentials(unary, self.transition, self.start, self.end)


def forward(model, batch):
    return model(batch.x, batch.lengths)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--weight-decay", type=float, default=1e-4)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--root", default=None, help="data folder (default: $TORCHSSVM_DATA or the cache)")
    p.add_argument("--variant", default="large", choices=("large", "small"))
    p.add_argument("--logdir", default="runs")
    p.add_argument("--history", default=None, help="write per-epoch metrics to this JSON file")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--limit", type=int, default=None, help="use the first N train and test sequences (smoke test)")
    args = p.parse_args(argv)

    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    train = ts.data.ocr("train", args.variant, root=args.root)
    test = ts.data.ocr("test", args.variant, root=args.root)
    if args.limit:
        train, test = train.subset(range(args.limit)), test.subset(range(args.limit))
    print(f"{train!r}\n{test!r}\ndevice {device}")

    model = LetterCNN().to(device)
    chain = ts.Chain(26)
    criterion = ts.StructuredHingeLoss(chain)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    steps_per_epoch = (len(train) + args.batch_size - 1) // args.batch_size
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=args.epochs * steps_per_epoch)
    writer = make_writer(args.logdir, "ocr_cnn") if args.logdir else None
    gen = torch.Generator().manual_seed(args.seed)
    train_dev = train.to(device)
    history, step, t0 = [], 0, time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        model.train()
        total, count = 0.0, 0
        bar = progress(train_dev.batches(args.batch_size, shuffle=True, generator=gen), total=steps_per_epoch,
                       desc=f"epoch {epoch}/{args.epochs}")
        for batch in bar:
            loss = criterion(model(batch.x, batch.lengths), batch.y, batch.lengths)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            value = float(loss.detach())
            total += value * len(batch.lengths)
            count += len(batch.lengths)
            bar.set_postfix(loss=f"{value:.4f}")
            if writer is not None:
                writer.add_scalar("train/batch_loss", value, step)
        tr = evaluate_chain(model, chain, train, device=device, forward=forward)
        te = evaluate_chain(model, chain, test, device=device, forward=forward)
        row = {"epoch": epoch, "loss": total / count, "train_letter_error": tr["token_error"],
               "train_word_error": tr["sequence_error"], "test_letter_error": te["token_error"],
               "test_word_error": te["sequence_error"], "lr": sched.get_last_lr()[0],
               "seconds": time.perf_counter() - t0}
        history.append(row)
        log_scalars(writer, {"loss": row["loss"], "letter_error": tr["token_error"],
                             "word_error": tr["sequence_error"]}, epoch, "train")
        log_scalars(writer, {"letter_error": te["token_error"], "word_error": te["sequence_error"]}, epoch, "test")
        log_scalars(writer, {"lr": row["lr"], "seconds": row["seconds"]}, epoch, "train")
        print(f"epoch {epoch:3d}  loss {row['loss']:.4f}  train letter error {tr['token_error']:.4f}  "
              f"test letter error {te['token_error']:.4f}  test word error {te['sequence_error']:.4f}  "
              f"({row['seconds']:.0f}s)", flush=True)
    if writer is not None:
        writer.close()
    if args.history:
        with open(args.history, "w") as f:
            json.dump({"args": vars(args), "device": str(device), "history": history}, f, indent=2)
    return history


if __name__ == "__main__":
    main()
