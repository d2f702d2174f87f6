# Which package index torch comes from, and its installation; sourced by scripts/setup.sh (and by its test,
# tests/scripts/test_torch_index.py, with a fake pip and nvidia-smi).
#
#   a GPU (nvidia-smi -L works)             -> torch from the default index (PyPI's torch is the CUDA build)
#   no GPU, the public index                -> torch's CPU build from PyTorch's own index ($TORCH_CPU_INDEX_URL),
#                                              when it answers within $TORCH_PROBE_TIMEOUT_S seconds; else (a machine
#                                              that reaches PyPI only) the default index, at once
#   no GPU, your own index (PIP_INDEX_URL
#   or pip's index-url setting)             -> that index: a mirror serves what you put in it
#   TORCH_INDEX_URL=URL                     -> that index, no fallback; TORCH_INDEX_URL=default: the default index

TORCH_CPU_INDEX_URL=${TORCH_CPU_INDEX_URL:-https://download.pytorch.org/whl/cpu}

has_gpu() {
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1
}

# own_index PYTHON: whether pip is pointed at an index of the user's instead of PyPI (extra-index-url does not count)
own_index() {
  [ -n "${PIP_INDEX_URL:-}" ] && return 0
  grep -Eq '(^|[.])index-url=' <<<"$("$1" -m pip config list 2>/dev/null)"
}

# index_answers PYTHON URL: whether URL/torch/ answers within TORCH_PROBE_TIMEOUT_S seconds (one try, no retries)
index_answers() {
  "$1" - "$2" "${TORCH_PROBE_TIMEOUT_S:-5}" <<'PY' >/dev/null 2>&1
import sys
import urllib.request

urllib.request.urlopen(sys.argv[1].rstrip("/") + "/torch/", timeout=float(sys.argv[2])).close()
PY
}

# torch_index PYTHON: prints the index torch should come from ("" = the default index); the reason goes to stderr
torch_index() {
  if [ -n "${TORCH_INDEX_URL:-}" ]; then
    [ "$TORCH_INDEX_URL" = default ] || echo "$TORCH_INDEX_URL"
  elif has_gpu; then
    echo "gym-llm set-up: a GPU: torch from the default index" >&2
  elif own_index "$1"; then
    echo "gym-llm set-up: no GPU, and pip uses your own index: torch from it" >&2
  elif index_answers "$1" "$TORCH_CPU_INDEX_URL"; then
    echo "$TORCH_CPU_INDEX_URL"
  else
    echo "gym-llm set-up: no GPU, and $TORCH_CPU_INDEX_URL does not answer: torch from the default index" \
         "(set TORCH_INDEX_URL to choose)" >&2
  fi
}

# install_torch PYTHON VERSION
install_torch() {
  local index
  index=$(torch_index "$1")
  if [ -n "$index" ]; then
    echo "gym-llm set-up: torch==$2 from $index"
    if "$1" -m pip install --quiet --index-url "$index" "torch==$2"; then
      return 0
    fi
    [ -z "${TORCH_INDEX_URL:-}" ] || return 1  # the user's choice: no fallback
    echo "warning: installing torch from $index failed; trying the default index" >&2
  fi
  "$1" -m pip install --quiet "torch==$2"
}
