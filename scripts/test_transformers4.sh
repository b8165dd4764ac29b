#!/usr/bin/env bash
# The transformers 4.x leg: the tests that reach Hugging Face code, run under transformers 4.57.6 (the last 4.x, the
# older of the two majors the project declares: transformers>=4.55,<6), in a virtual environment that sees the
# installed stack (torch, thunder, torchao, the project) and holds transformers 4.57.6 and its pins
# (huggingface_hub < 1, tokenizers < 0.23) over it. `.ci/run` runs it after the README's commands.
#
#   scripts/test_transformers4.sh [PYTEST ARGS ...]
#
# Environment: TF4_VENV  the environment's folder (default: .venv-transformers4 in the repository; reused)
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${TF4_VENV:-$ROOT/.venv-transformers4}"
PYTHON="${PYTHON:-python}"

[[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv --system-site-packages "$VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check "transformers==4.57.6"
"$VENV/bin/python" - <<'PY'
import sys

import transformers

if not transformers.__version__.startswith("4.57."):
    sys.exit(f"the transformers 4.x leg found transformers {transformers.__version__}, not 4.57.x")
print(f"transformers {transformers.__version__} (the 4.x leg)")
PY
cd "$ROOT"
"$VENV/bin/python" -m pytest -p no:cacheprovider tests/test_hf.py tests/test_graph_breaks.py tests/test_docs.py \
    tests/test_interpreter_speed.py "$@"
