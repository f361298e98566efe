"""benchmarks/bench_remote.py's own parts: its server (moto's application) counts the bytes of
the objects it sends (what the table reports per epoch), and the shards it writes hold every
image once with its label."""

from __future__ import annotations

import tarfile

import pytest

pytest.importorskip("moto", exc_type=ImportError)
boto3 = pytest.importorskip("boto3")

from benchmarks import bench_remote  # noqa: E402


@pytest.mark.slow
def test_the_server_counts_the_bytes_it_sends(tmp_path):
    (tmp_path / "up").mkdir()
    (tmp_path / "up" / "a.bin").write_bytes(b"x" * 300_000)
    (tmp_path / "up" / "b.bin").write_bytes(b"y" * 1234)
    server = bench_remote.Server()
    try:
        assert server.upload(tmp_path / "up", "data/") == 301_234
        client = boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1",
                              aws_access_key_id=bench_remote.ACCESS_KEY,
                              aws_secret_access_key=bench_remote.SECRET_KEY)
        before = bench_remote.bytes_served(server.endpoint)
        body = client.get_object(Bucket=bench_remote.BUCKET, Key="data/a.bin")["Body"].read()
        assert body == b"x" * 300_000
        part = client.get_object(Bucket=bench_remote.BUCKET, Key="data/b.bin",
                                 Range="bytes=0-99")["Body"].read()
        assert part == b"y" * 100
        assert bench_remote.bytes_served(server.endpoint) - before == 300_100
    finally:
        server.close()


def test_the_shards_hold_every_image_once_with_its_label(tmp_path):
    root = tmp_path / "photos"
    for label, names in (("a", ["1.jpg", "2.jpg"]), ("b", ["3.jpg"])):
        (root / label).mkdir(parents=True)
        for name in names:
            (root / label / name).write_bytes(name.encode() * 10)
    labelled = bench_remote.write_shards(root, tmp_path / "tar")
    assert [(p.name, label) for p, label in labelled] == [("1.jpg", 0), ("2.jpg", 0), ("3.jpg", 1)]
    members = {}
    for shard in sorted((tmp_path / "tar").glob("*.tar")):
        with tarfile.open(shard) as tar:
            for member in tar:
                members[member.name] = tar.extractfile(member).read()
    assert members == {"0000000.jpg": b"1.jpg" * 10, "0000000.cls": b"0",
                       "0000001.jpg": b"2.jpg" * 10, "0000001.cls": b"0",
                       "0000002.jpg": b"3.jpg" * 10, "0000002.cls": b"1"}


@pytest.mark.slow
def test_runs_as_a_file_and_says_what_it_measures():
    import subprocess
    import sys
    from pathlib import Path

    script = Path(bench_remote.__file__)
    done = subprocess.run([sys.executable, str(script), "--help"], cwd=script.parent,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "MosaicML Streaming and LitData" in done.stdout and "--streaming-python" in done.stdout


@pytest.mark.slow
@pytest.mark.timeout(600)  # 4 fresh interpreters importing torch, and the server's
def test_a_baseline_checkout_measures_the_fastpipe_rows_again(tmp_path):
    import json
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    root = Path(bench_remote.__file__).resolve().parents[1]
    baseline = tmp_path / "baseline"
    shutil.copytree(root / "fastpipe", baseline / "fastpipe",
                    ignore=shutil.ignore_patterns("csrc", "__pycache__"))
    out = tmp_path / "runs.json"
    done = subprocess.run([sys.executable, "-m", "benchmarks.bench_remote", "--images", "128",
                           "--repeat", "1", "--only", "shard list", "local files",
                           "--baseline", str(baseline), "--json", str(out)],
                          cwd=root, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    measured = [(m["name"], m["baseline"], m["fastpipe"]) for m in json.loads(out.read_text())
                if "rate" in m]
    assert sorted(measured) == sorted(
        (name, side, str((baseline if side else root) / "fastpipe"))
        for name in (bench_remote.LISTED_ROW, "fastpipe TarDataset local files, 2 threads")
        for side in (False, True))
    assert done.stdout.count("| row | current samples/s | baseline samples/s |") == 2
