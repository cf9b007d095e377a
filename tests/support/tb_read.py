"""Reads a TensorBoard log directory back with tensorboard's own code, for tests/tensorboard.rs.

Usage: tb_read.py LOGDIR. Prints one JSON object:
  records:    every record of every event file, walked here with tensorboard's
              masked_crc32c and event_pb2 (its loader stops silently at a bad
              record, so this walk fails loudly instead): [{file, step, kind}]
  scalars:    {tag: [[step, value], ...]}             from EventAccumulator
  histograms: {tag: [[step, min, max, num, sum, sum_squares, bucket_count_sum, buckets], ...]}
  text:       {tag: [[step, text], ...]}
"""

import json
import os
import struct
import sys

from tensorboard.backend.event_processing import event_accumulator
from tensorboard.compat.proto import event_pb2
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
from tensorboard.util import tensor_util


def walk(path):
    with open(path, "rb") as f:
        data = f.read()
    pos, out = 0, []
    while pos < len(data):
        if pos + 12 > len(data):
            sys.exit(f"{path}: truncated header at byte {pos}")
        header = data[pos : pos + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", data[pos + 8 : pos + 12])
        if masked_crc32c(header) != length_crc:
            sys.exit(f"{path}: bad length CRC in record {len(out)} at byte {pos}")
        body = data[pos + 12 : pos + 12 + length]
        if len(body) != length or pos + 16 + length > len(data):
            sys.exit(f"{path}: truncated record {len(out)} at byte {pos}")
        (body_crc,) = struct.unpack("<I", data[pos + 12 + length : pos + 16 + length])
        if masked_crc32c(body) != body_crc:
            sys.exit(f"{path}: bad data CRC in record {len(out)} at byte {pos}")
        event = event_pb2.Event()
        event.ParseFromString(body)
        out.append({"file": os.path.basename(path), "step": event.step, "kind": event.WhichOneof("what")})
        pos += 16 + length
    return out


def main(logdir):
    records = []
    for name in sorted(os.listdir(logdir)):
        if "tfevents" in name:
            records.extend(walk(os.path.join(logdir, name)))

    acc = event_accumulator.EventAccumulator(logdir, size_guidance={"scalars": 0, "histograms": 0, "tensors": 0})
    acc.Reload()
    tags = acc.Tags()
    scalars = {t: [[e.step, e.value] for e in acc.Scalars(t)] for t in tags["scalars"]}
    histograms = {}
    for t in tags["histograms"]:
        rows = []
        for e in acc.Histograms(t):
            h = e.histogram_value
            rows.append([e.step, h.min, h.max, h.num, h.sum, h.sum_squares, sum(h.bucket), len(h.bucket)])
        histograms[t] = rows
    text = {}
    for t in tags["tensors"]:
        text[t] = [[e.step, tensor_util.make_ndarray(e.tensor_proto).item().decode()] for e in acc.Tensors(t)]
    json.dump({"records": records, "scalars": scalars, "histograms": histograms, "text": text}, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1])
