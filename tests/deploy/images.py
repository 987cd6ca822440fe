"""The images the compose stack runs, made available the way a user on this machine would: base images pulled
where a registry answers, otherwise stand-ins built from Debian packages (a debootstrap root, cached); then the
project's own images from the unmodified deploy/docker/Dockerfile, with the commands docs/deploy.md lists."""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STANDINS = Path(__file__).resolve().parent / "standins"
DEBIAN_ROOT_IMAGE = "asyncrl-standin/debian:bookworm"
STANDIN_FOR = {
    "python:3.11-slim-bookworm": "python.Dockerfile",
    "redis:7.4": "redis.Dockerfile",
    "prom/prometheus:v2.55.1": "prometheus.Dockerfile",
}
"""Each base image deploy/ names and the Dockerfile of its stand-in. Grafana has no Debian package: where its
image cannot be pulled the stack runs without it (the tier says so)."""
GRAFANA = "grafana/grafana:11.3.0"
PROJECT_IMAGES = {"asyncrl:0.1.0-cpu": "cpu", "asyncrl:0.1.0-controller": "controller"}
"""Image tag -> Dockerfile target, as deploy/compose.yaml and docs/deploy.md name them."""
PYTORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu/"
TORCH_WHEEL = "torch-2.13.0+cpu-*.whl"


def cache_dir() -> Path:
    root = os.environ.get("ASYNCRL_DEPLOY_CACHE") or Path(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "asyncrl" / "deploy"
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def docker(*args: str, timeout: float = 600, check: bool = True, env: dict | None = None,
           cwd: Path = REPO) -> subprocess.CompletedProcess:
    done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd,
                          check=False)
    if check and done.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)} exited {done.returncode}:\n{done.stdout[-4000:]}\n"
                             f"{done.stderr[-4000:]}")
    return done


def has_image(name: str) -> bool:
    return docker("image", "inspect", name, check=False).returncode == 0


def image_size_bytes(name: str) -> int:
    return int(docker("image", "inspect", "--format", "{{.Size}}", name).stdout.strip())


def _pulled(name: str) -> bool:
    try:
        return docker("pull", "-q", name, check=False, timeout=120).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def _debian_root() -> None:
    """A bookworm root from debootstrap, imported as `DEBIAN_ROOT_IMAGE` (the tarball is cached)."""
    if has_image(DEBIAN_ROOT_IMAGE):
        return
    tarball = cache_dir() / "bookworm-minbase.tar"
    if not tarball.exists():
        with tempfile.TemporaryDirectory(dir=cache_dir()) as work:
            root = Path(work) / "root"
            subprocess.run(["debootstrap", "--variant=minbase", "bookworm", str(root), "http://deb.debian.org/debian"],
                           check=True, capture_output=True, timeout=1200)
            subprocess.run(["tar", "-C", str(root), "-cf", f"{tarball}.part", "."], check=True, timeout=600)
            os.replace(f"{tarball}.part", tarball)
    with tarball.open("rb") as data:
        done = subprocess.run(["docker", "import", "-", DEBIAN_ROOT_IMAGE], stdin=data, capture_output=True,
                              text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr


def _build_standin(name: str) -> None:
    _debian_root()
    with tempfile.TemporaryDirectory() as context:
        local_ca = Path(context) / "local-ca"
        local_ca.mkdir()
        for cert in Path("/usr/local/share/ca-certificates").glob("*.crt"):
            shutil.copy(cert, local_ca)
        docker("build", "-q", "-f", str(STANDINS / STANDIN_FOR[name]), "-t", name, context, timeout=1200)


def ensure_base_images() -> dict[str, str]:
    """Each base image -> how it is here: "present", "pulled" or "stand-in" (Grafana: or "missing")."""
    how = {}
    for name in STANDIN_FOR:
        if has_image(name):
            how[name] = "present"
        elif _pulled(name):
            how[name] = "pulled"
        else:
            _build_standin(name)
            how[name] = "stand-in"
    how[GRAFANA] = "present" if has_image(GRAFANA) else "pulled" if _pulled(GRAFANA) else "missing"
    return how


class _QuietFiles(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@contextlib.contextmanager
def torch_source() -> Iterator[tuple[str, bool]]:
    """(TORCH_PIP_ARGS, whether builds need the host's network) for the images' torch: the user's own
    TORCH_PIP_ARGS when set; PyTorch's CPU index (the Dockerfile's default) when it answers; else a local
    folder of wheels holding the CPU torch (pip's find-links here), served on loopback while the block runs."""
    if os.environ.get("TORCH_PIP_ARGS"):
        yield os.environ["TORCH_PIP_ARGS"], False
        return
    with contextlib.suppress(OSError):
        urllib.request.urlopen(PYTORCH_CPU_INDEX, timeout=10).close()
        yield "", False
        return
    folders = [Path(p) for p in os.environ.get("PIP_FIND_LINKS", "/opt/wheels").split()]
    folder = next((f for f in folders if any(f.glob(TORCH_WHEEL))), None)
    assert folder, (f"torch for the image: {PYTORCH_CPU_INDEX} does not answer and no {TORCH_WHEEL} in "
                    f"{folders}; set TORCH_PIP_ARGS to a mirror")
    # A fixed port: the address is part of the build argument, and so of the build cache's key.
    port = int(os.environ.get("ASYNCRL_WHEELS_PORT", "47613"))
    try:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", port), functools.partial(_QuietFiles, directory=folder))
    except OSError as err:
        raise AssertionError(f"serving {folder} on 127.0.0.1:{port}: {err}; set ASYNCRL_WHEELS_PORT") from None
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"--find-links http://127.0.0.1:{server.server_address[1]}/", True
    finally:
        server.shutdown()


@dataclass(frozen=True)
class Built:
    image: str
    seconds: float
    size_bytes: int


def build_project_images(torch_pip_args: str, host_network: bool) -> list[Built]:
    """`docker build` of each project image, as docs/deploy.md lists it (plus where torch comes from)."""
    built = []
    for image, target in PROJECT_IMAGES.items():
        extra = ["--network", "host"] if host_network else []
        if torch_pip_args:
            extra += ["--build-arg", f"TORCH_PIP_ARGS={torch_pip_args}"]
        start = time.monotonic()
        docker("build", *extra, "-f", "deploy/docker/Dockerfile", "--target", target, "-t", image, ".",
               timeout=3600)
        built.append(Built(image=image, seconds=round(time.monotonic() - start, 1), size_bytes=image_size_bytes(image)))
    return built
