#!/usr/bin/env bash
# End-to-end check of TOPAS inside SGLang on a machine with one NVIDIA GPU
# (docs/sglang.md). It installs SGLang 0.5.23 with its GPU dependencies in its
# own venv, starts an in-process SGLang Engine with dummy weights of a small
# model (no download of weights; the model's config and tokenizer come from the
# Hugging Face hub or a local path given as MODEL), runs a short Chain-3 trace
# through TOPAS and through FCFS, and checks the decision logs.
#
#   bash scripts/sglang_gpu_check.sh                 # MODEL=Qwen/Qwen2.5-0.5B-Instruct
#   MODEL=/path/to/model bash scripts/sglang_gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL="${MODEL:-Qwen/Qwen2.5-0.5B-Instruct}"
VENV="${VENV:-.venv-sglang-gpu}"
OUT="${OUT:-out/sglang-gpu-check}"

command -v nvidia-smi >/dev/null || { echo "no nvidia-smi: this check needs a GPU" >&2; exit 2; }
nvidia-smi -L
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q 'sglang==0.5.23'
fi
"$VENV/bin/pip" install -q -e '.[sglang]'
mkdir -p "$OUT"
rm -f "$OUT"/*.db

"$VENV/bin/python" - "$MODEL" "$OUT" <<'PY'
import sqlite3
import sys

from backends.sglang import SGLangOptions, make_backend
from store import Store
from topasd.profiles import get_profile
from topasd.runner import Run
from topasd.scheduler import make_policy
from workflows.builtin import load_workload
from workflows.trace import generate_trace

model, out = sys.argv[1], sys.argv[2]
workload = load_workload("chain3")
trace = generate_trace(workload.workflows, rate=0.5, n_tasks=6, seed=0)
# the policy's cost hints (the sim's small profile: TOPAS's terms, not SGLang's timing)
profile = get_profile("small")
for policy_name in ("topas", "fcfs"):
    options = SGLangOptions(model_path=model, load_format="dummy", mem_fraction_static=0.6,
                            context_length=16384)
    backend = make_backend(options, profile)
    try:
        store = Store(f"{out}/{policy_name}.db")
        result = Run(trace, make_policy(policy_name), backend, store.sink("top:4")).execute()
        store.close()
    finally:
        backend.close()
    s = result.summary()
    print(f"{policy_name}: {s['tasks']} tasks, mean JCT {s['mean_jct_s']:.2f}s, "
          f"{result.decisions} decisions, {backend.stats.preemptions} preemptions")
    db = sqlite3.connect(f"{out}/{policy_name}.db")
    tables = {r[0] for r in db.execute("select name from sqlite_master where type='table'")}
    assert "decisions" in tables, tables
    n_dec = db.execute("select count(*) from decisions").fetchone()[0]
    assert n_dec == result.decisions > 0, (n_dec, result.decisions)
    assert len(result.jct) == len(trace.tasks), (len(result.jct), len(trace.tasks))
    print(f"  decision log {out}/{policy_name}.db: {n_dec} decisions")
print("SGLang GPU check passed")
PY
