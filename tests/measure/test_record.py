import json
import subprocess
import sys

from patchbay.measure.tools import record


def test_the_build_id_comes_from_the_engine_on_the_path_without_importing_it(tmp_path):
    pb = tmp_path / "transformers" / "_pb"
    pb.mkdir(parents=True)
    # importing this package would fail: build_id must read the file, not import transformers
    (tmp_path / "transformers" / "__init__.py").write_text("raise RuntimeError('imported')\n")
    (pb / "build_info.py").write_text(f"BUILD_JSON = r'''{json.dumps({'build_id': 'pb-0123456789ab'})}'''\n")
    code = "from patchbay.measure.tools import record; print(record.build_id())"
    from patchbay import ROOT

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": f"{tmp_path}:{ROOT / 'src'}"}).stdout
    assert out.strip() == "pb-0123456789ab"


def test_a_transformers_without_the_overlay_is_unknown():
    # the test environment's transformers is the pinned upstream release, no _pb
    assert record.build_id() == "unknown"


def test_the_command_line_names_the_module_its_arguments_and_the_build(tmp_path):
    line = record.write_command(tmp_path, "memfit", ["/tmp/out dir", "--tp", "2"], build="pb-abc")
    assert line == "python -m patchbay.measure.tools.memfit '/tmp/out dir' --tp 2 (build pb-abc)"
    record.write_command(tmp_path, "memfit", ["/tmp/out dir", "--tp", "2"], build="pb-abc")  # a second rank
    record.write_command(tmp_path, "stalls", ["part"], build="pb-abc")
    assert (tmp_path / "command.txt").read_text().splitlines() == [
        line, "python -m patchbay.measure.tools.stalls part (build pb-abc)"]
