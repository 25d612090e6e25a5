"""Images: the offline base (debootstrap + torch), the serving image (the series applied inside
the build), and the streamed copy of an image to another node. Everything goes through the
Docker SDK; nothing inside an image build reaches a network.

The serving image is tagged `patchbay:pb-<build id>` and labelled with the build id, so two
nodes agree on an image by that label, not by the image id (which depends on the storage
driver).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

from ... import ROOT
from ...series.knobs import registry_json
from ...series.series import Series
from ...series.upstream import LOCK_PATH, SDIST_CACHE, Lock, fetch_sdist

DOCKER_DIR = ROOT / "docker"
WORK_DIR = ROOT / "build" / "docker"
WHEEL_CACHE = ROOT / ".cache" / "wheelhouse"
BASE_REPO = "patchbay-base"
IMAGE_REPO = "patchbay"
SUITE = "bookworm"  # its python3 is 3.11, the same ABI as the host's cp311 wheels
BASE_PACKAGES = ("python3", "python3-venv", "python3-pip", "git", "ca-certificates", "iproute2", "procps")
BASE_RECIPE = 1  # bump when ensure_base changes what it makes
LABEL = "org.patchbay"  # label prefix: .build, .upstream, .patches, .knobs, .commit, .recipe


class ImageError(RuntimeError):
    """One message for the operator: what failed and where its details are."""


# ---- what goes into an image ----------------------------------------------------------------


def pinned(extra: str, name: str) -> str:
    """The `name==version` line pinned in pyproject.toml's extra (the one place pins live)."""
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    for req in data["project"]["optional-dependencies"][extra]:
        if re.split(r"[=<>!~ \[]", req, maxsplit=1)[0].lower() == name:
            return req
    raise ImageError(f"pyproject.toml: no pin for {name} in the {extra} extra")


def serving_requirements() -> list[str]:
    """The engine's run-time dependencies the image installs next to the base's torch."""
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    reqs = [r for r in data["project"]["dependencies"] + data["project"]["optional-dependencies"]["engine"]
            if not r.lower().startswith(("torch==", "transformers=="))]
    # The pristine release is installed first (its dependencies, and packages that require it,
    # such as xgrammar, resolve against it); the patched wheel then replaces it alone.
    return reqs + [f"{Lock.read().name}=={Lock.read().version}"]


def _pip(args: list[str], what: str) -> None:
    # The host's pip reads its own configuration (index, find-links, certificates): no
    # registry is named here.
    proc = subprocess.run([sys.executable, "-m", "pip", *args, "--disable-pip-version-check"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        lines = [l for l in (proc.stdout + proc.stderr).splitlines() if "is ignored" not in l]
        raise ImageError(f"{what} failed:\n" + "\n".join(lines[-12:]))


def wheelhouse(requirements: list[str], drop: tuple[str, ...] = (), progress=print) -> Path:
    """Wheels for requirements, downloaded on the host once per requirement set."""
    key = hashlib.sha256("\n".join(requirements + ["drop:", *drop, "torch:", pinned("engine", "torch")])
                         .encode()).hexdigest()[:12]
    dest = WHEEL_CACHE / key
    if (dest / ".complete").is_file():
        return dest
    progress(f"downloading {len(requirements)} requirement(s) and their dependencies into {dest.relative_to(ROOT)}")
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    # torch is held at the pin so that a dependency asking for any torch (accelerate) resolves
    # to the host's wheel, not the newest index release with its CUDA libraries.
    constraints = dest / ".constraints.txt"
    constraints.write_text(pinned("engine", "torch") + "\n")
    _pip(["download", "-q", "--only-binary=:all:", "-d", str(dest), "-c", str(constraints), *requirements],
         "downloading wheels")
    for name in drop:  # e.g. torch: the base image already has it, and must keep its own
        for wheel in dest.glob(f"{name}-*.whl"):
            wheel.unlink()
    (dest / ".complete").write_text(key + "\n")
    return dest


def _copy_tree(src: Path, dest: Path) -> None:
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


def _link_or_copy(src: Path, dest: Path) -> None:
    try:
        os.link(src, dest)
    except OSError:
        shutil.copy2(src, dest)


# ---- the Docker SDK -------------------------------------------------------------------------


def stream_build(client, context: Path, tag: str, *, dockerfile: str = "Dockerfile", buildargs=None,
                 labels=None, log_path: Path, progress=print) -> None:
    """Build through the SDK, printing one line per step; on failure raise with the failing
    step and the last lines of its output. The whole log goes to log_path."""
    import docker.errors

    log_path.parent.mkdir(parents=True, exist_ok=True)
    step, step_lines = "(before the first step)", []
    t0 = time.monotonic()
    with log_path.open("w") as log:
        try:
            stream = client.api.build(path=str(context), dockerfile=dockerfile, tag=tag, buildargs=buildargs or {},
                                      labels=labels or {}, rm=True, forcerm=True, decode=True, pull=False)
            for chunk in stream:
                if "stream" in chunk:
                    text = chunk["stream"]
                    log.write(text)
                    for line in text.splitlines():
                        if re.match(r"^Step \d+/\d+ : ", line):
                            step, step_lines = line, []
                            shown = line if len(line) < 110 else line[:107] + "..."
                            progress(f"  [{time.monotonic() - t0:5.0f}s] {shown}")
                        elif line.strip():
                            step_lines.append(line)
                elif "error" in chunk:
                    log.write(chunk["error"] + "\n")
                    tail = "\n".join("    " + l for l in step_lines[-20:])
                    raise ImageError(f"image build failed at {step}\n{tail}\n  error: {chunk['error'].strip()}\n"
                                     f"  full log: {log_path}")
        except docker.errors.APIError as e:
            raise ImageError(f"image build failed: {e.explanation or e}; full log: {log_path}") from None


def find_image(client, ref: str):
    import docker.errors

    try:
        return client.images.get(ref)
    except docker.errors.ImageNotFound:
        return None


# ---- the offline base -----------------------------------------------------------------------


def _deb822_entries(text: str):
    for para in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        for line in para.splitlines():
            if line.startswith("#") or ":" not in line or line.startswith((" ", "\t")):
                continue
            key, _, value = line.partition(":")
            fields[key.strip().lower()] = value.strip()
        if fields.get("enabled", "yes").lower() == "no":
            continue
        for uri in fields.get("uris", "").split():
            yield fields.get("types", ""), uri, fields.get("suites", "").split(), fields.get("components", "").split()


def _one_line_entries(text: str):
    for line in text.splitlines():
        parts = re.sub(r"\[[^]]*\]", "", line.split("#", 1)[0]).split()
        if len(parts) >= 4 and parts[0] in ("deb", "deb-src"):
            yield parts[0], parts[1], [parts[2]], parts[3:]


def apt_mirror(etc_apt: Path = Path("/etc/apt"), suite: str = SUITE) -> str:
    """The host's own mirror for `suite main`, read from its apt sources (never a name of ours)."""
    files = [etc_apt / "sources.list"] + sorted((etc_apt / "sources.list.d").glob("*"))
    for path in files:
        if not path.is_file():
            continue
        text = path.read_text(errors="replace")
        entries = _deb822_entries(text) if path.suffix == ".sources" else \
            _one_line_entries(text) if path.suffix == ".list" or path.name == "sources.list" else []
        for types, uri, suites, components in entries:
            if "deb" in types.split() and suite in suites and "main" in components:
                return uri.rstrip("/")
    raise ImageError(f"no apt source for `{suite} main` in {etc_apt}/sources.list(.d); add one, or pass "
                     "--mirror URL")


def base_key(mirror: str, torch_spec: str) -> str:
    """A hash of every input of the base recipe: its tag changes exactly when the recipe does."""
    h = hashlib.sha256()
    for part in (SUITE, " ".join(BASE_PACKAGES), mirror, torch_spec,
                 (DOCKER_DIR / "base.Dockerfile").read_text(), str(BASE_RECIPE)):
        h.update(part.encode() + b"\0")
    return h.hexdigest()[:12]


def ensure_base(client, *, mirror: str | None = None, progress=print) -> str:
    """The offline base image's tag, built when no image with its content hash exists."""
    torch_spec = pinned("engine", "torch")
    mirror = mirror or apt_mirror()
    tag = f"{BASE_REPO}:{base_key(mirror, torch_spec)}"
    if find_image(client, tag) is not None:
        progress(f"{tag}: already built (same recipe, same mirror, {torch_spec})")
        return tag
    if not shutil.which("debootstrap"):
        raise ImageError("debootstrap is not installed; `apt-get install -y debootstrap` (it builds the base "
                         "from the host's own apt mirror)")
    if os.geteuid() != 0:
        raise ImageError("building the base image runs debootstrap, which needs root; run it as root "
                         "(or give BASE_IMAGE= an existing image with python3 and torch)")
    rootfs_tag = tag.replace(BASE_REPO, f"{BASE_REPO}-rootfs")
    WORK_DIR.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=WORK_DIR, prefix="base-") as tmp:
        tmp = Path(tmp)
        if find_image(client, rootfs_tag) is None:
            rootfs = tmp / "rootfs"
            t0 = time.monotonic()
            progress(f"debootstrap {SUITE} minbase from {mirror} (about 2 minutes)")
            log = WORK_DIR / "debootstrap.log"
            with log.open("w") as f:
                proc = subprocess.run(["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}",
                                       SUITE, str(rootfs), mirror], stdout=f, stderr=subprocess.STDOUT)
            if proc.returncode != 0:
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-12:])
                raise ImageError(f"debootstrap failed (exit {proc.returncode}); last lines of {log}:\n{tail}")
            for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
                for item in (rootfs / cache).glob("*"):
                    if item.is_file():
                        item.unlink()
            progress(f"importing the root file system as {rootfs_tag} ({time.monotonic() - t0:.0f}s so far)")
            tar = subprocess.Popen(["tar", "--numeric-owner", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
            try:
                client.api.import_image_from_stream(tar.stdout, repository=rootfs_tag.split(":")[0],
                                                    tag=rootfs_tag.split(":")[1])
            finally:
                tar.stdout.close()
                tar.wait()
            shutil.rmtree(rootfs, ignore_errors=True)
        context = tmp / "context"
        (context / "wheels").mkdir(parents=True)
        shutil.copy(DOCKER_DIR / "base.Dockerfile", context / "Dockerfile")
        progress(f"adding {torch_spec} (the host's wheel, through pip's own configuration)")
        _pip(["download", "-q", "--only-binary=:all:", "-d", str(context / "wheels"), torch_spec],
             f"downloading {torch_spec}")
        stream_build(client, context, tag, buildargs={"ROOTFS": rootfs_tag, "TORCH_SPEC": torch_spec},
                     labels={f"{LABEL}.base": base_key(mirror, torch_spec)},
                     log_path=WORK_DIR / "base-build.log", progress=progress)
    return tag


# ---- the serving image ----------------------------------------------------------------------


def image_tag(build_id: str) -> str:
    return f"{IMAGE_REPO}:{build_id}"


def recipe_hash() -> str:
    """A hash of what an image is made with besides the series: the Dockerfile, the pinned
    requirements and patchbay's own source (the image runs its build and its preflight probe)."""
    h = hashlib.sha256((DOCKER_DIR / "Dockerfile").read_bytes())
    h.update("\n".join(serving_requirements()).encode())
    package = ROOT / "src" / "patchbay"
    for path in sorted(package.rglob("*.py")):
        h.update(b"\0" + path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:12]


def is_current(found, build_id: str) -> bool:
    return found is not None and found.labels.get(f"{LABEL}.build") == build_id and \
        found.labels.get(f"{LABEL}.recipe") == recipe_hash()


def source_commit() -> str:
    from ...series.gitutil import git

    head = git(["rev-parse", "HEAD"], ROOT, check=False).stdout.strip() or "unknown"
    dirty = git(["status", "--porcelain", "--", "src", "engine", "patches", "docker", "upstream.lock"], ROOT,
                check=False).stdout.strip()
    return head + ("+dirty" if dirty else "")


def labels(series: Series, build_id: str, lock: Lock) -> dict[str, str]:
    registry = json.loads(registry_json(series.knobs()))
    return {f"{LABEL}.build": build_id,
            f"{LABEL}.upstream": f"{lock.name} {lock.version} sdist-sha256:{lock.sdist_sha256}",
            f"{LABEL}.patches": json.dumps([p.path.name for p in series.patches]),
            f"{LABEL}.knobs": json.dumps(registry, sort_keys=True, separators=(",", ":")),
            f"{LABEL}.commit": source_commit(), f"{LABEL}.recipe": recipe_hash()}


def add_ca_bundle(context: Path, extra_ca: Path | None) -> None:
    """ca/extra.crt in the context: the extra bundle, or empty (the Dockerfile then adds nothing)."""
    (context / "ca").mkdir(exist_ok=True)
    ca = context / "ca" / "extra.crt"
    if extra_ca:
        if not extra_ca.is_file() or "BEGIN CERTIFICATE" not in extra_ca.read_text(errors="replace"):
            raise ImageError(f"EXTRA_CA_BUNDLE={extra_ca}: not a PEM certificate file (expected "
                             "-----BEGIN CERTIFICATE----- blocks)")
        shutil.copy(extra_ca, ca)
    else:
        ca.write_text("")


def build_context(series: Series, build_id: str, lock: Lock, extra_ca: Path | None, progress=print) -> Path:
    """The build context: Dockerfile, wheelhouse, patchbay's source, the series, its overlay and the sdist."""
    context = WORK_DIR / f"context-{build_id}"
    shutil.rmtree(context, ignore_errors=True)
    context.mkdir(parents=True)
    shutil.copy(DOCKER_DIR / "Dockerfile", context / "Dockerfile")
    add_ca_bundle(context, extra_ca)
    reqs = serving_requirements()
    wheels = wheelhouse(reqs, drop=("torch",), progress=progress)
    (context / "wheelhouse").mkdir()
    for wheel in wheels.glob("*.whl"):
        _link_or_copy(wheel, context / "wheelhouse" / wheel.name)
    (context / "requirements.txt").write_text("\n".join(reqs) + "\n")
    tree = context / "patchbay"
    _copy_tree(ROOT / "src" / "patchbay", tree / "src" / "patchbay")
    _copy_tree(series.dir, tree / "patches")
    if series.overlay:
        _copy_tree(series.overlay, tree / "engine")
    shutil.copy(LOCK_PATH, tree / "upstream.lock")
    (tree / ".cache" / "sdists").mkdir(parents=True)
    sdist = fetch_sdist(lock.name, lock.version, SDIST_CACHE)
    _link_or_copy(sdist, tree / ".cache" / "sdists" / sdist.name)
    return context


def build_image(client, series: Series, *, base_image: str = "", extra_ca: Path | None = None,
                progress=print) -> tuple[str, bool]:
    """The serving image's tag for series, and whether it was built now (False: it existed)."""
    lock = Lock.read()
    build_id = "pb-" + series.build_id(LOCK_PATH)
    tag = image_tag(build_id)
    if is_current(find_image(client, tag), build_id):
        return tag, False
    base = base_image or ensure_base(client, progress=progress)
    if find_image(client, base) is None:
        raise ImageError(f"BASE_IMAGE={base} is not on this machine; load it (`docker load`), or leave "
                         "BASE_IMAGE empty for the offline base `patchbay base-image` makes")
    context = build_context(series, build_id, lock, extra_ca, progress=progress)
    progress(f"building {tag} on {base}")
    try:
        stream_build(client, context, tag, buildargs={"BASE_IMAGE": base, "BUILD_ID": build_id},
                     labels={**labels(series, build_id, lock), f"{LABEL}.base": base},
                     log_path=WORK_DIR / f"{build_id}.log", progress=progress)
    finally:
        shutil.rmtree(context, ignore_errors=True)
    return tag, True


# ---- copying an image to another node -------------------------------------------------------


def copy_image(src, dst, tag: str, build_id: str, *, as_tag: str | None = None, progress=print) -> bool:
    """Stream `save` on src into `load` on dst, no file in between; verified by the build label.
    Returns False when dst already had it. as_tag loads it under another name (tests, one daemon)."""
    target = as_tag or tag
    if is_current(find_image(dst, target), build_id):
        return False
    image = find_image(src, tag)
    if not is_current(image, build_id):
        raise ImageError(f"{tag} with build {build_id} is not on the head node; run `scripts/serve.sh build`")
    size = image.attrs.get("Size", 0)
    progress(f"copying {tag} ({size / 2**30:.1f} GiB unpacked) to the worker, streamed")
    # Saving by id leaves the tags out of the archive, so the load names nothing by itself.
    chunks = src.api.get_image(image.id, chunk_size=1 << 20)
    loaded = None
    for event in dst.api.load_image(chunks):
        text = event.get("stream", "") if isinstance(event, dict) else ""
        m = re.search(r"Loaded image ID: (sha256:[0-9a-f]+)", text)
        if m:
            loaded = m.group(1)
        if isinstance(event, dict) and event.get("error"):
            raise ImageError(f"loading {tag} on the worker failed: {event['error']}")
    if loaded is None:
        raise ImageError(f"loading {tag} on the worker reported no image id")
    dst.images.get(loaded).tag(*target.split(":", 1))
    if not is_current(find_image(dst, target), build_id):
        raise ImageError(f"{target} on the worker does not carry build {build_id} and recipe {recipe_hash()}")
    return True
