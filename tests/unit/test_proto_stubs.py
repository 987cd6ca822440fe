"""The committed stubs in asyncrl/v1 are exactly what scripts/gen_proto.sh generates from proto/."""

import filecmp
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_committed_stubs_are_current(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable}
    subprocess.run(["bash", str(ROOT / "scripts" / "gen_proto.sh"), str(tmp_path)], check=True, env=env, cwd=ROOT)
    generated = sorted(p.name for p in (tmp_path / "asyncrl" / "v1").glob("*_pb2*"))
    committed = sorted(p.name for p in (ROOT / "asyncrl" / "v1").glob("*_pb2*"))
    assert generated == committed
    _match, mismatch, errors = filecmp.cmpfiles(tmp_path / "asyncrl" / "v1", ROOT / "asyncrl" / "v1", generated,
                                                shallow=False)
    assert not mismatch and not errors, f"stale stubs: {mismatch or errors}; run scripts/gen_proto.sh"
