"""The in-process memo of parsed agent yamls (opencood_ext/data/formats/yaml_memo.py): every lookup
gives new objects, a changed file is parsed again, a file changed too recently is not kept, and
the memo stays within its byte bound."""
import os
import time

import pytest

from opencood_ext.data.errors import DataFormatError
from opencood_ext.data.formats import opv2v_io
from opencood_ext.data.formats.opv2v_io import load_agent_yaml, load_yaml
from opencood_ext.data.formats.yaml_memo import ParsedMemo, file_key

TEXT = "lidar_pose: [1.0, 2.0, 0.5, 0.0, 90.0, 0.0]\nvehicles:\n  7: {angle: [0, 10, 0], speed: %s}\n"


def _write(path, speed="3.5"):
    path.write_text(TEXT % speed)


def test_agent_yamls_come_back_fresh_and_follow_the_file(tmp_path, monkeypatch):
    monkeypatch.setattr(opv2v_io, "AGENT_YAMLS", ParsedMemo())  # this test's own, empty memo
    memo = opv2v_io.AGENT_YAMLS
    y = tmp_path / "000001.yaml"
    _write(y)
    first = load_agent_yaml(y)
    assert first == load_yaml(y) and len(memo) == 0  # written just now: parsed, not kept
    time.sleep(1.1)  # the file has settled (yaml_memo.SETTLE_NS)
    kept = load_agent_yaml(y)
    assert len(memo) == 1 and memo.nbytes > 0
    kept["vehicles"][7]["speed"] = -1.0  # a caller edits what it got ...
    kept["lidar_pose"].append(99)
    again = load_agent_yaml(y)
    assert memo.hits == 1 and again == first  # ... which changes neither the memo nor the next caller's copy
    assert again is not load_agent_yaml(y) and again["vehicles"] is not load_agent_yaml(y)["vehicles"]
    st = y.stat()
    _write(y, speed="5.5")  # rewritten in place, the same size, its modification time put back:
    os.utime(y, ns=(st.st_atime_ns, st.st_mtime_ns))  # only the change time tells
    assert load_agent_yaml(y)["vehicles"][7]["speed"] == 5.5
    y.write_text(TEXT % "3.5" + "extra: 1\n")
    assert load_agent_yaml(y)["extra"] == 1


def test_errors_are_not_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(opv2v_io, "AGENT_YAMLS", ParsedMemo(settle_ns=0))
    y = tmp_path / "000002.yaml"
    y.write_text("lidar_pose: [1, 2\n")
    for _ in range(2):
        with pytest.raises(DataFormatError, match="not valid YAML"):
            load_agent_yaml(y)
    with pytest.raises(DataFormatError, match="cannot read yaml"):
        load_agent_yaml(tmp_path / "missing.yaml")
    assert len(opv2v_io.AGENT_YAMLS) == 0


def test_the_memo_is_bounded_least_recently_used_first(tmp_path):
    paths = []
    for k in range(4):
        paths.append(tmp_path / f"{k}.yaml")
        _write(paths[-1], speed=str(k))
    one = len(__import__("pickle").dumps(load_yaml(paths[0]), protocol=5))
    memo = ParsedMemo(max_bytes=3 * one + one // 2, settle_ns=0)
    for p in paths[:3]:
        memo.load(p, load_yaml)
    assert len(memo) == 3
    memo.load(paths[0], load_yaml)  # 0 is used again: 1 is now the oldest
    memo.load(paths[3], load_yaml)
    assert len(memo) == 3 and memo.nbytes <= memo.max_bytes
    assert memo.get(file_key(paths[1])) is None and memo.get(file_key(paths[0]))["vehicles"][7]["speed"] == 0
    assert ParsedMemo(max_bytes=one - 1, settle_ns=0).load(paths[0], load_yaml)["vehicles"][7]["speed"] == 0
    with pytest.raises(ValueError, match="max_bytes"):
        ParsedMemo(max_bytes=-1)
