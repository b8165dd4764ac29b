#!/usr/bin/env bash
# Build each supported stack's virtual environment and run the test suite in it, one stack after the other, under
# each supported major of transformers (the newest 5.x the stack installs, then 4.57.6).
#
#   scripts/test_stacks.sh [STACK ...]        STACK: torch210 torch213 torch214 torch215 (default: all)
#
# Each stack is installed the way docs/stacks.md says a user does it: the stack's torch first, then the project
# (`pip install -e ".[EXTRAS]"`), which keeps that torch; the script checks that it did. An environment that is
# already complete is reused (a marker file records what was installed); delete its folder to rebuild it.
# Prints a result table and writes it, with the failures and skips of each stack, to scripts/stacks_results.md.
#
# Environment: STACKS_DIR  where the environments and logs go (default: ~/.cache/thunder-subclass-stacks;
#                          the CUDA wheels of torch 2.10/2.14/2.15 take several GB each, and run on CPU)
#              PYTEST_ARGS extra pytest arguments (e.g. "-x" or "-k opaque")
#              TRANSFORMERS  the transformers versions to run each stack under, in order (default: "5 4.57.6";
#                          "5" is the newest 5.x; the environment is left with the newest 5.x installed)
#              BUILD_ONLY=1 build (or check) the environments, run nothing
#              PYTHON3_11, PYTHON3_12  interpreters to use (default: python3.X on PATH, else pyenv's newest 3.X)
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
STACKS_DIR="${STACKS_DIR:-$HOME/.cache/thunder-subclass-stacks}"
RESULTS="$ROOT/scripts/stacks_results.md"
mkdir -p "$STACKS_DIR/logs"

# name | python | torch | extras | venv folder | note
STACK_TABLE="
torch210|3.12|2.10.0|test,torch210,cuda|t210|registry build (CUDA 12.8), torchao 0.16, nvFuser wheel nvfuser-cu128-torch210
torch213|3.11|2.13.0|test|t213|CPU build; the default stack (README, CI)
torch214|3.11|2.14.1|test|t214|registry build (CUDA 13.0)
torch215|3.11|2.15.0|test|t215|registry build (CUDA 13.2)
"

find_python() {  # find_python 3.12 -> path of an interpreter of that version
    local want="$1" var="PYTHON${1/./_}" candidate
    if [[ -n "${!var:-}" ]]; then echo "${!var}"; return; fi
    # (a pyenv shim answers `command -v` for versions it does not select: check that it runs)
    if command -v "python$want" >/dev/null 2>&1 && "python$want" -c "" >/dev/null 2>&1; then
        command -v "python$want"; return
    fi
    if command -v pyenv >/dev/null 2>&1; then
        candidate="$(ls -d "$(pyenv root)/versions/$want".*/bin/python 2>/dev/null | sort -V | tail -1)"
        if [[ -n "$candidate" ]]; then echo "$candidate"; return; fi
    fi
    echo "no Python $want found (set $var)" >&2
    return 1
}

build_stack() {  # build_stack NAME PY TORCH EXTRAS DIR
    local name="$1" py="$2" torch="$3" extras="$4" dir="$STACKS_DIR/$5"
    local want="torch=$torch extras=$extras root=$ROOT"
    if [[ -f "$dir/.stack-ok" && "$(cat "$dir/.stack-ok")" == "$want" ]]; then
        echo "[$name] environment $dir is complete"
        return
    fi
    local python
    python="$(find_python "$py")"
    echo "[$name] building $dir (Python $py, torch $torch, extras $extras)"
    [[ -x "$dir/bin/python" ]] || "$python" -m venv "$dir"
    rm -f "$dir/.stack-ok"
    # (PIP_CONFIG_FILE=/dev/null: a machine-wide pip constraint, such as a cap on torch's version for the wheels a
    # machine keeps on disk, must not pick another torch than the stack's)
    PIP_CONFIG_FILE=/dev/null "$dir/bin/pip" install -q --disable-pip-version-check "torch==$torch"
    (cd "$ROOT" && PIP_CONFIG_FILE=/dev/null "$dir/bin/pip" install -q --disable-pip-version-check -e ".[$extras]")
    local got
    got="$("$dir/bin/python" -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null | tail -1)"
    if [[ "$got" != "$torch" ]]; then
        echo "[$name] installing the project replaced torch $torch with $got" >&2
        return 1
    fi
    echo "$want" >"$dir/.stack-ok"
}

use_transformers() {  # use_transformers DIR VERSION: install that transformers (5: the newest 5.x) into the stack
    local dir="$1" version="$2" spec
    if [[ "$version" == "5" ]]; then spec="transformers>=5,<6"; else spec="transformers==$version"; fi
    PIP_CONFIG_FILE=/dev/null "$dir/bin/pip" install -q --disable-pip-version-check "$spec"
}

run_stack() {  # run_stack NAME DIR -> one table row on stdout's last line
    local name="$1" dir="$STACKS_DIR/$2" log="$STACKS_DIR/logs/$1.log"
    local start end minutes summary versions
    start=$(date +%s)
    # shellcheck disable=SC2086
    (cd "$ROOT" && "$dir/bin/python" -m pytest -q -p no:cacheprovider -rfEs ${PYTEST_ARGS:-}) >"$log" 2>&1 || true
    end=$(date +%s)
    minutes=$(awk -v s=$((end - start)) 'BEGIN { printf "%.1f", s / 60 }')
    summary="$(grep -E '^[=]* ?[0-9]+ (passed|failed|skipped|error|errors|deselected)' "$log" | tail -1)"
    count() { echo "$summary" | grep -oE "[0-9]+ $1" | grep -oE '^[0-9]+' || echo 0; }
    versions="$("$dir/bin/python" - 2>/dev/null <<'EOF' | tail -1
import importlib.metadata as m, platform
def v(d):
    try:
        return m.version(d)
    except m.PackageNotFoundError:
        return "-"
nv = next((f"{d} {v(d)}" for d in (x.metadata["Name"] for x in m.distributions()) if d and d.lower().startswith("nvfuser")), "-")
print(f"{platform.python_version()}|{v('torch')}|{v('torchao')}|{v('transformers')}|{v('lightning-thunder')}|{nv}")
EOF
)"
    printf '%s|%s|%s|%s|%s|%s|%s\n' "$name" "$versions" "$(count passed)" "$(count failed)" "$(count skipped)" \
        "$(count 'errors?')" "$minutes"
}

selected=("$@")
rows=()
while IFS='|' read -r name py torch extras dir note; do
    [[ -z "$name" ]] && continue
    if ((${#selected[@]})) && [[ ! " ${selected[*]} " =~ " $name " ]]; then continue; fi
    build_stack "$name" "$py" "$torch" "$extras" "$dir"
    [[ "${BUILD_ONLY:-}" == 1 ]] && continue
    for tf in ${TRANSFORMERS:-5 4.57.6}; do
        use_transformers "$STACKS_DIR/$dir" "$tf"
        echo "[$name] running the tests under transformers $tf (log: $STACKS_DIR/logs/$name-tf$tf.log)"
        rows+=("$(run_stack "$name-tf$tf" "$dir" | tail -1)")
    done
    use_transformers "$STACKS_DIR/$dir" 5
done <<<"$STACK_TABLE"
[[ "${BUILD_ONLY:-}" == 1 ]] && exit 0

{
    echo "# Test results per stack"
    echo
    echo "Last run of \`scripts/test_stacks.sh\` (finished $(date -u "+%Y-%m-%d %H:%M UTC")): $(nproc) CPU cores," \
        "$(python3 -c 'import shutil; print("with" if shutil.which("nvidia-smi") else "without")' 2>/dev/null || echo without) a GPU."
    echo
    echo "| stack | Python | torch | torchao | transformers | thunder | nvFuser | passed | failed | skipped | errors | minutes |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
    for row in "${rows[@]}"; do echo "| ${row//|/ | } |"; done
    echo
    for row in "${rows[@]}"; do
        name="${row%%|*}"
        lines="$(grep -E '^(FAILED|ERROR|SKIPPED) ' "$STACKS_DIR/logs/$name.log" || true)"
        [[ -z "$lines" ]] && continue
        echo "**$name**: failures and skips"
        echo
        echo '```'
        echo "$lines" | sed -E "s#$STACKS_DIR/##g"
        echo '```'
        echo
    done
} >"$RESULTS"
cat "$RESULTS"
