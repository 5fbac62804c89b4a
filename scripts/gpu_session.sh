#!/usr/bin/env bash
# The GPU figures of issues 4 and 7 and the CUDA tests, in stages that each fit one 10-minute call of the lent
# GPU machine (no network there; torch, triton, numba and matplotlib are preinstalled). Run from the repository
# root there; results and logs go to $OUT (default /tmp/gpu_out). The data travel in .gpu_carry/data:
#
#   here, once:  mkdir -p .gpu_carry && cp -r ../shared/data .gpu_carry/ && echo /.gpu_carry/ >> .git/info/exclude
#   each call:   bash scripts/gpu_session.sh STAGE        (carry: [".gpu_carry"])
#
# STAGE is one of
#   tests  the CUDA tests (tests/test_gpu.py), a smoke run of both benchmarks, the host waits per BCFW step
#          counted in a profile (report_host_syncs.py --device cuda) and the step's bookkeeping kernels against
#          their torch ops (bench_step_kernels.py --device cuda), the box QP on the host against the device
#          (bench_box_qp.py --device cuda; about 5 min)
#   tree   issue 7: python scripts/bench_tree.py --device cuda without the mixtures (26 parts at 32/64/128, distance
#          transform against brute force; the target is <= 0.1 ms per image at 64x64)
#   tree-mixture  the same with the mixture section (T = 3, 13 and the paper's 169), into $OUT/mixture
#   bcfw   issue 4: time to a certified gap of 1e-3 on OCR-large, B = 64, 128, 256 on the GPU, against the CPU's
#          sequential run in docs/benchmarks/bcfw_time_to_gap.json (target: >= 50x less time)
#   speed  issue 4: gap against passes and seconds by batch size on the GPU (bench_bcfw_speed.py --device cuda;
#          B = 1 runs on the CPU: docs/benchmarks/bcfw_speed.md)
#   backends  issue 4: seconds per BCFW pass with the torch kernels against the Triton ones, OCR-large and CoNLL
#          (bench_bcfw_backends.py --device cuda; a few minutes)
#   step   issue 40 in one call (at most STEP_SECONDS=540): the host / host-free eager / CUDA-graph step at B = 256,
#          1024, 4096 (seconds per pass, GPU busy fraction, waits and launches per pass; bench_bcfw_gpu_step.py),
#          the host-free step's box QP, torch iteration against Triton kernels (bench_box_qp.py --skip-host),
#          tests/test_gpu.py (the CUDA-graph step against the eager one, the host-free step's waits), time to 1e-3
#          with the CUDA-graph step, cold and warm start-up (bench_startup.py), the hinge loss's cost per call
#          (bench_loss_cost.py) and the Viterbi roofline (bench_oracles.py --roofline)
#   qp     the host-free step's box QP in about 5 min: its device time by kernel and the Newton solve, LU against
#          Cholesky (profile_box_qp.py), ms per QP (bench_box_qp.py --skip-host), the step at B = 256 and 1024
#          (bench_bcfw_gpu_step.py), the GPU tests of the QP, the host-free step and its CUDA graph, and
#          start-up with the vendor libraries' first calls timed apart (bench_startup.py; 6 min in all)
# Copy what comes back into docs/benchmarks/ (the *_cuda.* files) and regenerate the reports with --report-only.
set -uo pipefail
stage="${1:?usage: gpu_session.sh tests|tree|tree-mixture|bcfw|speed|backends|step|qp|distributed}"
case "$stage" in  # before anything is installed
    tests|tree|tree-mixture|bcfw|speed|backends|step|qp|distributed) ;;
    *) echo "unknown stage $stage (tests|tree|tree-mixture|bcfw|speed|backends|step|qp|distributed)" >&2; exit 2 ;;
esac
OUT="${OUT:-/tmp/gpu_out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
export TORCHSSVM_DATA="${TORCHSSVM_DATA:-$PWD/.gpu_carry/data}"
log="$OUT/$stage.log"
{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    python3 -c "import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__)"
    # no index there: install without dependencies or build isolation (setuptools is preinstalled)
    python3 -m pip install -q --no-deps --no-build-isolation -e . || exit 1
    test -f "$TORCHSSVM_DATA/ocr/letters.npz" || echo "warning: no data under $TORCHSSVM_DATA (carry .gpu_carry)"
} >"$log" 2>&1
cat "$log"
run() {
    if [ -n "${STEP_END:-}" ] && [ $(( STEP_END - $(date +%s) )) -lt "${LIMIT:-570}" ]; then
        echo "skipped (under ${LIMIT}s left): $*" | tee -a "$log"; return 0
    fi
    echo "+ $*" | tee -a "$log"; timeout "${LIMIT:-570}" "$@" 2>&1 | tee -a "$log"
}
case "$stage" in
    tests)
        LIMIT=300 run python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py
        LIMIT=120 run python3 scripts/bench_tree.py --device cuda --quick --out "$OUT/smoke"
        LIMIT=120 run python3 scripts/bench_bcfw_time_to_gap.py --device cuda --batch-sizes 256 --tol 0.3 \
            --budget 20 --out "$OUT/smoke"
        LIMIT=120 run python3 scripts/report_host_syncs.py --device cuda --out "$OUT"
        LIMIT=60 run python3 scripts/bench_step_kernels.py --device cuda --out "$OUT"
        LIMIT=60 run python3 scripts/bench_box_qp.py --device cuda --out "$OUT"
        ;;
    tree)
        run python3 scripts/bench_tree.py --device cuda --out "$OUT" --types
        ;;
    tree-mixture)
        run python3 scripts/bench_tree.py --device cuda --out "$OUT/mixture" --pair-types 13
        ;;
    bcfw)
        run python3 scripts/bench_bcfw_time_to_gap.py --device cuda --budget 150 --out "$OUT"
        ;;
    speed)
        run python3 scripts/bench_bcfw_speed.py --device cuda --batch-sizes 64 256 1024 --passes 20 --out "$OUT"
        ;;
    backends)
        run python3 scripts/bench_bcfw_backends.py --device cuda --out "$OUT"
        ;;
    step)
        # most needed first; a command is skipped when less than its limit is left of STEP_SECONDS
        export STEP_END=$(( $(date +%s) + ${STEP_SECONDS:-540} ))
        LIMIT=200 run python3 scripts/bench_bcfw_gpu_step.py --device cuda --batch-sizes 256 1024 4096 \
            --passes 3 --out "$OUT"
        # B = 4096: capturing its QPs alone took over a minute on an H200 (2026-11-27)
        LIMIT=60 run python3 scripts/bench_box_qp.py --device cuda --batch-sizes 256 1024 --count 8 \
            --skip-host --out "$OUT"
        # 46 of its 50 tests passed in the first 120 s on an H200 (2026-11-27)
        LIMIT=180 run python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py
        LIMIT=110 run python3 scripts/bench_bcfw_gpu_step.py --device cuda --batch-sizes 256 1024 4096 \
            --modes graph --passes 1 --time-to-gap --budget 25 --out "$OUT/time_to_gap"
        LIMIT=75 run python3 scripts/bench_startup.py --device cuda --out "$OUT"
        LIMIT=45 run python3 scripts/bench_loss_cost.py --device cuda --out "$OUT"
        LIMIT=60 run python3 scripts/bench_oracles.py --device cuda --roofline --out "$OUT"
        ;;
    qp)
        # the host-free step's box QP: where its device time goes (profile_box_qp.py: per kernel, and the Newton
        # solve by LU against Cholesky), ms per QP on BCFW's QPs, the step at B = 256 and 1024, and its GPU tests
        LIMIT=60 run python3 scripts/profile_box_qp.py --device cuda --out "$OUT"
        LIMIT=45 run python3 scripts/bench_box_qp.py --device cuda --batch-sizes 256 1024 --count 4 --skip-host \
            --out "$OUT"
        LIMIT=100 run python3 scripts/bench_bcfw_gpu_step.py --device cuda --batch-sizes 256 1024 --passes 3 \
            --out "$OUT"
        LIMIT=90 run python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k "box_qp or cuda_graph or minibatch"
        # warm start-up against one whose vendor libraries (cuSOLVER, cuBLAS) were first called before fit()
        LIMIT=75 run python3 scripts/bench_startup.py --device cuda --out "$OUT"
        ;;
    distributed)
        # the sharded solvers with NCCL: 1 GPU (a group of one), 2 GPUs where the machine has them
        LIMIT=300 run python3 -m pytest -q -p no:cacheprovider tests/test_distributed_gpu.py
        ;;
esac
