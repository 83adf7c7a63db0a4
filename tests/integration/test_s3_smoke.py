"""The S3 service is real: Parquet written through pyarrow's S3FileSystem is listed and read back
through ``FileSystem.from_uri(endpoint.url(...))``, here and in a child process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from harness.s3 import S3Endpoint

_KEY = "events/day=2024-01-02/part 0.parquet"  # a Hive-style directory and a space in the name


def _table() -> pa.Table:
    return pa.table(
        {
            "id": pa.array(range(100), pa.int64()),
            "name": [f"row-{i} ✓" for i in range(100)],
            "emb": pa.array([[float(i), 0.5] for i in range(100)], pa.list_(pa.float32())),
        }
    )


def _bucket_with_file(s3: S3Endpoint) -> str:
    bucket = f"smoke-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(bucket)
    pq.write_table(_table(), f"{bucket}/{_KEY}", filesystem=s3.filesystem())
    return bucket


def test_parquet_round_trip_through_a_uri(s3: S3Endpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    bucket = _bucket_with_file(s3)
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)

    fs, root = pafs.FileSystem.from_uri(s3.url(bucket))
    assert isinstance(fs, pafs.S3FileSystem)
    assert root == bucket
    files = [
        info.path
        for info in fs.get_file_info(pafs.FileSelector(root, recursive=True))
        if info.type == pafs.FileType.File
    ]
    assert files == [f"{bucket}/{_KEY}"]

    with fs.open_input_file(files[0]) as handle:
        parquet = pq.ParquetFile(handle)
        assert parquet.metadata.num_rows == 100
        assert parquet.read().equals(_table())

    fs_file, path = pafs.FileSystem.from_uri(s3.url(bucket, _KEY))
    assert path == f"{bucket}/{_KEY}"
    dataset = pads.dataset(path, filesystem=fs_file, format="parquet")
    assert dataset.to_table().equals(_table())


def test_a_child_process_needs_only_env_and_url(s3: S3Endpoint) -> None:
    bucket = _bucket_with_file(s3)
    script = (
        "import json, sys, pyarrow.dataset as ds, pyarrow.fs as fs\n"
        "f, root = fs.FileSystem.from_uri(sys.argv[1])\n"
        "t = ds.dataset(root, filesystem=f, format='parquet', partitioning='hive').to_table()\n"
        "print(json.dumps({'rows': t.num_rows, 'ids': sum(t['id'].to_pylist()),"
        " 'region': f.region, 'day': str(t['day'][0])}))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")} | s3.env()
    done = subprocess.run(
        [sys.executable, "-c", script, s3.url(bucket, "events")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "rows": 100,
        "ids": sum(range(100)),
        "region": "us-east-1",
        "day": "2024-01-02",
    }
