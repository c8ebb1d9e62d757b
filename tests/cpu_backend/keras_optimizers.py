"""Keras 3's own optimizers on a fixed problem, for tests/cpu_backend/test_keras_optimizers.cpp.

Usage: keras_optimizers.py STEPS CASE...   where CASE is "KerasClass key=value,key=value",
optionally followed by "|ScheduleClass key=value,..." (the learning rate; a list's items
separated by ";"). Two variables (sizes 3 and 5), p0[i] = sin(i + 1) over both, the gradient of
step t g[i] = cos(3 i + t) * (t + 1) / 2, both in float32. Prints one line per case: the final
weights of both variables, concatenated, as repr floats.

keras_optimizers.py --rates STEPS SCHEDULE...   where SCHEDULE is "ScheduleClass key=value,...":
prints one line per schedule, its float32 rate at iterations 0 .. STEPS-1 (jit-compiled, as in
model.fit's train step).
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


def value(key, text):
    if text in ("true", "false"):
        return text == "true"
    number = int if key == "boundaries" else float  # steps; anything else a float (an int rate computes in int32)
    if key in ("boundaries", "values"):
        return [number(x) for x in text.split(";")]
    return number(text)


def construct(module, spec):
    cls, _, opts = spec.partition(" ")
    kwargs = {k: value(k, v) for k, v in (kv.split("=") for kv in opts.split(",") if kv)}
    return getattr(module, cls), kwargs


def optimizer(case):
    spec, _, schedule = case.partition("|")
    cls, kwargs = construct(keras.optimizers, spec)
    if schedule:
        sched, args = construct(keras.optimizers.schedules, schedule)
        kwargs["learning_rate"] = sched(**args)
    return cls(**kwargs)


def rates(steps, schedule):
    import jax

    sched, args = construct(keras.optimizers.schedules, schedule)
    # Compiled, as model.fit's train step computes it; the iterations counter's dtype.
    at = jax.jit(jax.vmap(sched(**args)))
    iterations = keras.optimizers.SGD().iterations
    return [float(x) for x in np.asarray(at(np.arange(steps).astype(iterations.dtype)), dtype="float32")]


def run(steps, case):
    n = sum(SIZES)
    variables = [keras.Variable(p) for p in split(np.sin(np.arange(n) + 1.0))]
    opt = optimizer(case)
    opt.build(variables)
    for t in range(steps):
        opt.apply(split(np.cos(3.0 * np.arange(n) + t) * (t + 1) / 2), variables)
    return np.concatenate([v.numpy() for v in variables])


def main():
    if sys.argv[1] == "--rates":
        for schedule in sys.argv[3:]:
            print(" ".join(repr(x) for x in rates(int(sys.argv[2]), schedule)))
        return
    steps = int(sys.argv[1])
    for case in sys.argv[2:]:
        print(" ".join(repr(float(x)) for x in run(steps, case)))


if __name__ == "__main__":
    main()
