"""WandbLogger: offline runs hold the events' keys; disabled or missing wandb is a no-op."""

from __future__ import annotations

import logging
import struct
import sys
import time
from pathlib import Path

import pytest

from hflow.trainer.report.wandb_log import WandbLogger, api_key_configured, resolve_mode, scrub_secrets

FAKE_KEY = "0123456789abcdef0123456789abcdef01234567"  # 40 chars, the shape of a wandb key

EVENTS = [
    {"step": s, "time": 1_700_000_000.0 + s, "reward/mean": 0.5 * s, "kl/mean": 0.01 * s,
     "timing/generate": 1.25, "throughput/tokens_per_s": 900.0 + s}
    for s in (1, 2, 3)
]
RECIPE = {"name": "grpo-tiny", "algorithm": "grpo", "trainer": {"total_steps": 3, "lr": 1e-6},
          "hub": {"token": "hf_SECRET_TOKEN", "repo": "me/model"}, "api_key": "x", "db_password": "y"}


@pytest.fixture
def wandb_env(tmp_path, monkeypatch):
    """Offline, silent, every wandb directory under tmp_path, and no key from the developer's machine."""
    for var in ("WANDB_API_KEY", "WANDB_BASE_URL", "WANDB_PROJECT", "WANDB_ENTITY", "WANDB_RUN_ID", "WANDB_RESUME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home" / var.lower()))
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    return tmp_path


def read_wandb_records(run_file: Path) -> list:
    """Records of a `.wandb` file: a LevelDB-style log (32 KiB blocks, 7-byte record headers)
    of protobuf ``Record`` messages after a 7-byte ``:W&B`` file header. wandb ships no Python
    reader for it any more, and offline runs write no wandb-summary.json, so we parse it here."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, block = run_file.read_bytes(), 32768
    assert data[:4] == b":W&B"
    pos, pending, records = 7, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # trailer too short for a header: skip to next block
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if pos + 7 + length > len(data):  # a record still being written
            break
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 0:
            break
        pending = chunk if kind in (1, 2) else pending + chunk  # FULL/FIRST start, MIDDLE/LAST extend
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def finished_records(run_file: Path, timeout_s: float = 60.0) -> list:
    """The records once wandb's exit record is in the file. wandb's service process writes the
    file and may still be flushing it when ``run.finish()`` returns (seen on a loaded CI machine:
    no history yet), so wait for the record that ends a run."""
    deadline = time.monotonic() + timeout_s
    while True:
        records = read_wandb_records(run_file)
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.1)


def item_key(item) -> str:
    """wandb stores a key either flat or split on "/" (``nested_key``)."""
    return item.key or "/".join(item.nested_key)


def history(records: list) -> list[dict[str, str]]:
    return [{item_key(i): i.value_json for i in r.history.item} for r in records
            if r.WhichOneof("record_type") == "history"]


def test_offline_run_has_the_same_metric_keys(wandb_env):
    run_dir = wandb_env / "runs" / "grpo-tiny"
    run_dir.mkdir(parents=True)
    logger = WandbLogger({"enabled": True, "project": "hflow-test", "entity": None, "name": None, "mode": None},
                         run_dir, RECIPE)
    assert logger.mode == "offline" and logger.enabled  # mode None + no key -> offline
    for ev in EVENTS:
        logger.log(ev)
    logger.log(EVENTS[0])  # a replayed step after resume is skipped, not an error
    logger.finish("finished")
    logger.finish("finished")  # idempotent
    assert not logger.enabled

    run_files = list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(run_files) == 1  # wandb's files live under <run_dir>/wandb
    records = finished_records(run_files[0])
    rows = history(records)
    assert [int(r["_step"]) for r in rows] == [1, 2, 3]
    for row, ev in zip(rows, EVENTS):
        metric_keys = {k for k in row if not k.startswith("_")}
        assert metric_keys == set(ev) - {"step", "time"}
        assert float(row["reward/mean"]) == ev["reward/mean"]
        assert float(row["throughput/tokens_per_s"]) == ev["throughput/tokens_per_s"]

    run_record = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    config = {item_key(i) for i in run_record.config.update}
    assert {"name", "algorithm", "trainer", "hub"} <= config
    assert not {"api_key", "db_password"} & config
    summary = {item_key(i): i.value_json for r in records if r.WhichOneof("record_type") == "summary" for i in r.summary.update}
    assert summary.get("hflow/status") == '"finished"'
    assert (run_dir / "wandb" / "hflow-run-id").read_text().strip() == run_record.run_id


def test_eval_events_reach_wandb_at_their_steps(wandb_env):
    """The step-0 baseline (eval/* only) and a later step with eval/* both land in the history."""
    run_dir = wandb_env / "run-eval"
    run_dir.mkdir()
    logger = WandbLogger({"enabled": True, "mode": "offline"}, run_dir, RECIPE)
    events = [{"step": 0, "time": 1.0, "eval/accuracy": 0.25, "eval/reward": 0.25, "timing/eval": 2.0},
              {**EVENTS[0]}, {**EVENTS[1], "eval/accuracy": 0.5, "eval/reward": 0.5}]
    for ev in events:
        logger.log(ev)
    logger.finish("finished")
    rows = history(finished_records(next((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))))
    assert [int(r["_step"]) for r in rows] == [0, 1, 2]
    assert float(rows[0]["eval/accuracy"]) == 0.25 and "reward/mean" not in rows[0]
    assert "eval/accuracy" not in rows[1]
    assert float(rows[2]["eval/accuracy"]) == 0.5


def test_api_key_and_secrets_are_never_written(wandb_env, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", FAKE_KEY)
    run_dir = wandb_env / "run"
    run_dir.mkdir()
    logger = WandbLogger({"enabled": True, "mode": "offline"}, run_dir, RECIPE)
    logger.log(EVENTS[0])
    logger.finish("failed")
    written = b"".join(p.read_bytes() for p in run_dir.rglob("*") if p.is_file())
    assert written  # wandb did write its run ...
    assert FAKE_KEY.encode() not in written and b"hf_SECRET_TOKEN" not in written  # ... without secrets


@pytest.mark.parametrize("cfg", [None, {}, {"enabled": False, "mode": "online"}, {"enabled": True, "mode": "disabled"}])
def test_disabled_logger_is_a_noop(tmp_path, cfg, caplog):
    logger = WandbLogger(cfg, tmp_path, RECIPE)
    logger.log(EVENTS[0])
    logger.finish("finished")
    assert not logger.enabled and logger.mode == "disabled"
    assert not (tmp_path / "wandb").exists()
    assert caplog.records == []


def test_missing_wandb_warns_once_and_is_a_noop(tmp_path, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "wandb", None)  # makes `import wandb` raise ImportError
    with caplog.at_level(logging.WARNING):
        logger = WandbLogger({"enabled": True, "mode": "offline"}, tmp_path, RECIPE)
        for ev in EVENTS:
            logger.log(ev)
        logger.finish("finished")
    assert not logger.enabled
    assert len(caplog.records) == 1 and "wandb is not installed" in caplog.records[0].getMessage()


def test_mode_resolution(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_BASE_URL", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    assert not api_key_configured() and resolve_mode(None) == "offline"
    (tmp_path / "netrc").write_text(f"machine api.wandb.ai\n  login user\n  password {FAKE_KEY}\n")
    assert api_key_configured() and resolve_mode(None) == "online"
    (tmp_path / "netrc").unlink()
    monkeypatch.setenv("WANDB_API_KEY", FAKE_KEY)
    assert resolve_mode(None) == "online"
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert resolve_mode(None) == "offline"  # an explicit environment choice wins over the key
    assert resolve_mode("disabled") == "disabled"
    with pytest.raises(ValueError, match="logging.wandb.mode: 'cloud' is not one of"):
        resolve_mode("cloud")


def test_scrub_secrets_recurses():
    cfg = {"a": 1, "HF_TOKEN": "t", "nested": {"secret_value": 2, "keep": [{"password": 3, "ok": 4}]}, "monkey": 5}
    assert scrub_secrets(cfg) == {"a": 1, "nested": {"keep": [{"ok": 4}]}}  # "monkey" contains "key"
