"""Issue 56, item 4: a streamed table on ``s3://``, against a local S3-compatible server (moto in server mode, a
real subprocess on a free port; never the internet): the same splits, encoding and batches as the same files on
local disk, and a store that refuses the credentials is one line."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
import torch

from datamodules.parquet_source import ParquetSource
from datamodules.streaming_table import StreamingTableDataModule


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_moto(log: Path, **env: str):
    """``moto_server`` on 127.0.0.1:<free port> (its URL and process), once it answers."""
    port = free_port()
    moto = Path(sys.executable).with_name("moto_server")
    with log.open("w") as out:
        server = subprocess.Popen([str(moto), "-H", "127.0.0.1", "-p", str(port)], stdout=out, stderr=out,
                                  env={**os.environ, **env})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(url + "/moto-api/", timeout=1)
            return url, server
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                pytest.fail(f"moto_server did not start: {log.read_text()[-2000:]}")
            time.sleep(0.2)


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory):
    """A local S3-compatible server, stopped at the end."""
    url, server = start_moto(tmp_path_factory.mktemp("moto") / "server.log")
    yield url
    server.terminate()
    server.wait(timeout=10)


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    for key, value in {"AWS_ENDPOINT_URL": s3_server, "AWS_ACCESS_KEY_ID": "testing",
                       "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    return s3_server


def test_a_table_on_s3_streams_as_the_same_files_on_disk(s3_env, tmp_path):
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"x": rng.normal(size=2_000), "c": rng.choice(["a", "b"], 2_000),
                          "y": rng.integers(0, 3, 2_000)})
    local = tmp_path / "events"
    local.mkdir()
    host = s3_env.split("://", 1)[1]
    s3 = pafs.S3FileSystem(endpoint_override=host, scheme="http", access_key="testing", secret_key="testing",
                           region="us-east-1", allow_bucket_creation=True)
    s3.create_dir("bucket")
    for i in range(2):
        table = pa.Table.from_pandas(frame.iloc[i * 1000 : (i + 1) * 1000], preserve_index=False)
        pq.write_table(table, local / f"part-{i}.parquet", row_group_size=250)
        pq.write_table(table, f"bucket/events/part-{i}.parquet", filesystem=s3, row_group_size=250)
    remote = ParquetSource("s3://bucket/events")
    assert remote.files == ["bucket/events/part-0.parquet", "bucket/events/part-1.parquet"] and remote.groups == 8
    assert ParquetSource("s3://bucket/events/part-*.parquet").rows == 2_000
    modules = {}
    for name, path in (("local", str(local)), ("s3", "s3://bucket/events")):
        module = StreamingTableDataModule(path, "y", batch_size=100, num_workers=2)
        module.setup()
        modules[name] = module
    assert modules["s3"].split_sizes == modules["local"].split_sizes
    assert modules["s3"].state_dict() == modules["local"].state_dict()  # the same encoding
    batches = {name: list(module.train_dataloader()) for name, module in modules.items()}
    assert len(batches["s3"]) == len(batches["local"]) > 0
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(batches["s3"], batches["local"]))


def test_a_missing_bucket_or_refused_credentials_are_one_line(s3_env, monkeypatch, tmp_path):
    with pytest.raises((ValueError, FileNotFoundError)) as missing:
        ParquetSource("s3://no-such-bucket/events", owner="StreamingTableDataModule")
    assert str(missing.value).startswith("StreamingTableDataModule: ") and "\n" not in str(missing.value)
    # a server that checks credentials (moto's IAM from the first request) refuses keys it does not know
    url, server = start_moto(tmp_path / "auth.log", INITIAL_NO_AUTH_ACTION_COUNT="0")
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL", url)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAUNKNOWNKEY000000")
        with pytest.raises(ValueError) as refused:
            ParquetSource("s3://bucket/events", owner="StreamingTableDataModule")
    finally:
        server.terminate()
        server.wait(timeout=10)
    message = str(refused.value)
    assert "\n" not in message and "s3://bucket/events" in message and "credentials" in message, message
