"""What ran, for a results window's command.txt: the tool module, its arguments, the engine build.

Standard library only (the engine-side hooks use it inside a server process). The build id is read
from the patched engine's `transformers/_pb/build_info.py` without importing transformers, so a
hook installed at interpreter start changes nothing about what the engine imports, or when."""

from __future__ import annotations

import importlib.util
import json
import shlex
from pathlib import Path

UNKNOWN = "unknown"


def build_id() -> str:
    """The engine's build id (`pb-…`, `upstream-…`) from transformers._pb.build_info.BUILD_JSON;
    "unknown" when the importable transformers is not a patchbay build."""
    try:
        spec = importlib.util.find_spec("transformers")
    except (ImportError, ValueError):
        return UNKNOWN
    if spec is None or not spec.submodule_search_locations:
        return UNKNOWN
    for folder in spec.submodule_search_locations:
        path = Path(folder) / "_pb" / "build_info.py"
        if path.is_file():
            scope: dict = {}
            try:
                exec(compile(path.read_text(), str(path), "exec"), scope)  # a module of one constant
                return str(json.loads(scope["BUILD_JSON"]).get("build_id", UNKNOWN))
            except (KeyError, SyntaxError, ValueError):
                return UNKNOWN
    return UNKNOWN


def command_line(tool: str, args: list[str] | tuple[str, ...], build: str | None = None) -> str:
    """`python -m patchbay.measure.tools.TOOL ARGS… (build pb-…)`: one line, shell-quoted."""
    module = tool if "." in tool else f"patchbay.measure.tools.{tool}"
    return f"python -m {shlex.join([module, *map(str, args)])} (build {build or build_id()})"


def write_command(folder: str | Path, tool: str, args: list[str] | tuple[str, ...],
                  build: str | None = None) -> str:
    """Append the tool's command line to FOLDER/command.txt and return it."""
    return append_line(folder, command_line(tool, args, build))


def hook_line(tool: str, env: dict[str, str], argv: list[str], build: str | None = None) -> str:
    """The line an engine-side hook records: its settings, the process it ran in, the build."""
    module = f"patchbay.measure.tools.{tool}"
    settings = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()))
    return f"{settings} {shlex.join(argv)} (sitecustomize hook {module}, build {build or build_id()})"


def append_line(folder: str | Path, line: str) -> str:
    """Append line to FOLDER/command.txt unless it is there already (the ranks of one server
    write the same line)."""
    path = Path(folder) / "command.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    old = path.read_text().splitlines() if path.is_file() else []
    if line not in old:
        with path.open("a") as f:
            f.write(line + "\n")
    return line
