"""TensorBoard output: the tags a solver and the recipes write, the certificate layout (Custom Scalars) and the
hyperparameters (HParams) in the run's own folder; estimates never under a certified tag (docs/tensorboard.md)."""

import math
import re
from pathlib import Path

import pytest
import torch

import torchssvm as ts
from torchssvm.logging import add_certificate_layout, certificate_layout, final_metrics, log_hparams

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402
from tensorboard.plugins.custom_scalar import layout_pb2  # noqa: E402
from tensorboard.plugins.hparams import plugin_data_pb2  # noqa: E402
from torch.utils.tensorboard import SummaryWriter  # noqa: E402

# what BCFW writes (docs/tensorboard.md): exact values under their names, the estimates between exact passes under
# ``*_estimate``; ``exact_gap`` repeats the certified gap at the passes that computed it
BCFW_SCALARS = {"bcfw/primal", "bcfw/dual", "bcfw/gap", "bcfw/exact_gap", "bcfw/primal_estimate",
                "bcfw/gap_estimate", "bcfw/passes", "bcfw/oracle_calls", "bcfw/cache_hit_rate", "bcfw/time"}
CERTIFIED = ("primal", "dual", "gap", "exact_gap", "duality_gap")


def _load(path) -> EventAccumulator:
    acc = EventAccumulator(str(path), size_guidance={"scalars": 0, "tensors": 0, "histograms": 0})
    acc.Reload()
    return acc


def _layout(acc) -> layout_pb2.Layout:
    (event,) = acc.Tensors("custom_scalars__config__")
    layout = layout_pb2.Layout()
    layout.ParseFromString(event.tensor_proto.string_val[0])
    return layout


def _hparams(acc) -> tuple:
    content = acc.PluginTagToContent("hparams")
    exp = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"]).session_start_info
    return exp, start


def _charts(layout) -> dict:
    return {chart.title: list(chart.multiline.tag) for cat in layout.category for chart in cat.chart}


def _tiny_bcfw(writer, **kwargs):
    ds = ts.data.synthetic_chain("train", 12, num_labels=3, num_features=4, max_length=6, seed=0)
    model = ts.LinearChainModel(4, 3, dtype=torch.float64)
    return ts.optim.BCFW(model, ds, lam=0.1, seed=0, writer=writer, **kwargs)


def test_bcfw_writes_the_documented_tags_estimates_apart_and_the_layout_matches_them(tmp_path):
    writer = SummaryWriter(log_dir=str(tmp_path / "run"))
    layout = add_certificate_layout(writer, ("bcfw",))
    s = _tiny_bcfw(writer, gap_check_every=2)
    reports = [s.step() for _ in range(3)]
    writer.close()
    assert [r["gap_exact"] for r in reports] == [False, True, False]
    acc = _load(tmp_path / "run")
    scalars = set(acc.Tags()["scalars"])
    assert scalars == BCFW_SCALARS
    assert sorted(acc.Tags()["histograms"]) == ["bcfw/block_gaps", "bcfw/block_gaps_estimate"]
    assert [e.step for e in acc.Histograms("bcfw/block_gaps")] == [2]
    # an estimate is never under a certified name: the certified tags hold the exact passes only (pass 2)
    for name in ("primal", "gap", "exact_gap"):
        assert [e.step for e in acc.Scalars(f"bcfw/{name}")] == [2]
    # pass 1's estimate is +inf (no block gap seen yet): not finite, not logged
    assert [e.step for e in acc.Scalars("bcfw/gap_estimate")] == [3]
    assert [e.step for e in acc.Scalars("bcfw/primal_estimate")] == [3]
    assert [e.step for e in acc.Scalars("bcfw/dual")] == [1, 2, 3]  # the dual value is exact at every pass
    exact = acc.Scalars("bcfw/gap")[0].value
    assert math.isclose(exact, reports[1]["gap"], rel_tol=1e-6)
    assert math.isclose(acc.Scalars("bcfw/primal_estimate")[0].value, reports[2]["primal"], rel_tol=1e-6)
    # the layout, read back from the run, is what was written and puts primal, dual and both gaps on one chart
    charts = _charts(_layout(acc))
    assert charts == {title: spec[1] for cat in layout.values() for title, spec in cat.items()}
    (one,) = [tags for title, tags in charts.items() if "primal, dual and gap" in title]
    matched = {t for t in scalars if any(re.search(rx, t) for rx in one)}
    assert matched == {"bcfw/primal", "bcfw/dual", "bcfw/gap", "bcfw/exact_gap", "bcfw/primal_estimate",
                       "bcfw/gap_estimate"}
    assert any(re.search(rx, "certificate/duality_gap") for rx in one)
    (gaps,) = [tags for title, tags in charts.items() if "duality gap" in title]
    assert {t for t in scalars if any(re.search(rx, t) for rx in gaps)} == {"bcfw/gap", "bcfw/exact_gap",
                                                                            "bcfw/gap_estimate"}


def test_the_documented_tags_are_in_the_tag_list_page():
    """Each tag BCFW writes is in the page's table, when the page is next to the tests (a source checkout)."""
    page = Path(__file__).resolve().parents[1] / "docs" / "tensorboard.md"
    if not page.exists():
        pytest.skip("docs/tensorboard.md is not next to the tests (an installed package)")
    text = page.read_text()
    for tag in sorted(BCFW_SCALARS | {"bcfw/block_gaps", "certificate/duality_gap"}):
        name = tag.replace("bcfw/", "{tag}/")
        assert f"`{name}`" in text, tag


def test_recipe_run_holds_layout_hparams_and_final_metrics_in_one_folder(tmp_path):
    train = ts.data.synthetic_chain("train", 12, num_labels=3, num_features=4, max_length=6, seed=0)
    test = ts.data.synthetic_chain("test", 6, num_labels=3, num_features=4, max_length=6, seed=0)
    run = ts.recipes.train_chain_dual(train, test, solver="bcfw", lam=0.1, passes=2, logdir=str(tmp_path),
                                      run_name="tiny", seed=3)
    (folder,) = [p for p in tmp_path.iterdir()]
    assert run.logdir == str(folder)
    assert [p.is_file() for p in folder.iterdir()] == [True]  # one event file, no hparams sub-run folder
    acc = _load(folder)
    scalars = set(acc.Tags()["scalars"])
    assert {"bcfw/dual", "bcfw/gap_estimate", "certificate/duality_gap", "train/error", "test/error"} <= scalars
    exp, start = _hparams(acc)
    assert start.hparams["solver"].string_value == "bcfw"
    assert start.hparams["lam"].number_value == pytest.approx(0.1)
    assert start.hparams["passes"].number_value == 2 and start.hparams["seed"].number_value == 3
    assert "gap_tol" not in start.hparams  # None: not set, left out
    metric_tags = {m.name.tag for m in exp.metric_infos}
    assert {"final/gap", "final/primal", "final/dual", "final/test_error"} <= metric_tags <= scalars
    last = run.metrics
    for key in ("gap", "primal", "dual", "test_error"):
        (event,) = acc.Scalars(f"final/{key}")
        assert event.step == 2 and event.value == pytest.approx(last[key], rel=1e-6)
    # the certified gap of the recipe is the exact one: the final gap is the last certificate/duality_gap
    assert acc.Scalars("certificate/duality_gap")[-1].value == pytest.approx(last["gap"], rel=1e-6)
    charts = _charts(_layout(acc))
    rx = [r for title, tags in charts.items() if "primal, dual and gap" in title for r in tags]
    assert {t for t in scalars if any(re.search(r, t) for r in rx)} >= {"bcfw/dual", "bcfw/gap_estimate",
                                                                        "certificate/duality_gap"}
    assert any(all(re.search(r, t) is None for r in rx) for t in ("train/error",))
    (err,) = [tags for title, tags in charts.items() if title.startswith("error")]
    assert {t for t in scalars if any(re.search(r, t) for r in err)} == {"train/error", "test/error"}


def test_estimates_never_use_certified_names(tmp_path):
    """A run of estimates only (no exact pass yet) writes no certified tag, and the layout's regexes tell the two
    apart: an estimate tag ends in ``_estimate``, a certified one never does."""
    writer = SummaryWriter(log_dir=str(tmp_path))
    s = _tiny_bcfw(writer, gap_check_every=10, sampling="gap")
    reports = [s.step() for _ in range(3)]
    writer.close()
    assert not any(r["gap_exact"] for r in reports)
    scalars = set(_load(tmp_path).Tags()["scalars"])
    assert {"bcfw/gap_estimate", "bcfw/primal_estimate", "bcfw/dual"} <= scalars
    assert not scalars & {f"bcfw/{name}" for name in CERTIFIED if name != "dual"}
    for tag in ("bcfw", "fw", "nslack", "pragam_b"):
        (one, gaps) = [rxs for kind, rxs in certificate_layout((tag,))[f"certificate: {tag}"].values()]
        for name in ("primal", "dual", "gap", "exact_gap"):
            assert any(re.search(r, f"{tag}/{name}") for r in one)
            assert any(re.search(r, f"{tag}/{name}_estimate") for r in one)
        assert any(re.search(r, "certificate/duality_gap") for r in one + gaps)
        assert not any(re.search(r, t) for r in one + gaps for t in (f"{tag}/passes", f"x{tag}/gap", f"{tag}/gaps"))


def test_log_hparams_writes_into_the_writers_own_folder(tmp_path):
    writer = SummaryWriter(log_dir=str(tmp_path))
    writer.add_scalar("bcfw/dual", 0.5, 1)
    log_hparams(writer, {"solver": "bcfw", "lam": 0.01, "passes": 8, "cache": True},
                {"gap": 1e-3, "test_error": 0.25}, step=8)
    writer.close()
    assert all(p.is_file() for p in tmp_path.iterdir())
    acc = _load(tmp_path)
    exp, start = _hparams(acc)
    assert {h.name for h in exp.hparam_infos} == {"solver", "lam", "passes", "cache"}
    assert start.hparams["solver"].string_value == "bcfw"
    assert start.hparams["lam"].number_value == pytest.approx(0.01)
    assert start.hparams["passes"].number_value == 8
    assert {m.name.tag for m in exp.metric_infos} == {"final/gap", "final/test_error"}
    assert acc.Scalars("final/gap")[0].value == pytest.approx(1e-3) and acc.Scalars("final/gap")[0].step == 8
    assert acc.Scalars("final/test_error")[0].value == pytest.approx(0.25)


def test_final_metrics_keeps_finite_numbers():
    assert final_metrics({"gap": 1e-3, "pass": 2, "ok": True, "name": "x", "bad": float("nan")}) == \
        {"gap": 1e-3, "pass": 2.0}


@pytest.mark.parametrize("args, match", [
    (({"lam": [0.1]}, {}), r"hparams\['lam'\]"),
    (({"lam": None}, {}), r"hparams\['lam'\]"),
    (({1: 0.1}, {}), "hparams keys"),
    ((["lam"], {}), "hparams must be a dict"),
    (({}, {"gap": "small"}), r"metrics\['gap'\]"),
    (({}, {"converged": True}), r"metrics\['converged'\]"),
    (({}, [("gap", 1.0)]), "metrics must be a dict"),
])
def test_log_hparams_refuses_bad_arguments(tmp_path, args, match):
    with SummaryWriter(log_dir=str(tmp_path)) as writer:
        with pytest.raises(TypeError, match=match):
            log_hparams(writer, *args)


def test_bad_writer_and_layout_arguments_raise(tmp_path):
    with pytest.raises(TypeError, match="writer must be"):
        log_hparams(object(), {}, {})
    with pytest.raises(TypeError, match="writer must be"):
        add_certificate_layout(None)
    with pytest.raises(TypeError, match="tags must be a sequence"):
        certificate_layout("bcfw")
    with pytest.raises(TypeError, match="tags must hold"):
        certificate_layout(("bcfw/",))
    with pytest.raises(TypeError, match="metrics must be a sequence"):
        certificate_layout(("bcfw",), "error")
    with SummaryWriter(log_dir=str(tmp_path)) as writer:
        with pytest.raises(TypeError, match="step must be"):
            log_hparams(writer, {}, {}, step=1.5)
        with pytest.raises(TypeError, match="prefix must be"):
            log_hparams(writer, {}, {}, prefix=None)
