"""Memory of writing a LoRA node's merged weights for vLLM: a merged deep copy (what the
vLLM backend did before) against folding shard by shard (sapo_core/policy/merged_weights.py).

Each variant runs in a fresh process on the same adapted model (a bundled base with a rank-8
LoRA on every projection, B matrices randomised so the fold does work): the process's
anonymous resident memory is sampled every 2 ms while the weights are written, and the figure is its
peak above what the process held just before. The written tensors are checked equal between
variants (the tests check them against peft bit for bit).

    python benchmarks/merged_sync.py     # gemma3-270m: copy, 1 GiB and 256 MiB shards
    python benchmarks/merged_sync.py --model bundled:smollm2-135m-instruct --repeat 3
    python benchmarks/merged_sync.py --device cuda   # the model on a GPU: device memory too

Memory figures do not depend on the machine's load; the seconds printed beside them do, so
compare those only from an idle machine.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flows.env import apply_offline_defaults

VARIANTS = {"copy": None, "shards-1GiB": 1 << 30, "shards-256MiB": 256 << 20,
            "shards-128MiB": 128 << 20}  # fmt: skip
DEFAULT_VARIANTS = "copy,shards-1GiB,shards-256MiB"


def rss_bytes() -> int:
    """Anonymous resident memory: what the process made, not file pages it touched (the
    base's weights may be mapped from their file, and reading them is not a cost)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no RssAnon in /proc/self/status")


class PeakSampler:
    """The highest resident memory seen while the `with` body runs (a 2 ms poll)."""

    def __enter__(self) -> PeakSampler:
        self.before = rss_bytes()
        self.peak = self.before
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def _poll(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, rss_bytes())

    def __exit__(self, *_: object) -> None:
        self.peak = max(self.peak, rss_bytes())
        self._stop.set()
        self._thread.join()


def one(model_name: str, variant: str, folder: Path, device: str) -> dict[str, object]:
    """In this process: load, adapt, write once as `variant`; the figures (on a GPU also
    the device memory the write allocated above what the model held)."""
    import copy
    import gc

    import torch

    from sapo_core.config import AdapterConfig
    from sapo_core.policy import adapter
    from sapo_core.policy.loading import load_model
    from sapo_core.policy.merged_weights import save_merged

    torch.manual_seed(0)  # the same A matrices in every process
    model = adapter.attach(load_model(model_name), AdapterConfig(kind="lora", rank=8, alpha=16))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.01)
    model.to(device)
    gc.collect()
    on_gpu = device.startswith("cuda")
    if on_gpu:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        device_before = torch.cuda.memory_allocated()
    start = time.perf_counter()
    with PeakSampler() as sampled:
        if VARIANTS[variant] is None:
            copy.deepcopy(model).merge_and_unload().save_pretrained(folder)
        else:
            save_merged(model, folder, shard_bytes=VARIANTS[variant])
    seconds = time.perf_counter() - start
    device_extra = (torch.cuda.max_memory_allocated() - device_before) / 1e9 if on_gpu else None
    digest = hashlib.sha256()
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(folder.glob("*.safetensors")):
        tensors |= load_file(str(file))
    for name in sorted(tensors):
        digest.update(name.encode() + tensors[name].numpy().tobytes())
    weights = sum(t.numel() * t.element_size() for t in tensors.values())
    return {
        "variant": variant,
        "held_before_gb": sampled.before / 1e9,
        "extra_peak_gb": (sampled.peak - sampled.before) / 1e9,
        "device_extra_peak_gb": device_extra,
        "seconds": seconds,
        "files": len(list(folder.glob("*.safetensors"))),
        "weights_gb": weights / 1e9,
        "sha256": digest.hexdigest()[:16],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bundled:gemma3-270m")
    parser.add_argument("--variants", default=DEFAULT_VARIANTS)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda: the model on a GPU")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # variant, in a child process
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args()
    apply_offline_defaults()
    if args.one:
        print(json.dumps(one(args.model, args.one, Path(args.folder), args.device)))
        return
    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variants {unknown}: {', '.join(VARIANTS)}")
    print(f"load average: {os.getloadavg()[0]:.2f}; model {args.model}", flush=True)
    rows = []
    for round_ in range(args.repeat):
        for variant in variants:  # alternating, so drift in the machine hits both alike
            with tempfile.TemporaryDirectory() as tmp:
                out = subprocess.run(
                    [sys.executable, __file__, "--model", args.model, "--one", variant,
                     "--folder", tmp, "--device", args.device],
                    check=True, capture_output=True, text=True,
                )  # fmt: skip
            row = json.loads(out.stdout.strip().splitlines()[-1])
            row["repeat"] = round_
            rows.append(row)
            print(json.dumps(row), flush=True)
    gpu = args.device.startswith("cuda")
    device_head = " device extra peak GB |" if gpu else ""
    print(f"\n| variant | held before GB | host extra peak GB (max of {args.repeat}) |"
          f"{device_head} seconds | files |")  # fmt: skip
    print("|---|---:|---:|" + ("---:|" if gpu else "") + "---:|---:|")
    for variant in variants:
        mine = [r for r in rows if r["variant"] == variant]
        device = (
            f" {max(float(r['device_extra_peak_gb']) for r in mine):.2f} |"  # type: ignore[arg-type]
            if gpu
            else ""
        )
        print(
            f"| {variant} | {mine[0]['held_before_gb']:.2f} | "
            f"{max(float(r['extra_peak_gb']) for r in mine):.2f} |{device} "  # type: ignore[arg-type]
            f"{min(float(r['seconds']) for r in mine):.1f} | {mine[0]['files']} |"  # type: ignore[arg-type]
        )
    digests = {r["sha256"] for r in rows}
    print(f"written weights identical across variants: {'yes' if len(digests) == 1 else 'NO'}")


if __name__ == "__main__":
    main()
