"""Plot the curves of the deep examples from their ``--history`` JSON files into PNGs.

    python scripts/plot_deep.py docs/benchmarks/deep_ocr_cnn.json docs/benchmarks/deep_conll_bilstm.json

Writes ``<name>.png`` beside each JSON file.
"""

from __future__ import annotations

import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_ocr(data, path):
    h = data["history"]
    ep = [r["epoch"] for r in h]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    axes[0].plot(ep, [r["loss"] for r in h], marker="o")
    axes[0].set_title("train hinge loss")
    for key, label in [("train_letter_error", "train letter"), ("test_letter_error", "test letter"),
                       ("test_word_error", "test word")]:
        axes[1].plot(ep, [100 * r[key] for r in h], marker="o", label=label)
    axes[1].set_title("error (%)")
    axes[1].set_yscale("log")
    axes[1].legend()
    for ax in axes:
        ax.set_xlabel("epoch")
    fig.suptitle(f"OCR-large, CNN + chain SSVM ({data['device']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_conll(data, path):
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for name, h in data["results"].items():
        ep = [r["epoch"] for r in h]
        label = "SSVM (hinge)" if name == "hinge" else "CRF (NLL)"
        axes[0].plot(ep, [r["test_chunk_f1"] for r in h], marker="o", label=label)
        axes[1].plot(ep, [r["epoch_seconds"] for r in h], marker="o", label=label)
    axes[0].set_title("test chunk F1 (conlleval)")
    axes[1].set_title("seconds per training epoch")
    for ax in axes:
        ax.set_xlabel("epoch")
        ax.legend()
    fig.suptitle(f"CoNLL-2000 chunking, BiLSTM + chain ({data['device']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(paths):
    for p in paths:
        with open(p) as f:
            data = json.load(f)
        out = os.path.splitext(p)[0] + ".png"
        (plot_conll if "results" in data else plot_ocr)(data, out)
        print(out)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("histories", nargs="+", help="the json histories written by scripts/examples/*.py")
    main(ap.parse_args().histories)
