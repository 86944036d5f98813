#!/usr/bin/env bash
# The GPU check (pods-bench gpu-check) with this machine's own Python: no venv is built and nothing is
# downloaded. For a GPU machine that has torch, transformers, accelerate, peft and pytest but no
# package index; what the check needs beyond them (math-verify and what it needs) comes as a folder
# of wheels prepared on a machine with one (`make gpu-wheels` -> .gpu-wheels/, docs/cost-model.md):
#
#   here:   make gpu-wheels                     (then copy the repository, .gpu-wheels/ included)
#   there:  scripts/gpu-check-offline.sh        (= make gpu-check-offline)
#
# Options: --wheels DIR (default .gpu-wheels; skipped when absent), --site DIR (where the wheels are
# unpacked, default .gpu-site; emptied first); the rest goes to `pods-bench gpu-check` (default
# --out results/gpu-check of the repository; e.g. --device cpu). PYTHON picks the interpreter
# (default python3). Runs from any folder: relative paths are the caller's.
# Only the wheels whose distribution this Python lacks are installed (with pip, --no-index
# --no-deps --target: the system's packages are left as they are), into the site folder, which
# goes first on PYTHONPATH with the repository (the package is not installed either).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-python3}
WHEELS=$ROOT/.gpu-wheels
SITE=$ROOT/.gpu-site
args=()
while (($#)); do
    case $1 in
        --wheels) WHEELS=$2; shift 2 ;;
        --site) SITE=$2; shift 2 ;;
        *) args+=("$1"); shift ;;
    esac
done
# offline, whatever pip, the Hugging Face libraries or a proxy setting would otherwise try
export PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1

# the site folder is this script's (a marker file says so): never empty a folder it did not make
if [ -e "$SITE" ] && [ ! -e "$SITE/.gpu-check-offline" ] && [ -n "$(ls -A "$SITE")" ]; then
    echo "gpu-check-offline: $SITE is not empty and was not made by this script; pass another --site" >&2
    exit 1
fi
rm -rf "$SITE"
mkdir -p "$SITE"
touch "$SITE/.gpu-check-offline"
if [ -d "$WHEELS" ]; then
    # the wheels whose distribution is not installed for this Python (name from the file name, PEP 427)
    missing=$("$PYTHON" - "$WHEELS" <<'PY'
import importlib.metadata, pathlib, re, sys
for wheel in sorted(pathlib.Path(sys.argv[1]).glob("*.whl")):
    name = wheel.name.split("-")[0]
    try:
        importlib.metadata.version(re.sub(r"[-_.]+", "-", name).lower())
    except importlib.metadata.PackageNotFoundError:
        print(wheel)
PY
)
    if [ -n "$missing" ]; then
        echo "gpu-check-offline: installing into $SITE: $(echo "$missing" | xargs -n1 basename | tr '\n' ' ')"
        # shellcheck disable=SC2086  # one path per word (the wheel names have no spaces)
        "$PYTHON" -m pip --version >/dev/null 2>&1 || { echo "gpu-check-offline: $PYTHON has no pip to unpack the wheels with" >&2; exit 1; }
        "$PYTHON" -m pip install -q --no-index --no-deps --target "$SITE" $missing
    fi
fi
SITE=$(cd "$SITE" && pwd)
export PYTHONPATH="$SITE:$ROOT${PYTHONPATH:+:$PYTHONPATH}"

# what the check imports beyond the standard library, named before anything runs
"$PYTHON" - <<'PY'
import importlib.util, sys
machine = ["torch", "transformers", "accelerate", "peft", "safetensors", "numpy", "yaml", "tqdm"]
wheels = ["math_verify", "latex2sympy2_extended", "antlr4", "sympy"]
lacks = lambda names: [name for name in names if importlib.util.find_spec(name) is None]
if lacks(machine):
    sys.exit(f"gpu-check-offline: {sys.executable} lacks {', '.join(lacks(machine))}, which the check "
             "expects installed (it installs only the wheels of `make gpu-wheels`)")
if lacks(wheels):
    sys.exit(f"gpu-check-offline: {sys.executable} lacks {', '.join(lacks(wheels))}: prepare the wheels with "
             "`make gpu-wheels` on a machine with a package index and copy .gpu-wheels/ here (docs/cost-model.md)")
PY
exec "$PYTHON" -m pods_bench gpu-check --out "$ROOT/results/gpu-check" "${args[@]}"
