#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Calibrates the alpha-beta cost model (include/ulysses/tune/cost.hpp) on this machine and measures its
# error, with ulysses_perf only:
#
#   bench/run_model.sh [OUTDIR]        (default OUTDIR: bench/results/cost)
#
# 1. measures RUNS times (independent processes; the check compares the model with their mean and
#    reports each run's spread around it) every model of examples/common/models.hpp (the shared case list's models.json) at
#    S = 1024, 2048, ..., 65536, both exchanges (q,k,v seq->head; o head->seq), bf16, P=4:
#    in-process (direct path), under MPI (message path), and under MPI on 2 simulated nodes of P/2
#    ranks (the two-level exchange); sizes over MAX_RANK_BYTES a rank are skipped (memory). P is the
#    number of cores (one rank per core: more ranks than cores time the OS scheduler, not the exchange);
# 2. fits the model per backend on every shape (OUTDIR/params.json) and, as a cross-check, on two
#    shapes only (FIT_MODELS: OUTDIR/params_subset.json) with ulysses_perf --fit;
# 3. checks each against the measurements (ulysses_perf --check): OUTDIR/check.txt has the error
#    distributions per backend (calibrated shapes; held-out shapes), the runs' own spread, every row.
# About 30 minutes on 2 cores. Knobs: PERF (a built ulysses_perf), BUILD_DIR (default build), ITERS (5), WARMUP (2),
# REPS (3: each time the least median of 3 runs of ITERS), RUNS (3),
# MAX_RANK_BYTES (268435456), RANKS (default: the number of cores), FIT_MODELS ("Llama-3.1-8B GPT-2"),
# FRESH (measure again files already in OUTDIR/runs). Balanced head splits (any H, e.g. Falcon's 71).
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ub_paths "${1:-}" "$root/bench/results/cost" "$root/build"
iters="${ITERS:-5}"; warmup="${WARMUP:-2}"; reps="${REPS:-3}"; runs="${RUNS:-3}"; cap="${MAX_RANK_BYTES:-268435456}"
P="${RANKS:-$(nproc)}"
fit_models="${FIT_MODELS:-Llama-3.1-8B GPT-2}"
mkdir -p "$out/runs"
perf="${PERF:-}"  # a ulysses_perf binary to use as is; else built in BUILD_DIR
if [ -z "$perf" ]; then
  ub_configure
  ub_build ulysses_perf
  perf="$build/bench/ulysses_perf"
fi
ub_mpi_env
ub_load "$raw/model_load.txt" before
common=(--direction both --dtype bf16 --balanced -b 1024 -e 65536 -f 2 -n "$iters" -w "$warmup" --reps "$reps" --bare 0 --max-rank-bytes "$cap")
fit_files=(); all_files=(); held_files=()
for run in $(seq 1 "$runs"); do
while IFS= read -r model; do
  slug=$(tr -c 'A-Za-z0-9\n' '_' <<<"$model")
  for backend in local mpi mpi2; do
    f="$out/runs/${slug}_${backend}_run${run}.json"
    if [ -s "$f" ] && [ -z "${FRESH:-}" ]; then
      echo "== $model, $backend: $f kept (FRESH=1 measures again)"
    else
    echo "== $model, $backend -> $f"
    case $backend in
      local) "$perf" --backend local --ranks "$P" --model "$model" "${common[@]}" --json "$f" > /dev/null < /dev/null ;;
      mpi)   mpiexec -n "$P" "${mpi_flags[@]}" "$perf" --backend mpi --model "$model" "${common[@]}" --json "$f" > /dev/null < /dev/null ;;
      mpi2)  mpiexec -n "$P" "${mpi_flags[@]}" "$perf" --backend mpi --ranks-per-node "$((P / 2))" --model "$model" "${common[@]}" --json "$f" > /dev/null < /dev/null ;;
    esac
    fi
    all_files+=("$f")
    fit=0
    for m in $fit_models; do [[ "$model" == "$m"* ]] && fit=1; done
    if [ $fit = 1 ]; then fit_files+=("$f"); else held_files+=("$f"); fi
  done
done < <("$perf" --list-models | sed 's/ *H=.*//')
done
{
  echo "## the model calibrated on every shape (params.json), checked on them"
  "$perf" --fit "$out/params.json" "${all_files[@]}"
  "$perf" --check "$out/params.json" "${all_files[@]}" || true
  echo "## cross-check: calibrated on $fit_models only (params_subset.json), checked on the other shapes"
  "$perf" --fit "$out/params_subset.json" "${fit_files[@]}"
  "$perf" --check "$out/params_subset.json" "${held_files[@]}" || true
  echo "## every row (params.json)"
  "$perf" --check "$out/params.json" --rows "${all_files[@]}" || true
} | tee "$out/check.txt"
ub_load "$raw/model_load.txt" after
