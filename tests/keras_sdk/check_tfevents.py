"""Reads skyforge's TensorBoard event files with the real `tensorboard` package.

usage: check_tfevents.py LOGDIR [--expect TAG=STEP:VALUE,STEP:VALUE,...]... [--tol T]

For LOGDIR (one run directory, e.g. logs/train):
  - every events.out.tfevents.* file is read record by record with tensorboard's own record
    reader (which checks both masked CRC-32Cs) and parsed with tensorboard's Event protobuf;
    the first record must carry file_version "brain.Event:2";
  - EventAccumulator (what the TensorBoard UI uses) must list each expected scalar tag with
    exactly the expected (step, value) pairs, values within --tol.
Exit 0 on success; 1 with a message on any mismatch; 77 when tensorboard is not importable.
"""

import glob
import os
import sys


def main(argv):
    try:
        from tensorboard.backend.event_processing import event_accumulator
        from tensorboard.compat.proto import event_pb2
        from tensorboard.compat.tensorflow_stub import pywrap_tensorflow
    except ImportError as e:  # pragma: no cover
        print("tensorboard is not importable: %s" % e)
        return 77

    logdir = argv[1]
    expects = {}
    tol = 1e-6
    i = 2
    while i < len(argv):
        if argv[i] == "--expect":
            tag, pairs = argv[i + 1].split("=", 1)
            expects[tag] = [(int(s), float(v)) for s, v in (p.split(":") for p in pairs.split(","))]
            i += 2
        elif argv[i] == "--tol":
            tol = float(argv[i + 1])
            i += 2
        else:
            print("unknown argument %r" % argv[i])
            return 2

    files = sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*")))
    if not files:
        print("no event files in %s" % logdir)
        return 1
    for path in files:
        reader = pywrap_tensorflow.PyRecordReader_New(path.encode(), 0, b"", None)
        events = []
        while True:
            try:
                reader.GetNext()
            except Exception as e:  # OutOfRangeError at the end, DataLossError on a bad CRC
                if type(e).__name__ == "OutOfRangeError":
                    break
                print("%s: %s: %s" % (path, type(e).__name__, e))
                return 1
            ev = event_pb2.Event()
            ev.ParseFromString(reader.record())
            events.append(ev)
        if not events or events[0].file_version != "brain.Event:2":
            print("%s: first record is not file_version brain.Event:2: %r" % (path, events[:1]))
            return 1
        print("%s: %d records, CRCs ok" % (os.path.basename(path), len(events)))

    acc = event_accumulator.EventAccumulator(logdir, size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    tags = acc.Tags().get("scalars", [])
    for tag, want in expects.items():
        if tag not in tags:
            print("tag %r missing; scalars: %r" % (tag, tags))
            return 1
        got = [(s.step, s.value) for s in acc.Scalars(tag)]
        if len(got) != len(want) or any(
            gs != ws or abs(gv - wv) > tol * max(1.0, abs(wv)) for (gs, gv), (ws, wv) in zip(got, want)
        ):
            print("tag %r: got %r, want %r" % (tag, got, want))
            return 1
        print("tag %r: %d scalars ok" % (tag, len(got)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
