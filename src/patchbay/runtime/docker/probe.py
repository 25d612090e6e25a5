"""Checks that run on a node, inside a throwaway container of the serving image on the host
network (`python3 -m patchbay.runtime.docker.probe SPEC_JSON`): what that node has, seen from where the rank
will run. Standard library only; prints one JSON object.

SPEC keys (each optional): mem_gib, disk_gib, addr, ports [[host, port], ...], ifnames [...],
gpus {count, min_free_gib}, model {path, cache}, connect [host, port, seconds],
listen [port, seconds].
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from ...series.upstream import sha256_file


def mem(need_gib: float) -> tuple[bool, str]:
    text = Path("/proc/meminfo").read_text()
    kib = int(re.search(r"^MemAvailable:\s+(\d+)", text, re.M).group(1))
    have = kib / 2**20
    return have >= need_gib, f"MemAvailable {have:.1f} GiB (need {need_gib})"


def disk(need_gib: float) -> tuple[bool, str]:
    have = shutil.disk_usage("/").free / 2**30
    return have >= need_gib, f"{have:.1f} GiB free under Docker's data root (need {need_gib})"


def port_free(host: str, port: int) -> tuple[bool, str]:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            return False, f"{host}:{port} is in use ({e.strerror})"
    return True, f"{host}:{port} is free"


def ifname(name: str) -> tuple[bool, str]:
    present = sorted(os.listdir("/sys/class/net"))
    if name in present:
        return True, f"{name} exists"
    return False, f"no interface {name} (present: {', '.join(present)})"


def addr(ip: str) -> tuple[bool, str, dict]:
    """Whether this node holds ip, and on which interface (what gloo and nccl must use)."""
    try:
        out = subprocess.run(["ip", "-o", "addr", "show"], capture_output=True, text=True, timeout=10).stdout
    except OSError as e:
        return False, f"cannot list addresses ({e})", {}
    held = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) > 3 and parts[2] in ("inet", "inet6"):
            held.append((parts[1], parts[3].split("/")[0]))
    for name, have in held:
        if have == ip:
            return True, f"{ip} is on {name}", {"ifname": name}
    try:  # a host name: the address it resolves to
        resolved = socket.gethostbyname(ip)
    except OSError:
        resolved = None
    for name, have in held:
        if resolved and have == resolved:
            return True, f"{ip} ({resolved}) is on {name}", {"ifname": name}
    shown = ", ".join(f"{a} on {n}" for n, a in held if not a.startswith("fe80")) or "none"
    return False, f"{ip} is not an address of this node (it has: {shown})", {}


def gpus(count: int, min_free_gib: float) -> tuple[bool, str]:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,memory.free", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"nvidia-smi did not run ({e})"
    free = [int(line.split(",")[1]) / 1024 for line in out.stdout.strip().splitlines() if "," in line]
    good = [f for f in free if f >= min_free_gib]
    detail = f"{len(free)} GPU(s) visible, free GiB: {', '.join(f'{f:.0f}' for f in free) or 'none'}"
    return len(good) >= count, f"{detail} (need {count} with {min_free_gib} GiB free)"


def model(path: str, cache: str) -> tuple[bool, str, dict]:
    """Hash every file of the checkpoint; a file whose Hugging Face cache blob is named by its
    sha256 must match that name. Hashes are reused from the cached manifest while a file's size
    and mtime are unchanged, so the second check is fast."""
    root = Path(path)
    if not (root / "config.json").is_file():
        return False, f"no config.json in {path}", {}
    cache_file = Path(cache) / (hashlib.sha256(str(root).encode()).hexdigest()[:16] + ".json")
    try:
        cached = json.loads(cache_file.read_text())["files"]
    except (OSError, ValueError, KeyError):
        cached = {}
    files, hashed, bad = {}, 0, []
    for item in sorted(root.rglob("*")):
        rel = str(item.relative_to(root))
        if not item.is_file() or rel.startswith(".") or "/." in rel:
            continue
        st = item.stat()
        old = cached.get(rel)
        if old and old["size"] == st.st_size and old["mtime_ns"] == st.st_mtime_ns:
            digest = old["sha256"]
        else:
            digest, hashed = sha256_file(item), hashed + 1
        blob = Path(os.path.realpath(item)).name
        if re.fullmatch(r"[0-9a-f]{64}", blob) and blob != digest:
            bad.append(rel)
        files[rel] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": digest}
    if bad:
        return False, f"{len(bad)} file(s) differ from their pinned hash: {', '.join(bad[:3])}", {}
    manifest = hashlib.sha256(json.dumps({k: v["sha256"] for k, v in files.items()}, sort_keys=True)
                              .encode()).hexdigest()[:16]
    try:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        cache_file.write_text(json.dumps({"path": str(root), "manifest": manifest, "files": files}, indent=1))
    except OSError:
        pass  # a read-only cache only costs speed
    return True, f"{len(files)} files verified, manifest {manifest} ({hashed} hashed, " \
                 f"{len(files) - hashed} from the cached manifest)", {"manifest": manifest}


def connect(host: str, port: int, seconds: float) -> tuple[bool, str]:
    deadline = time.monotonic() + seconds
    error = ""
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=2):
                return True, f"{host}:{port} answers"
        except OSError as e:
            error = e.strerror or str(e)
            time.sleep(0.3)
    return False, f"{host}:{port} does not answer ({error})"


def listen(port: int, seconds: float) -> None:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("0.0.0.0", port))
        s.listen(8)
        s.settimeout(0.5)
        deadline = time.monotonic() + seconds
        print("listening", flush=True)
        while time.monotonic() < deadline:
            try:
                conn, _ = s.accept()
                conn.close()
            except socket.timeout:
                pass


def run(spec: dict) -> dict:
    out: dict = {}
    if "listen" in spec:
        listen(*spec["listen"])
        return out
    if "mem_gib" in spec:
        out["memory"] = mem(spec["mem_gib"])
    if "disk_gib" in spec:
        out["disk"] = disk(spec["disk_gib"])
    for host, port in spec.get("ports", []):
        out[f"port {port}"] = port_free(host, port)
    for name in spec.get("ifnames", []):
        out[f"interface {name}"] = ifname(name)
    if "gpus" in spec:
        out["gpu"] = gpus(spec["gpus"]["count"], spec["gpus"]["min_free_gib"])
    if "addr" in spec:
        out["address"] = addr(spec["addr"])
    if "model" in spec:
        ok, detail, extra = model(spec["model"]["path"], spec["model"]["cache"])
        out["model"] = (ok, detail, extra)
    if "connect" in spec:
        out["peer"] = connect(*spec["connect"])
    return {k: list(v) for k, v in out.items()}


if __name__ == "__main__":
    print(json.dumps(run(json.loads(sys.argv[1]))))
