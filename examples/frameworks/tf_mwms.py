# MultiWorkerMirroredStrategy reads TF_CONFIG, which the `tensorflow` plugin sets on every node.
import json
import os

import numpy as np
import tensorflow as tf

task = json.loads(os.environ["TF_CONFIG"])["task"]
strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
rng = np.random.default_rng(0)
x = rng.normal(size=(256, 8)).astype("float32")
y = x.sum(axis=1, keepdims=True)
ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(32 * strategy.num_replicas_in_sync)
hist = model.fit(ds, epochs=3, verbose=0)
print(f"worker {task['index']} replicas {strategy.num_replicas_in_sync} loss {hist.history['loss'][-1]:.4f}", flush=True)
