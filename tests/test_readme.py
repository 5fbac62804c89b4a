"""The README runs as written: every ``python`` block executes on its own (a fresh namespace, an empty working
folder, the data found as a user's would be, through ``$TORCHSSVM_DATA``), every ``torchssvm`` command of a
``bash`` block runs through the CLI, the fresh-machine test command is the one CI runs, and the page carries no
references a reader cannot follow."""

import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from torchssvm.cli import main

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
BLOCKS = re.findall(r"^```(\w*)\n(.*?)^```", README, re.S | re.M)
PYTHON = [code for lang, code in BLOCKS if lang == "python"]
COMMANDS = [line for lang, code in BLOCKS if lang == "bash" for line in code.splitlines()
            if line.startswith("torchssvm ")]
# the loaders of the data sets the README reads from files (the others are synthetic)
DATA_LOADERS = ("ts.data.ocr(", "ts.data.yeast(", "ts.data.a9a(", "ts.data.conll2000(")


def test_readme_has_code_to_run():
    assert len(PYTHON) >= 6 and COMMANDS, (len(PYTHON), COMMANDS)


def _launched(code: str) -> bool:
    """A block that is a script for ``torchrun`` (it starts with ``# name.py`` and joins a process group)."""
    return bool(re.match(r"# \w+\.py\n", code)) and "init_process_group" in code


@pytest.mark.parametrize("k", range(len(PYTHON)), ids=lambda k: f"block{k}")
def test_python_block_runs_as_written(k, tmp_path, monkeypatch, request, capsys):
    code = PYTHON[k]
    if _launched(code):  # as the README says: torchrun --nproc-per-node 2 <name>.py
        script = tmp_path / code.split("\n", 1)[0][2:]
        script.write_text(code, encoding="utf-8")
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        t0 = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                               "2", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert "History(" in done.stdout
        with capsys.disabled():
            print(f"\nREADME block {k} (torchrun, 2 processes): {time.perf_counter() - t0:.1f} s")
        return
    if any(loader in code for loader in DATA_LOADERS):
        monkeypatch.setenv("TORCHSSVM_DATA", request.getfixturevalue("data_root"))
    if "sklearn" in code:
        pytest.importorskip("sklearn")
    monkeypatch.chdir(tmp_path)  # what a block writes (runs/, checkpoints) lands here, not in the checkout
    t0 = time.perf_counter()
    exec(compile(code, f"README.md python block {k}", "exec"), {"__name__": "__main__"})
    printed = capsys.readouterr().out
    with capsys.disabled():
        print(f"\nREADME block {k}: {time.perf_counter() - t0:.1f} s")
    if "print(" in code:
        assert printed.strip(), "a block that prints printed nothing"


@pytest.mark.parametrize("line", COMMANDS)
def test_command_runs_as_written(line, tmp_path, monkeypatch, request):
    if "--data ocr" in line or "--data conll" in line:
        monkeypatch.setenv("TORCHSSVM_DATA", request.getfixturevalue("data_root"))
    monkeypatch.chdir(tmp_path)
    assert main(shlex.split(line)[1:]) == 0


def test_fresh_machine_commands_are_those_ci_runs():
    """The README keeps the two fresh-machine commands; the test command is the one `.ci/run` runs."""
    bash = [code.strip() for lang, code in BLOCKS if lang == "bash"]
    demo = "python3 -m pip install torch==2.13.0 && python3 -m pip install -e . && torchssvm demo"
    tests = ('python3 -m pip install torch==2.13.0 && python3 -m pip install -e ".[dev]" && '
             "TRITON_INTERPRET=1 python3 -m pytest -q -n auto --dist worksteal")
    assert demo in bash and tests in bash
    assert tests in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def test_no_references_a_reader_cannot_follow():
    for pattern in (r"\.\./shared", r"\bseeds? 0\d\d\b", r"\bstop \d+\b", r"\bnote 0\d\d\b", r"design notes"):
        assert not re.search(pattern, README), pattern
    for link in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README):  # every relative link points into the repository
        if not link.startswith(("http://", "https://")):
            assert (ROOT / link).exists(), link
