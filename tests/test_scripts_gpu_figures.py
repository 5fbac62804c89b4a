"""The report writers of the GPU benchmark scripts: what they do with partial runs and new output folders."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))


def test_time_to_gap_report_draws_a_run_without_an_exact_gap(tmp_path):
    """A run stopped by its budget before its first exact gap has no point to draw: the report still writes
    its plot and its table row instead of failing on a log axis without data."""
    pytest.importorskip("matplotlib")
    import bench_bcfw_time_to_gap as ttg

    results = {"meta": {"machine": "test CPU, 2 cores; device test GPU; torch x", "device": "cuda", "suffix": "_cuda",
                        "tol": 1e-3, "config": ttg.CONFIG, "code": "abc1234", "args": "--device cuda"},
               "settings": {"ocr-large": [{"batch_size": 256, "curve": [], "time_to_tol": None, "passes": 2.0,
                                           "visit_passes": 4, "gap": 0.8, "primal": 1.0, "cache_hit_rate": 0.5,
                                           "wall": 12.0, "budget": 10.0}]}}
    ttg.report(results, tmp_path, None)
    assert (tmp_path / "bcfw_time_to_gap_ocr-large_cuda.png").stat().st_size > 0
    md = (tmp_path / "bcfw_time_to_gap_cuda.md").read_text()
    assert "| CUDA | 256 | not reached in 10 | 2.0 | 4 |" in md


def test_report_host_syncs_makes_its_output_folder(tmp_path, monkeypatch):
    """``--out DIR`` with DIR (and its parent) not there yet: the folder is made, json and md are written."""
    import report_host_syncs

    def fake_measure(B, config, n, passes):
        return {"B": B, "per_minibatch": 2.0, "sites": {"torchssvm/optim/frank_wolfe/bcfw.py:1": 2.0},
                "launches_per_minibatch": 10.0, "launch_sites": {"BCFW._update": 10.0}}

    monkeypatch.setattr(report_host_syncs, "measure", fake_measure)
    out = tmp_path / "new" / "folder"
    report_host_syncs.main(["--batch-sizes", "4", "--n", "8", "--passes", "1", "--out", str(out)])
    assert (out / "host_syncs.json").exists()
    assert "| 4 | 2.0 | 0.50 | 10 |" in (out / "host_syncs.md").read_text()


def test_profile_box_qp_dry_run_on_the_cpu(tmp_path):
    """The QP profile on the CPU at a small B: the kernels' shares are fractions of one trace, the Cholesky is
    reported to have worked (a failed one would be timed short), the report has one row per B; a size below 1 is
    refused by name."""
    import profile_box_qp

    B = 12
    profile_box_qp.main(["--device", "cpu", "--batch-sizes", str(B), "--repeats", "1", "--max-iter", "2",
                         "--out", str(tmp_path)])
    results = json.loads((tmp_path / "profile_box_qp_cpu.json").read_text())
    (size,) = results["sizes"]
    assert size["B"] == B and size["qp_ms"] > 0 and set(size["solve_ms"]) >= {"lu_f64", "cholesky_f64"}
    assert 0 < sum(k["share"] for k in size["kernels"]) <= 1 + 1e-9
    assert size["cholesky_failed"] == {"float64": False, "float32": False}
    assert (tmp_path / "profile_box_qp_cpu.md").read_text().count(f"\n| {B} | ") == 1
    with pytest.raises(SystemExit):
        profile_box_qp.main(["--device", "cpu", "--batch-sizes", "0", "--out", str(tmp_path)])
