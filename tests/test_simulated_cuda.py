"""The simulated CUDA device (`simulated_cuda`) that CI runs `tests/test_gpu.py` on: it must compute what the CPU
computes, refuse what a GPU refuses, and count the host synchronisations; and the mini-batch BCFW step's count
of them, which on a GPU is the step's fixed cost."""

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import torchssvm as ts
from torchssvm.testing import SimulatedCudaTensor, simulated_cuda


def test_device_tensors_compute_what_the_cpu_computes():
    g = torch.Generator().manual_seed(0)
    x, idx = torch.randn(4, 5, 3, generator=g), torch.tensor([2, 0])
    ref = x.clone()
    ref[:, idx] = ref[:, [1, 3]] * 2
    ref = ref.unsqueeze(0)
    with simulated_cuda() as mode:
        d = x.to("cuda", non_blocking=True)
        assert isinstance(d, SimulatedCudaTensor) and d.device == torch.device("cuda", 0) and d.is_cuda
        d[:, idx.cuda(non_blocking=True)] = d[:, torch.tensor([1, 3]).to("cuda", non_blocking=True)] * 2
        assert d.unsqueeze_(0) is d and d.shape == ref.shape  # in-place shape changes follow the data
        assert torch.zeros(3, device=d.device).device == d.device
        w = torch.ones(5, 3, device="cuda", requires_grad=True)
        (w * d).sum().backward()
        d[d > 1e9] = 0.0  # a Python value through a mask: CUDA's masked_fill_
        assert mode.syncs == 0  # none of the above waits for the device
        assert torch.equal(d.cpu(), ref) and type(d.cpu()) is torch.Tensor
        assert torch.equal(w.grad.cpu(), ref.sum((0, 1)))
        assert mode.syncs == 3  # the copies to the host
        bool((d > 0).any()), d.sum().item(), d[d > 0], d.tolist()
        assert mode.syncs == 7
        # blocking copies from the host: a plain .to("cuda"), torch.tensor(device=), CPU index tensors and lists
        x.to("cuda"), torch.tensor([1.0], device="cuda"), d[0][idx], d[0, :, [1, 3]]
        assert mode.syncs == 11
        d[d > 0] = d[d > 0] * 2  # a boolean-mask read, and a write of device values
        assert mode.syncs == 13
        assert torch.equal(d.cpu(), torch.where(ref > 0, 2 * ref, ref))


def test_tensor_factories_on_device_tensors_behave_as_on_a_gpu():
    """torch.as_tensor of a device tensor is that tensor, torch.tensor of one a device copy (neither waits), and
    torch.tensor(..., device="cuda", requires_grad=True) is a leaf that an optimizer takes."""
    with simulated_cuda() as mode:
        d = torch.arange(4.0, device="cuda")
        assert torch.as_tensor(d) is d and torch.as_tensor(d, device="cuda") is d
        c = torch.tensor(d)
        assert c.is_cuda and c is not d and torch.equal(c.cpu(), torch.arange(4.0))
        assert torch.as_tensor(d, dtype=torch.float64).dtype == torch.float64
        syncs = mode.syncs
        torch.as_tensor(d), torch.tensor(d), torch.tensor(d, dtype=torch.float64)
        assert mode.syncs == syncs
        w = torch.tensor([1.0, 2.0], device="cuda", requires_grad=True)
        assert w.is_leaf and w.requires_grad and w.is_cuda
        (w * 2).sum().backward()
        assert torch.equal(w.grad.cpu(), torch.tensor([2.0, 2.0]))
        torch.optim.SGD([w], lr=0.1).step()
    with pytest.raises(RuntimeError, match="outside simulated_cuda"):
        d.tolist()


def test_a_number_assigned_into_a_device_tensor_is_a_copy_from_the_host():
    """``t[0] = 1.0`` copies a 0-dim host tensor into the device tensor: on CUDA a blocking copy (a wait) that a
    graph capture refuses; ``t[0].fill_(1.0)`` launches a fill and reads nothing."""
    with simulated_cuda() as mode:
        t = torch.zeros(3, device="cuda")
        before = mode.syncs
        t[0].fill_(1.0)
        t[1:].fill_(2.0)
        assert mode.syncs == before
        t[0] = 1.0
        assert mode.syncs == before + 1
        t.copy_(torch.ones(3))
        assert mode.syncs == before + 2
        assert t.cpu().tolist() == [1.0, 1.0, 1.0]


def test_kernel_launches_are_counted_by_function():
    """Ops that would run a kernel count; views and bare allocations do not."""
    def work():
        x = torch.ones(3, 4, device="cuda")  # a fill
        x.t().unsqueeze(0)[0, :, 1:]  # views
        torch.empty(5, device="cuda")
        return (x * 2).sum()  # two kernels

    with simulated_cuda() as mode:
        work()
        assert mode.launches == 3 and mode.launch_sites == {"<outside the library>": 3}


def test_library_sites_are_the_package_directories_not_a_folder_name():
    """Library code is what lies under the directories of `torchssvm` and `torchssvm.kernels`: a test or script in
    a checkout (or any folder) called ``torchssvm`` is not, whatever the path's folder names say."""
    from torchssvm import kernels
    from torchssvm.optim.frank_wolfe import bcfw
    from torchssvm.testing.simulated_cuda import _library_site

    def site(*files):  # the innermost frame first
        frame = None
        for name in reversed(files):
            frame = SimpleNamespace(f_code=SimpleNamespace(co_filename=name), f_back=frame, f_lineno=7)
        return _library_site(frame, lambda f: f.f_lineno)

    package, kernels = Path(ts.__file__).parent, Path(kernels.__file__).parent
    outside = ["/tmp/x/torchssvm/tests/foo.py", "/tmp/torchssvm/kernels/foo.py", "/torchssvm/losses.py", "<string>",
               str(package / "testing" / "simulated_cuda.py"), str(package.parent / "tests" / "test_x.py")]
    for name in outside:
        assert site(name) == "<outside the library>", name
    assert site(*outside, bcfw.__file__) == "optim/frank_wolfe/bcfw.py:7"
    assert site(str(package / "losses.py")) == "torchssvm/losses.py:7"
    assert site(str(kernels / "chain" / "dispatch.py"), bcfw.__file__) == "kernels/chain/dispatch.py:7"


def test_mixing_devices_raises_as_on_a_gpu():
    with simulated_cuda():
        d = torch.ones(3, device="cuda")
        with pytest.raises(RuntimeError, match="same device"):
            d + torch.ones(3)  # a tensor made without device=
        assert (d * torch.tensor(2.0)).device == d.device  # 0-dim CPU tensors are allowed, as on CUDA
        assert d[torch.tensor([0, 2])].shape == (2,)  # CPU index tensors too
        with pytest.raises(TypeError, match="numpy"):
            d.numpy()


def _syncs_per_pass(B, **config):
    ds = ts.data.synthetic_chain("train", 128, num_labels=8, num_features=20, seed=0)
    assert len(set(ds.lengths.tolist())) > 1  # ragged: the oracle's masked paths run
    with simulated_cuda() as mode:
        model = ts.LinearChainModel(ds.num_features, ds.num_labels, dtype=torch.float64, device="cuda")
        s = ts.optim.BCFW(model, ds.to("cuda"), lam=0.01, batch_size=B, seed=0, backend="torch", host_free=False,
                          **config)
        s.step()  # the first pass visits every block once
        before = mode.syncs
        for _ in range(2):
            s.step()
        assert s.w.device == torch.device("cuda", 0)
    return (mode.syncs - before) / 2


@pytest.mark.parametrize("config,per_step", [
    ({}, 1),  # the box QP's copy to the host
    # and gap sampling's read of the gaps and the blocks gaining a cache slot (the cache test reads nothing)
    ({"sampling": "gap", "step": "pairwise", "cache_size": 10, "gap_check_every": 5}, 3)])
def test_minibatch_bcfw_step_waits_for_the_device_a_fixed_number_of_times(config, per_step):
    """Host synchronisations of a mini-batch step, whatever its size, plus one read per pass for the report
    (docs/benchmarks/host_syncs.md). Before the session that made the step's masks whole-batch tensor work, kept
    the cache's counts on the host and queued the host-to-device copies, the same counting gave 14 and 37 at
    B = 64 on OCR's shapes, then 1.1 and 4.1; the cache test on the device took one more off."""
    for B in (16, 64):
        assert _syncs_per_pass(B, **config) == per_step * (128 // B) + 1


def test_device_cache_test_takes_the_misses_answers_of_a_whole_batch_oracle():
    """On a device the oracle decodes the whole mini-batch and the cache misses take its answers, counted on the
    device and read with the pass's report: the same run as on the CPU (which decodes the misses only), counters
    included, up to the rounding of the scores' sums over another padded length. (Over more passes that rounding
    decides a near-tie between two active atoms for the away step, and the runs part.)"""
    ds = ts.data.synthetic_chain("train", 96, num_labels=5, num_features=8, seed=1)
    config = dict(lam=0.01, batch_size=16, step="pairwise", sampling="gap", cache_size=5, gap_check_every=3, seed=0,
                  backend="torch", host_free=False)
    cpu = ts.optim.BCFW(ts.LinearChainModel(8, 5, dtype=torch.float64), ds, **config)
    ref = [cpu.step() for _ in range(2)]
    with simulated_cuda():
        dev = ts.optim.BCFW(ts.LinearChainModel(8, 5, dtype=torch.float64, device="cuda"), ds.to("cuda"), **config)
        got = [dev.step() for _ in range(2)]
        w = dev.w.cpu()
        dev._update(torch.arange(16))  # a step's misses are counted when the counters are next read
        unread = dev._visits_unread
        state = dev.state_dict()
        dev._update(torch.arange(16, 32))
        dev.load_state_dict(state)  # drops the misses counted since
        r = dev.step()  # the third pass: 96 visits, then an exact pass (96 oracle calls)
        assert r["gap_exact"] and r["oracle_calls"] + r["cache_hits"] == state["oracle_calls"] + \
            state["cache_hits"] + 2 * 96
    assert ref[-1]["cache_hits"] > 0 and ref[-1]["oracle_calls"] > 96
    for a, b in zip(ref, got):
        assert (a["oracle_calls"], a["cache_hits"]) == (b["oracle_calls"], b["cache_hits"])
        assert a["gap"] == pytest.approx(b["gap"], rel=1e-9)
    torch.testing.assert_close(w, cpu.w, rtol=1e-9, atol=1e-12)
    assert unread == 16 and state["oracle_calls"] + state["cache_hits"] == got[-1]["oracle_calls"] + \
        got[-1]["cache_hits"] + 16


@pytest.mark.parametrize("config,budget", [
    ({}, 60),
    ({"sampling": "gap", "step": "pairwise", "cache_size": 4, "gap_check_every": 0}, 72)])
def test_minibatch_bcfw_step_kernel_launch_budget(config, budget):
    """A regression guard on the step's fixed cost on a GPU: kernel launches per mini-batch with the Triton kernels
    (``backend="auto"`` on CUDA), the pass's report read included. Measured 51 (FW) and 58 (pairwise + cache)
    here; 85 and 112 before the step's end and ``<theta_i, z_i>`` became one kernel each and the chain's Gram
    matrix and update of w one product each; before the step's bookkeeping was fused, about 117 and 357 on OCR's
    shapes (docs/benchmarks/host_syncs.md)."""
    ds = ts.data.synthetic_chain("train", 64, num_labels=5, num_features=8, seed=0)
    with simulated_cuda() as mode:
        s = ts.optim.BCFW(ts.LinearChainModel(8, 5, dtype=torch.float64, device="cuda"), ds.to("cuda"), lam=0.01,
                          batch_size=16, seed=0, host_free=False, **config)
        s.step()
        before = mode.launches
        s.step()
    assert (mode.launches - before) / 4 <= budget


def test_device_box_qp_reads_its_stop_flag_every_few_iterations(monkeypatch):
    """Above the host-solve size the projected Newton iteration runs on the device, reading its stop flag once
    per `_DEVICE_CHECK_EVERY` iterations; a converged iterate stays frozen, so the answer is the one of the same
    iteration on the CPU, which reads the flag every iteration."""
    from torchssvm.kernels.step.box_qp_torch import _DEVICE_CHECK_EVERY

    from torchssvm.optim.frank_wolfe import box_qp as box_qp_module
    from torchssvm.optim.frank_wolfe.box_qp import _projected_newton, box_qp

    monkeypatch.setattr(box_qp_module, "_host_solver", lambda B, device: None)  # every size on the device
    g = torch.Generator().manual_seed(0)
    B = 80
    M = torch.randn(B, B // 2, generator=g, dtype=torch.float64)
    H, c, u = M @ M.T, torch.randn(B, generator=g, dtype=torch.float64), torch.rand(B, generator=g,
                                                                                   dtype=torch.float64)
    ref = _projected_newton(c, H, u, 50, 1e-12)
    # k: the steps it takes. The stop shows at iteration k or k + 1 (0-based); the device reads it at the next
    # multiple of the period, after reads at 0, E, 2E, ...
    k = next(k for k in range(51) if torch.equal(_projected_newton(c, H, u, k, 1e-12), ref))
    E = _DEVICE_CHECK_EVERY
    assert k > 2 * E
    with simulated_cuda() as mode:
        gamma = box_qp(*(t.to("cuda", non_blocking=True) for t in (c, H, u)))
        assert -(-k // E) + 1 <= mode.syncs <= -(-(k + 1) // E) + 1 < k
        gamma = gamma.cpu()
    assert torch.equal(gamma, ref)


@pytest.mark.parametrize("numba", [True, False])
def test_device_box_qp_is_solved_on_the_host_from_one_copy_up_to_its_size(numba, monkeypatch):
    """With numba, device QPs up to `_NUMBA_DEVICE_MAX_B` blocks (without it, `_NUMPY_MAX_B`) are solved on the host:
    one copy there (the one wait) and the answer sent back; it is the CPU's answer, bitwise."""
    from torchssvm.optim.frank_wolfe import box_qp_numba
    from torchssvm.optim.frank_wolfe.box_qp import _NUMBA_DEVICE_MAX_B, _NUMPY_MAX_B, box_qp

    if numba and not box_qp_numba.available():
        pytest.skip("needs numba")
    if not numba:
        monkeypatch.setattr(box_qp_numba, "available", lambda: False)
    g = torch.Generator().manual_seed(1)
    for B, host in ((_NUMPY_MAX_B, True), (_NUMBA_DEVICE_MAX_B, numba), (_NUMBA_DEVICE_MAX_B + 1, False)):
        M = torch.randn(B, B + 4, generator=g, dtype=torch.float64)
        H, c, u = M @ M.T, torch.randn(B, generator=g, dtype=torch.float64), torch.rand(B, generator=g,
                                                                                       dtype=torch.float64)
        with simulated_cuda() as mode:
            gamma = box_qp(*(t.to("cuda", non_blocking=True) for t in (c, H, u)))
            assert gamma.device.type == "cuda"
            assert (mode.syncs == 1) == host, (B, mode.syncs)
            gamma = gamma.cpu()
        if host:
            assert torch.equal(gamma, box_qp(c, H, u))


def test_gpu_check_counts_only_the_runtime_calls_that_block_the_host():
    """On a GPU, `count_cuda_waits` checks the simulated counts against the profile: queued copies and launches
    are not waits; a stream, device or event synchronisation and a plain ``cudaMemcpy`` are."""
    from collections import Counter

    from torchssvm.testing.cuda_waits import count_waits

    names = ["cudaLaunchKernel", "cudaMemcpyAsync", "cudaStreamSynchronize", "aten::item", "cudaMemcpy",
             "cudaStreamSynchronize", "cudaEventRecord", "cudaEventSynchronize", "cudaStreamWaitEvent"]
    assert count_waits(names) == Counter({"cudaStreamSynchronize": 2, "cudaMemcpy": 1, "cudaEventSynchronize": 1})


def test_gpu_check_counts_only_the_waits_before_the_end_marker():
    """The synchronize that closes the trace, and any the profiler makes itself when it stops, start after the end
    marker and are not counted; the marker is a profiler event with a start time (checked on a CPU trace)."""
    from collections import Counter
    from types import SimpleNamespace

    from torch.profiler import ProfilerActivity, profile, record_function

    from torchssvm.testing.cuda_waits import END_MARKER, count_waits_before_marker

    def ev(name, start):
        return SimpleNamespace(name=name, time_range=SimpleNamespace(start=start))

    events = [ev("cudaStreamSynchronize", 1), ev("cudaMemcpy", 2), ev(END_MARKER, 5), ev("cudaDeviceSynchronize", 6),
              ev("cudaDeviceSynchronize", 9), ev("cudaStreamSynchronize", 3)]
    assert count_waits_before_marker(events) == Counter({"cudaStreamSynchronize": 2, "cudaMemcpy": 1})
    assert count_waits_before_marker(events[:2]) == Counter({"cudaStreamSynchronize": 1, "cudaMemcpy": 1})
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.ones(3).sum()
        with record_function(END_MARKER):
            pass
        torch.ones(3).sum()
    marks = [e for e in prof.events() if e.name == END_MARKER]
    sums = sorted(e.time_range.start for e in prof.events() if e.name == "aten::sum")
    assert len(marks) == 1 and sums[0] < marks[0].time_range.start < sums[1]


def test_chain_problem_shapes_from_the_host_copy_of_the_index():
    """`DualProblem.block_index` queues the index's copy and the chain problem takes the batch's longest sentence
    from its host lengths: potentials, oracle, Gram matrix and update of a batch read nothing from the device,
    and give what the CPU gives."""
    from torchssvm.optim.problems.chain import ChainProblem

    ds = ts.data.synthetic_chain("train", 40, num_labels=5, num_features=6, seed=0)
    idx = torch.tensor([3, 17, 8, 30])
    cpu = ChainProblem(ts.LinearChainModel(6, 5, dtype=torch.float64), ds)
    w = torch.randn(cpu.d, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    ref = cpu.oracle(cpu.potentials(w, idx), idx)
    with simulated_cuda() as mode:
        p = ChainProblem(ts.LinearChainModel(6, 5, dtype=torch.float64, device="cuda"), ds.to("cuda"))
        wd = w.to("cuda", non_blocking=True)
        before = mode.syncs
        on_device = p.block_index(idx)
        assert on_device.device == torch.device("cuda", 0)
        labels, loss, H = p.oracle(p.potentials(wd, on_device), on_device)
        z = p.corner(on_device, labels)
        p.gram(on_device, z)
        p.accumulate(wd, on_device, z, torch.ones(4, dtype=torch.float64, device="cuda"))
        assert mode.syncs == before
        out = [t.cpu() for t in (labels, loss, H)]
    for a, b in zip(out, ref):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_tree_max_sum_on_a_device_reads_from_it_only_to_validate():
    """Message passing on a pictorial-structure tree (`spatial_tree_max_sum`, Triton) takes its level index tensors
    from a per-device cache (they used to be copied from the host at every level, a wait each on a GPU): the one
    read left is the check of the quadratic weights. The result is the CPU's."""
    from torchssvm.kernels import spatial_tree_max_sum

    from torchssvm.data.pose import POSE_PARENTS

    g = torch.Generator().manual_seed(0)
    V, side = len(POSE_PARENTS), 6
    unary = torch.randn(2, V, side * side, generator=g)
    weights = torch.rand(V - 1, 4, generator=g)
    rest = torch.randn(V - 1, 2, generator=g)
    ref = spatial_tree_max_sum(unary, weights, rest, POSE_PARENTS, side, side, backend="torch")
    with simulated_cuda() as mode:
        args = [t.to("cuda", non_blocking=True) for t in (unary, weights, rest)]
        labels, value = spatial_tree_max_sum(*args, POSE_PARENTS, side, side, backend="triton")
        assert mode.syncs == 1
        out = labels.cpu(), value.cpu()
    assert torch.equal(out[0], ref[0])
    torch.testing.assert_close(out[1], ref[1])


def test_a_cuda_graph_replays_the_captured_device_work_and_its_capture_changes_nothing():
    """``torch.cuda.CUDAGraph`` on the simulated device: the capture runs the code once but leaves memory made
    before it as it was (a GPU runs nothing while capturing); each replay runs the recorded ops again on the
    tensors' current data, one launch; a value read or a copy from the host inside a capture raises, as CUDA does,
    and leaves memory as it was too."""
    with simulated_cuda() as mode:
        x, y = torch.zeros(4, device="cuda"), torch.ones(4, device="cuda")
        graph = torch.cuda.CUDAGraph()
        with pytest.raises(RuntimeError, match="not captured"):
            graph.replay()
        with torch.cuda.graph(graph):
            assert torch.cuda.is_current_stream_capturing()
            z = x * 2 + y  # memory of the graph's own
            x.add_(z)
        assert not torch.cuda.is_current_stream_capturing()
        assert x.cpu().tolist() == [0.0] * 4
        launches = mode.launches
        graph.replay()
        assert mode.launches == launches + 1 and x.cpu().tolist() == [1.0] * 4
        y.fill_(10.0)
        graph.replay()
        assert x.cpu().tolist() == [13.0] * 4 and z.cpu().tolist() == [12.0] * 4
        for body, match in ((lambda: float(x.sum()), "capturing"),
                            (lambda: x.copy_(torch.ones(4).to("cuda", non_blocking=True)), "copy from the host")):
            with pytest.raises(RuntimeError, match=match), torch.cuda.graph(torch.cuda.CUDAGraph()):
                x.mul_(0.0)
                body()
            assert x.cpu().tolist() == [13.0] * 4


def test_a_captured_op_that_writes_without_returning_or_returns_a_list_or_a_view_replays_right():
    """Ops whose schemas are not one tensor in, one out: ``_foreach_add_`` writes its arguments and returns nothing,
    ``_foreach_add`` returns a list, ``_unsafe_view`` returns its input's storage unannotated; a 0-dim CPU tensor is
    a value fixed at capture; ``torch.cuda.synchronize`` inside a capture raises."""
    with simulated_cuda():
        a = [torch.zeros(2, device="cuda"), torch.zeros(2, device="cuda")]
        c, x = torch.zeros(2, device="cuda"), torch.zeros(2, 2, device="cuda")
        scale = torch.tensor(3.0)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            torch._foreach_add_(a, 1.0)
            out = torch._foreach_add([c, c], 5.0)
            torch.ops.aten._unsafe_view(x, [4]).add_(1.0)
            y = c * scale
        assert [t.cpu().tolist() for t in a] == [[0.0, 0.0]] * 2 and x.cpu().sum() == 0
        scale.fill_(7.0)
        graph.replay()
        assert [t.cpu().tolist() for t in a] == [[1.0, 1.0]] * 2 and [t.cpu().tolist() for t in out] == [[5.0] * 2] * 2
        assert x.cpu().tolist() == [[1.0, 1.0]] * 2 and y.cpu().tolist() == [0.0, 0.0]
        c.fill_(1.0)
        graph.replay()
        assert y.cpu().tolist() == [3.0, 3.0]  # the scale of the capture
        with pytest.raises(RuntimeError, match="capturing"), torch.cuda.graph(torch.cuda.CUDAGraph()):
            torch.cuda.synchronize()
