"""PyTorch twins of skyforge [train] models, for bench/train_vs_pytorch.py.

A twin is built from an example's [[train.layers]] (the model graph: names, inputs, Keras
semantics as docs/layers.md states them) and starts from skyforge's exact initial weights; it
trains on skyforge's exact data order, with the example's optimizer and learning-rate schedule.
What skyforge pins, reproduced here bit for bit:

  Rng, permutation     sdk/include/skyforge/data.hpp (xoshiro256** seeded by SplitMix64,
                       Fisher-Yates with Lemire's bounded draw); epoch e's order on rank 0 and
                       with replicated data is permutation(n, seed + e) (keras.hpp, epoch_seed)
  initial_weights      sdk/include/skyforge/initial_weights.hpp (the flat layout: layers in run
                       order, each layer's tensors in Keras' order, Keras-shaped, row-major)
  learning_rate        sdk/include/skyforge/lr_schedule.hpp (cosine_decay with warmup, in float32)
  dropout masks        kernels/include/skyforge/kernels/philox.hpp (Philox-4x32-10 keyed by seed,
                       step, layer index and rank), so a twin drops what skyforge drops

Images travel NCHW (PyTorch's layout); a layer that sees Keras' channels-last order (flatten,
reshape, concatenate, dense's last axis) converts. Stdlib + numpy + torch only.
"""
import math

import numpy as np

MASK64 = (1 << 64) - 1


# ---- skyforge's generator, shuffle, initial weights and schedule ---------------------------------
class Rng:
    """skyforge::Rng: xoshiro256** with its four words from SplitMix64(seed)."""

    def __init__(self, seed):
        state, self.s = seed & MASK64, []
        for _ in range(4):
            state = (state + 0x9E3779B97F4A7C15) & MASK64
            z = state
            z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
            z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
            self.s.append(z ^ (z >> 31))

    @staticmethod
    def rotl(x, k):
        return ((x << k) | (x >> (64 - k))) & MASK64

    def next(self):
        s = self.s
        result = (self.rotl((s[1] * 5) & MASK64, 7) * 9) & MASK64
        t = (s[1] << 17) & MASK64
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = self.rotl(s[3], 45)
        return result

    def below(self, bound):
        """Uniform in [0, bound): Lemire's multiply-shift with rejection."""
        m = self.next() * bound
        if (m & MASK64) < bound:
            threshold = ((1 << 64) - bound) % bound
            while (m & MASK64) < threshold:
                m = self.next() * bound
        return m >> 64

    def uniform_symmetric(self, n, limit):
        """skyforge::uniform_symmetric: n floats (2u - 1) * limit, u = top 24 bits / 2^24, in float32."""
        u = np.array([self.next() >> 40 for _ in range(n)], dtype=np.float32) * np.float32(1.0 / 16777216.0)
        return (np.float32(2.0) * u - np.float32(1.0)) * np.float32(limit)


def permutation(n, seed):
    """skyforge::permutation(n, shuffle = true, seed) as an int64 array."""
    idx, rng = list(range(n)), Rng(seed)
    for i in range(n - 1, 0, -1):
        j = rng.below(i + 1)
        idx[i], idx[j] = idx[j], idx[i]
    return np.array(idx, dtype=np.int64)


# ---- skyforge's dropout masks --------------------------------------------------------------------
def philox4x32_10(c, k0, k1):
    """Philox-4x32-10 over numpy uint32 counter words c = [c0, c1, c2, c3] (arrays), key (k0, k1)."""
    c0, c1, c2, c3 = (np.asarray(v, dtype=np.uint32) for v in c)
    for r in range(10):
        if r:
            k0, k1 = (k0 + 0x9E3779B9) & 0xFFFFFFFF, (k1 + 0xBB67AE85) & 0xFFFFFFFF
        p0 = c0.astype(np.uint64) * np.uint64(0xD2511F53)
        p1 = c2.astype(np.uint64) * np.uint64(0xCD9E8D57)
        c0, c1, c2, c3 = ((p1 >> np.uint64(32)).astype(np.uint32) ^ c1 ^ np.uint32(k0), p1.astype(np.uint32),
                          (p0 >> np.uint64(32)).astype(np.uint32) ^ c3 ^ np.uint32(k1), p0.astype(np.uint32))
    return c0, c1, c2, c3


# Salmon et al.'s known answer for counter 0, key 0 (as tests/kernels checks philox.hpp).
assert [int(v) for v in philox4x32_10([0, 0, 0, 0], 0, 0)] == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]


def dropout_mask(seed, step, layer, rank, n, rate):
    """skyforge's inverted-dropout multipliers of n elements (philox.hpp's dropout_keep): element i
    is kept iff the top 24 bits of word i % 4 of block i // 4 are at least ceil(rate * 2^24)."""
    rate = np.float32(rate)
    c = float(rate) * 16777216.0
    cut = int(c) + (1 if int(c) < c else 0)
    j = np.arange((n + 3) // 4, dtype=np.uint64)
    words = philox4x32_10([j.astype(np.uint32), np.full(j.size, layer | (rank << 16), np.uint32),
                           np.full(j.size, step & 0xFFFFFFFF, np.uint32), np.full(j.size, step >> 32, np.uint32)],
                          seed & 0xFFFFFFFF, seed >> 32)
    bits = np.stack(words, axis=1).reshape(-1)[:n]
    scale = np.float32(1) / (np.float32(1) - rate)
    return np.where((bits >> np.uint32(8)) >= cut, scale, np.float32(0)).astype(np.float32)


def glorot(rng, n, fan_in, fan_out):
    return rng.uniform_symmetric(n, np.float32(math.sqrt(6.0 / (fan_in + fan_out))))


def cosine_decay_rate(s, iteration):
    """lr_schedule.hpp's cosine_decay: the rate of the update after `iteration` updates, in float32."""
    f = np.float32
    init, target = f(s.get("initial_learning_rate", 0.0)), f(s["warmup_target"]) if "warmup_target" in s else None
    warmup, decay = f(s.get("warmup_steps", 0)), f(s["decay_steps"])
    alpha = f(s.get("alpha", 0.0))
    one_minus_alpha = f(1.0 - float(s.get("alpha", 0.0)))
    if target is None:  # Keras' warmup_target=None: no warmup, decay from initial_learning_rate
        target, warmup = init, f(0)
    at = min(f(iteration), decay + warmup)
    if at < warmup:
        return float((target - init) * (at / warmup) + init)
    cosine = f(0.5) * (f(1.0) + f(math.cos(float(f(math.pi) * ((at - warmup) / decay)))))
    return float(target * (one_minus_alpha * cosine + alpha))


def schedule_of(train):
    """(rate of update t) for the example's [train]: its constant learning_rate or its schedule."""
    s = train.get("learning_rate_schedule")
    if s is None:
        lr = float(train.get("learning_rate", 1e-3))
        return lambda t: lr
    if s.get("type") != "cosine_decay":
        raise SystemExit(f"torch_twins: learning_rate_schedule type {s.get('type')!r}: only cosine_decay has a twin")
    return lambda t: cosine_decay_rate(s, t)


# ---- the model graph ---------------------------------------------------------------------------
class Layer:
    """One [[train.layers]] entry: its index, type, name, producers and options (defaults applied)."""

    DEFAULTS = {
        "conv2d": {"strides": 1, "padding": "valid", "use_bias": True, "activation": "linear"},
        "dense": {"use_bias": True, "activation": "linear"},
        "batch_normalization": {"momentum": 0.99, "epsilon": 1e-3, "center": True, "scale": True,
                                "synchronized": False},
        "layer_normalization": {"epsilon": 1e-3, "center": True, "scale": True},
        "multi_head_attention": {"dropout": 0.0, "use_bias": True},
        "dropout": {}, "relu": {}, "gelu": {"approximate": False}, "tanh": {}, "sigmoid": {}, "softmax": {},
        "add": {}, "concatenate": {"axis": -1}, "flatten": {}, "reshape": {},
        "global_average_pooling2d": {}, "global_average_pooling1d": {}, "position_embedding": {},
    }

    def __init__(self, index, spec, previous):
        self.index, self.type = index, spec["type"]
        if self.type not in self.DEFAULTS:
            raise SystemExit(f"torch_twins: layer {index} ({self.type}) has no PyTorch twin here")
        self.name = spec.get("name", f"#{index}")
        inputs = spec.get("inputs", previous)
        self.inputs = [v.strip() for v in inputs.split(",")] if isinstance(inputs, str) else list(inputs)
        self.opt = dict(self.DEFAULTS[self.type])
        self.opt.update({k: v for k, v in spec.items() if k not in ("type", "name", "inputs")})

    def __repr__(self):
        return f"layer {self.index} ({self.type} '{self.name}')"

    def pair(self, key):
        v = self.opt[key]
        return (v, v) if isinstance(v, int) else tuple(v)


def graph(specs):
    """Layers in run order: the listing order, which must be topological (as the examples are)."""
    layers, seen = [], {"input"}
    for i, spec in enumerate(specs):
        layer = Layer(i, spec, layers[-1].name if layers else "input")
        for name in layer.inputs:
            if name not in seen:
                raise SystemExit(f"torch_twins: {layer} takes '{name}', not a layer listed before it")
        seen.add(layer.name)
        layers.append(layer)
    return layers


def infer(layer, shapes):
    """The layer's Keras output shape (no batch axis) from its inputs' shapes."""
    s, o, t = shapes[0], layer.opt, layer.type
    if t == "conv2d":
        (kh, kw), (sh, sw) = layer.pair("kernel_size"), layer.pair("strides")
        if o["padding"] == "same":
            return (-(-s[0] // sh), -(-s[1] // sw), o["filters"])
        return ((s[0] - kh) // sh + 1, (s[1] - kw) // sw + 1, o["filters"])
    if t == "dense":
        return s[:-1] + (o["units"],)
    if t == "flatten":
        return (math.prod(s),)
    if t == "reshape":
        target = list(o["target_shape"])
        if -1 in target:
            target[target.index(-1)] = math.prod(s) // -math.prod(target)
        return tuple(target)
    if t == "global_average_pooling2d":
        return (s[2],)
    if t == "global_average_pooling1d":
        return (s[1],)
    if t == "concatenate":
        axis = o["axis"] - 1 if o["axis"] > 0 else len(s) + o["axis"]
        return s[:axis] + (sum(x[axis] for x in shapes),) + s[axis + 1:]
    if t == "position_embedding":
        return (o["sequence_length"], s[-1])
    return s  # shape-preserving layers and add


def build(specs, input_shape, flat, masks_seed=None, rank=0):
    """The twin (a torch.nn.Module) of `specs` on samples of Keras shape `input_shape`, holding
    `flat` (skyforge's initial_weights layout) as its parameters. Its dropout layers are
    PyTorch's own, or, given `masks_seed`, draw skyforge's masks for that seed and `rank` at the
    step last given to the twin's set_step (in numpy: ~0.3 ms per step on a 4,096-element layer)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    activations = {"linear": lambda x: x, "relu": F.relu, "gelu": F.gelu, "tanh": torch.tanh,
                   "sigmoid": torch.sigmoid}

    def activation(name, channel_axis):
        if name == "softmax":
            return lambda x: F.softmax(x, dim=channel_axis)
        if name not in activations:
            raise SystemExit(f"torch_twins: activation {name!r} has no twin here")
        return activations[name]

    def to_keras(x):  # NCHW -> NHWC (Keras' element order); other ranks are the same in both
        return x.permute(0, 2, 3, 1) if x.dim() == 4 else x

    def from_keras(x):
        return x.permute(0, 3, 1, 2) if x.dim() == 4 else x

    class KerasConv2d(nn.Conv2d):
        """Conv2d with Keras' padding: 'valid', or 'same' = TF's pad, the odd pixel bottom/right."""

        def __init__(self, cin, cout, k, stride, padding, bias, hw):
            super().__init__(cin, cout, k, stride=stride, padding=0, bias=bias)
            self.pad = None
            if padding == "same":
                t, b = self.same_pad(hw[0], k[0], stride[0])
                l, r = self.same_pad(hw[1], k[1], stride[1])
                self.pad = (l, r, t, b)

        @staticmethod
        def same_pad(size, k, s):
            total = max((-(-size // s) - 1) * s + k - size, 0)
            return total // 2, total - total // 2

        def forward(self, x):
            if self.pad is None:
                return super().forward(x)
            l, r, t, b = self.pad
            if l == r and t == b:  # symmetric: let the convolution pad (no extra copy)
                return F.conv2d(x, self.weight, self.bias, self.stride, (t, l))
            return F.conv2d(F.pad(x, (l, r, t, b)), self.weight, self.bias, self.stride)

    class PositionEmbedding(nn.Module):
        """keras_hub's PositionEmbedding: the table's first `sequence` rows, broadcast over the batch."""

        def __init__(self, length, features):
            super().__init__()
            self.table = nn.Parameter(torch.zeros(length, features))

        def forward(self, x):
            return self.table[:x.shape[1]].expand(x.shape[0], -1, -1)

    def layer_module(layer, shapes):
        """(module or None, forward(inputs) -> output, [(numel, load(array)) in Keras' weight order])."""
        o, s, t = layer.opt, shapes[0], layer.type
        cin = s[-1]
        if t == "conv2d":
            k, stride = layer.pair("kernel_size"), layer.pair("strides")
            m = KerasConv2d(cin, o["filters"], k, stride, o["padding"], o["use_bias"], s[:2])
            act = activation(o["activation"], 1)

            def load_kernel(a):  # (kh, kw, in, filters) -> (filters, in, kh, kw)
                m.weight.copy_(torch.from_numpy(a.reshape(k[0], k[1], cin, o["filters"]).transpose(3, 2, 0, 1).copy()))
            loads = [(k[0] * k[1] * cin * o["filters"], load_kernel)]
            if o["use_bias"]:
                loads.append((o["filters"], lambda a: m.bias.copy_(torch.from_numpy(a))))
            return m, lambda xs: act(m(xs[0])), loads
        if t == "dense":
            if len(s) == 3:
                raise SystemExit(f"torch_twins: {layer} on images has no twin here")
            m = nn.Linear(cin, o["units"], bias=o["use_bias"])
            act = activation(o["activation"], -1)
            loads = [(cin * o["units"], lambda a: m.weight.copy_(torch.from_numpy(a.reshape(cin, -1).T.copy())))]
            if o["use_bias"]:
                loads.append((o["units"], lambda a: m.bias.copy_(torch.from_numpy(a))))
            return m, lambda xs: act(m(xs[0])), loads
        if t in ("batch_normalization", "layer_normalization"):
            if not (o["center"] and o["scale"]) or o.get("synchronized"):
                raise SystemExit(f"torch_twins: {layer}: only center = scale = true, unsynchronized, has a twin here")
            if t == "layer_normalization":
                m = nn.LayerNorm(cin, eps=o["epsilon"])
            elif len(s) in (1, 3):  # Keras' momentum m keeps m of the old statistic; PyTorch's, the new part
                m = (nn.BatchNorm2d if len(s) == 3 else nn.BatchNorm1d)(cin, eps=o["epsilon"], momentum=1.0 - o["momentum"])
            else:
                raise SystemExit(f"torch_twins: {layer} on a sequence has no twin here")
            loads = [(cin, lambda a: m.weight.copy_(torch.from_numpy(a))),
                     (cin, lambda a: m.bias.copy_(torch.from_numpy(a)))]
            return m, lambda xs: m(xs[0]), loads
        if t == "multi_head_attention":
            h, kd = o["num_heads"], o["key_dim"]
            vd = o.get("value_dim", kd)
            if h * kd != cin or vd != kd:
                raise SystemExit(f"torch_twins: {layer}: nn.MultiheadAttention needs num_heads * key_dim = "
                                 f"features ({cin}) and value_dim = key_dim")
            m = nn.MultiheadAttention(cin, h, dropout=o["dropout"], bias=o["use_bias"], batch_first=True)

            def load_rows(tensor, rows):  # a (d, h, kd) kernel is Linear(d, h*kd)'s weight transposed
                return lambda a: tensor[rows].copy_(torch.from_numpy(a.reshape(cin, cin).T.copy()))
            loads = []
            for i in range(3):  # query, key, value: kernel then bias
                rows = slice(i * cin, (i + 1) * cin)
                loads.append((cin * cin, load_rows(m.in_proj_weight, rows)))
                if o["use_bias"]:
                    loads.append((cin, lambda a, rows=rows: m.in_proj_bias[rows].copy_(torch.from_numpy(a))))
            loads.append((cin * cin, load_rows(m.out_proj.weight, slice(None))))
            if o["use_bias"]:
                loads.append((cin, lambda a: m.out_proj.bias.copy_(torch.from_numpy(a))))
            return m, lambda xs: m(xs[0], xs[0], xs[0], need_weights=False)[0], loads
        if t == "position_embedding":
            m = PositionEmbedding(o["sequence_length"], cin)
            return m, lambda xs: m(xs[0]), [(o["sequence_length"] * cin, lambda a: m.table.copy_(
                torch.from_numpy(a.reshape(o["sequence_length"], cin))))]
        if t == "dropout":
            m = nn.Dropout(o["rate"]) if masks_seed is None else PhiloxDropout(o["rate"], layer.index)
            return m, lambda xs: m(xs[0]), []
        if t in ("relu", "gelu", "tanh", "sigmoid", "softmax"):
            if t == "gelu" and o["approximate"]:
                return None, lambda xs: F.gelu(xs[0], approximate="tanh"), []
            return None, lambda xs: activation(t, 1 if xs[0].dim() == 4 else -1)(xs[0]), []
        if t == "add":
            return None, lambda xs: sum(xs[1:], xs[0]), []
        if t == "concatenate":
            axis = o["axis"]
            return None, lambda xs: from_keras(torch.cat([to_keras(x) for x in xs], dim=axis)), []
        if t in ("flatten", "reshape"):
            out = infer(layer, shapes)
            return None, lambda xs: from_keras(to_keras(xs[0]).reshape((xs[0].shape[0],) + out)), []
        if t == "global_average_pooling2d":
            return None, lambda xs: xs[0].mean(dim=(2, 3)), []
        if t == "global_average_pooling1d":
            return None, lambda xs: xs[0].mean(dim=1), []
        raise AssertionError(t)

    clock = {"step": 0}

    class PhiloxDropout(nn.Module):
        """skyforge's dropout: its mask for (seed, step, layer, rank), over Keras' element order."""

        def __init__(self, rate, index):
            super().__init__()
            self.rate, self.index = rate, index

        def forward(self, x):
            if not self.training or self.rate == 0:
                return x
            keras = to_keras(x)
            mask = dropout_mask(masks_seed, clock["step"], self.index, rank, keras.numel(), self.rate)
            return x * from_keras(torch.from_numpy(mask).reshape(keras.shape))

    class Twin(nn.Module):
        def set_step(self, step):
            """The optimizer step the next training forward is (skyforge's dropout key)."""
            clock["step"] = step

        def __init__(self):
            super().__init__()
            self.layers = graph(specs)
            self.steps, shapes, loads = [], {"input": tuple(input_shape)}, []
            last_use = {}
            for i, layer in enumerate(self.layers):
                for name in layer.inputs:
                    last_use[name] = i
            for i, layer in enumerate(self.layers):
                ins = [shapes[n] for n in layer.inputs]
                module, forward, layer_loads = layer_module(layer, ins)
                if module is not None:
                    self.add_module(f"l{layer.index}", module)
                shapes[layer.name] = infer(layer, ins)
                done = [n for n in layer.inputs if last_use[n] == i]  # outputs no later layer reads
                self.steps.append((layer.inputs, layer.name, forward, done))
                loads += layer_loads
            total = sum(n for n, _ in loads)
            if total != flat.size:
                raise SystemExit(f"torch_twins: the twin has {total} weights, skyforge's layout {flat.size}")
            with torch.no_grad():
                at = 0
                for n, load in loads:
                    load(flat[at:at + n])
                    at += n

        def forward(self, x):
            out = {"input": x}
            for inputs, name, forward, done in self.steps:
                out[name] = forward([out[n] for n in inputs])
                for n in done:
                    del out[n]
            return out[name]

    return Twin()


def initial_weights(specs, input_shape, seed):
    """skyforge::initial_weights(input_shape, layers, seed): one float32 array in its layout."""
    rng, parts, shapes = Rng(seed), [], {"input": tuple(input_shape)}
    for layer in graph(specs):
        ins = [shapes[n] for n in layer.inputs]
        o, cin = layer.opt, ins[0][-1]
        if layer.type == "dense":
            parts.append(glorot(rng, cin * o["units"], cin, o["units"]))
            if o["use_bias"]:
                parts.append(np.zeros(o["units"], np.float32))
        elif layer.type == "conv2d":
            kh, kw = layer.pair("kernel_size")
            parts.append(glorot(rng, kh * kw * cin * o["filters"], kh * kw * cin, kh * kw * o["filters"]))
            if o["use_bias"]:
                parts.append(np.zeros(o["filters"], np.float32))
        elif layer.type in ("batch_normalization", "layer_normalization"):
            parts += [np.ones(cin, np.float32), np.zeros(cin, np.float32)]  # build() refuses center/scale off
        elif layer.type == "multi_head_attention":
            h, kd = o["num_heads"], o["key_dim"]
            vd = o.get("value_dim", kd)
            for fan_in, fan_out in ((cin, h * kd), (cin, h * kd), (cin, h * vd), (h * vd, cin)):
                parts.append(glorot(rng, fan_in * fan_out, fan_in, fan_out))
                if o["use_bias"]:
                    parts.append(np.zeros(fan_out, np.float32))
        elif layer.type == "position_embedding":
            n = o["sequence_length"]
            parts.append(glorot(rng, n * cin, n, cin))
        shapes[layer.name] = infer(layer, ins)
    return np.concatenate(parts).astype(np.float32)
