"""Keras 3's own optimizers on a fixed problem, for tests/cpu_backend/test_keras_optimizers.cpp.

Usage: keras_optimizers.py STEPS CASE...   where CASE is "KerasClass key=value,key=value".
Two variables (sizes 3 and 5), p0[i] = sin(i + 1) over both, the gradient of step t
g[i] = cos(3 i + t) * (t + 1) / 2, both in float32. Prints one line per case: the final
weights of both variables, concatenated, as repr floats.
"""
import os
import sys

os.environ.setdefault("KERAS_BACKEND", "jax")
import numpy as np  # noqa: E402
import keras  # noqa: E402

SIZES = (3, 5)


def split(x):
    out, at = [], 0
    for n in SIZES:
        out.append(np.asarray(x[at:at + n], dtype="float32"))
        at += n
    return out


def value(text):
    if text in ("true", "false"):
        return text == "true"
    return float(text)


def run(steps, case):
    cls, _, opts = case.partition(" ")
    kwargs = {k: value(v) for k, v in (kv.split("=") for kv in opts.split(",") if kv)}
    n = sum(SIZES)
    variables = [keras.Variable(p) for p in split(np.sin(np.arange(n) + 1.0))]
    opt = getattr(keras.optimizers, cls)(**kwargs)
    opt.build(variables)
    for t in range(steps):
        opt.apply(split(np.cos(3.0 * np.arange(n) + t) * (t + 1) / 2), variables)
    return np.concatenate([v.numpy() for v in variables])


def main():
    steps = int(sys.argv[1])
    for case in sys.argv[2:]:
        print(" ".join(repr(float(x)) for x in run(steps, case)))


if __name__ == "__main__":
    main()
