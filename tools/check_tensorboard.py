#!/usr/bin/env python3
"""Check what `fsdp train --tensorboard DIR` wrote with TensorBoard's own reader.

    tools/check_tensorboard.py DIR METRICS.jsonl [--accuracy X]
    tools/check_tensorboard.py --golden

The first form loads DIR with tensorboard's EventAccumulator (every scalar
kept, orphaned steps purged as TensorBoard does) and compares its tags,
steps and values with the run's --log file: train/loss, train/lr,
train/grad_norm, train/tokens_per_s, train/step_ms, train/mfu (when not
null), eval/loss (when present) and memory/peak_bytes/device_D, and
eval/accuracy with --accuracy. A resumed run's log holds the steps an
interrupted run logged past its checkpoint too; its line with
"resumed_from": S replaces them, as TensorBoard's purge on the resumed run's
SessionLog START does. Exit 0 when everything matches, 1 with the
differences, 77 when the tensorboard package is missing (tests skip then).

--golden prints, as C string literals, the TFRecords of three events written
by tensorboard's own RecordWriter: the literals in tests/test_report.c.
"""
import io
import json
import math
import struct
import sys

try:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.record_writer import RecordWriter
except ImportError as e:  # the test that runs this skips
    print(f"SKIP: tensorboard is not installed ({e}); pip install tensorboard", file=sys.stderr)
    sys.exit(77)


def f32(v):
    """v rounded to float32, as a simple_value holds it (NaN for None)."""
    if v is None:
        return math.nan
    return struct.unpack("<f", struct.pack("<f", float(v)))[0]


def golden():
    def record(ev):
        b = io.BytesIO()
        RecordWriter(b).write(ev.SerializeToString())
        return b.getvalue()

    value = summary_pb2.Summary.Value
    events = [
        ("file_version, wall_time 1.5",
         event_pb2.Event(wall_time=1.5, file_version="brain.Event:2")),
        ("SessionLog START at step 301, wall_time 1.5",
         event_pb2.Event(wall_time=1.5, step=301,
                         session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START))),
        ("step 7, wall_time 1700000000.25: train/loss 2.25, memory/peak_bytes/device_0 841424",
         event_pb2.Event(wall_time=1700000000.25, step=7, summary=summary_pb2.Summary(value=[
             value(tag="train/loss", simple_value=2.25),
             value(tag="memory/peak_bytes/device_0", simple_value=841424.0)]))),
    ]
    for what, ev in events:
        r = record(ev)
        print(f"/* {what}: {len(r)} bytes */")
        print('"' + "".join(f"\\x{c:02x}" for c in r) + '"')


def expected_from_log(path):
    """{tag: {step: value}} that TensorBoard should show for the --log file at path."""
    want = {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            r = json.loads(line)
            step = r["step"]
            if "resumed_from" in r:  # the purge of the resumed run's START
                for series in want.values():
                    for s in [s for s in series if s > r["resumed_from"]]:
                        del series[s]

            def put(tag, v, rel=0.0):
                want.setdefault(tag, {})[step] = (f32(v), rel)

            put("train/loss", r["loss"])
            put("train/lr", r["lr"])
            put("train/grad_norm", r["grad_norm"])
            put("train/tokens_per_s", r["tokens_per_s"], 1e-5)  # %.6g in the log
            put("train/step_ms", r["step_ms"], 1e-5)
            if r.get("mfu") is not None:
                put("train/mfu", r["mfu"], 1e-5)
            if "eval_loss" in r:
                put("eval/loss", r["eval_loss"])
            for d, b in enumerate(r["peak_bytes"]):
                put(f"memory/peak_bytes/device_{d}", b)
    return want


def same(got, want, rel):
    if math.isnan(want) or math.isnan(got):
        return math.isnan(want) and math.isnan(got)
    return abs(got - want) <= rel * abs(want)


def check(tb_dir, log_path, accuracy):
    want = expected_from_log(log_path)
    if accuracy is not None:
        want["eval/accuracy"] = {max(max(s) for s in want.values()): (f32(accuracy), 0.0)}
    acc = EventAccumulator(tb_dir, size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    problems = []
    if tags != set(want):
        problems.append(f"tags: TensorBoard has {sorted(tags)}, the log needs {sorted(want)}")
    n_values = 0
    for tag in sorted(tags & set(want)):
        got = {e.step: e.value for e in acc.Scalars(tag)}
        if sorted(got) != sorted(want[tag]):
            problems.append(f"{tag}: steps {sorted(got)} in TensorBoard, {sorted(want[tag])} in "
                            f"the log")
            continue
        for step, (w, rel) in want[tag].items():
            n_values += 1
            if not same(got[step], w, rel):
                problems.append(f"{tag} step {step}: {got[step]!r} in TensorBoard, {w!r} in the "
                                f"log")
    if problems:
        print(f"{tb_dir} against {log_path}:", *problems[:20], sep="\n  ")
        return 1
    steps = sorted({s for series in want.values() for s in series})
    print(f"{tb_dir}: {len(tags)} tags, steps {steps[0]}..{steps[-1]}, {n_values} values, as in "
          f"{log_path}")
    return 0


def main(argv):
    if argv[1:] == ["--golden"]:
        golden()
        return 0
    accuracy = None
    if len(argv) == 5 and argv[3] == "--accuracy":
        accuracy = float(argv[4])
    elif len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    return check(argv[1], argv[2], accuracy)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
