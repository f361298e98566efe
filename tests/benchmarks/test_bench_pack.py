"""benchmarks/bench_pack.py's command line: an option no row of the run would use is refused."""

from __future__ import annotations

import pytest

from benchmarks import bench_pack


def test_a_baseline_without_scale_is_refused_with_the_fix(tmp_path, capsys):
    with pytest.raises(SystemExit) as stopped:
        bench_pack.main(["--baseline", str(tmp_path), "--quick"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert "--baseline" in err and "--scale N" in err
