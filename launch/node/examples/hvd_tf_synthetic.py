"""A small real Horovod + TensorFlow training on synthetic data (no downloads).

Every rank trains a 2-layer MLP on its own shard of a fixed synthetic regression set;
gradients are averaged with Horovod allreduce. Rank 0 prints throughput over all ranks.
Usage: mpirun ... python /opt/dtrain/node/examples/hvd_tf_synthetic.py [--epochs 3]
"""

import argparse
import time

import numpy as np
import tensorflow as tf
import horovod.tensorflow as hvd

p = argparse.ArgumentParser()
p.add_argument("--epochs", type=int, default=3)
p.add_argument("--samples", type=int, default=4096, help="samples per rank per epoch")
p.add_argument("--batch", type=int, default=64)
args = p.parse_args()

hvd.init()
tf.random.set_seed(1234)
rng = np.random.default_rng(hvd.rank())
true_w = np.linspace(-1, 1, 32, dtype=np.float32).reshape(32, 1)
x = rng.standard_normal((args.samples, 32), dtype=np.float32)
y = np.tanh(x @ true_w) + 0.01 * rng.standard_normal((args.samples, 1), dtype=np.float32)
data = tf.data.Dataset.from_tensor_slices((x, y)).batch(args.batch)

model = tf.keras.Sequential([tf.keras.layers.Dense(64, activation="relu"), tf.keras.layers.Dense(1)])
model.build((None, 32))
opt = tf.keras.optimizers.SGD(0.01 * hvd.size())
loss_fn = tf.keras.losses.MeanSquaredError()


@tf.function
def step(xb, yb):
    with tf.GradientTape() as tape:
        loss = loss_fn(yb, model(xb, training=True))
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))
    return loss


hvd.broadcast_variables(model.variables, root_rank=0)
for epoch in range(1, args.epochs + 1):
    t0 = time.perf_counter()
    losses = [float(step(xb, yb)) for xb, yb in data]
    seconds = time.perf_counter() - t0
    mean = hvd.allreduce(tf.constant(np.mean(losses)), op=hvd.Average)
    print(f"epoch {epoch} rank {hvd.rank()} loss {np.mean(losses):.4f}", flush=True)
    if hvd.rank() == 0:
        total = args.samples * hvd.size() / seconds
        print(f"epoch {epoch} mean loss over {hvd.size()} ranks {float(mean):.4f}; "
              f"throughput {total:.0f} samples/s total ({total / hvd.size():.0f} per rank)", flush=True)
