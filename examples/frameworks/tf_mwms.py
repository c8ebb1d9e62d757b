# Data-parallel training with MultiWorkerMirroredStrategy, which reads TF_CONFIG (the `tensorflow`
# plugin sets it on every node). A custom training loop (strategy.run, then strategy.reduce), as
# TensorFlow's multi-worker CTL tutorial does it: Keras 3's Model.fit fails under this strategy
# (TF >= 2.16: "unsupported type (PerReplica) to a Tensor", keras-team/keras#20585). Each worker
# trains on its own shard of one dataset; the Keras optimizer all-reduces the gradients, so every
# worker ends with the same weights. Run with TensorFlow 2.21 / Keras 3.15; the same code runs on
# TF 2.15 with Keras 2. Prints, per worker:
#   worker <i>/<workers> replicas <n> first_loss <this worker's loss on its first batch>
#   loss <the global loss, first step -> last step> weights <sha256 of the trained weights, 16 hex>
import hashlib
import json
import os

import keras
import numpy as np
import tensorflow as tf

PER_REPLICA_BATCH = 16
STEPS = 40

tf_config = json.loads(os.environ["TF_CONFIG"])
strategy = tf.distribute.MultiWorkerMirroredStrategy()
global_batch = PER_REPLICA_BATCH * strategy.num_replicas_in_sync

rng = np.random.default_rng(0)  # one dataset, the same on every worker; each takes its own shard
x = rng.normal(size=(4096, 8)).astype("float32")
y = x @ np.linspace(-1.0, 1.0, 8, dtype="float32")[:, None] + 0.5


def shard(ctx):
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
    return ds.repeat().batch(ctx.get_per_replica_batch_size(global_batch), drop_remainder=True)


batches = iter(strategy.distribute_datasets_from_function(shard))

with strategy.scope():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    optimizer = keras.optimizers.SGD(learning_rate=0.1)
    optimizer.build(model.trainable_variables)


def replica_step(xb, yb):
    with tf.GradientTape() as tape:
        per_example = tf.reduce_mean(tf.square(model(xb, training=True) - yb), axis=1)
        loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))  # sums across replicas
    return loss


@tf.function
def train_step(batch):
    local = strategy.run(replica_step, args=batch)
    return local, strategy.reduce(tf.distribute.ReduceOp.SUM, local, axis=None)


losses = []
for step in range(STEPS):
    local, total = train_step(next(batches))
    if step == 0:
        first_local = float(strategy.experimental_local_results(local)[0]) * strategy.num_replicas_in_sync
    losses.append(float(total))

digest = hashlib.sha256(b"".join(v.numpy().tobytes() for v in model.weights)).hexdigest()[:16]
task, workers = tf_config["task"]["index"], len(tf_config["cluster"]["worker"])
print(f"worker {task}/{workers} replicas {strategy.num_replicas_in_sync} first_loss {first_local:.4f} "
      f"loss {losses[0]:.4f} -> {losses[-1]:.4f} weights {digest}", flush=True)
