"""Training steps for bench/bench_lazy.py (which mounts this file into the image under test):
import the framework, build a small MLP, train on synthetic data, print `step I UNIXTIME`
after every step.

    python lazy_train.py --framework torch|tensorflow [--seconds S]

--seconds 0 (the default): one step, then exit (time to the first step); S > 0: steps until S
seconds after the first one (the steady-state step time).
"""

import argparse
import time

ap = argparse.ArgumentParser()
ap.add_argument("--framework", choices=("torch", "tensorflow"), required=True)
ap.add_argument("--seconds", type=float, default=0.0)
args = ap.parse_args()

WIDTH, BATCH = 512, 256

if args.framework == "torch":
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(), torch.nn.Linear(WIDTH, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(BATCH, WIDTH), torch.randn(BATCH, 1)

    def step() -> None:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
else:
    import tensorflow as tf

    tf.random.set_seed(0)
    model = tf.keras.Sequential([tf.keras.layers.Dense(WIDTH, activation="relu"), tf.keras.layers.Dense(1)])
    model.build((None, WIDTH))
    opt = tf.keras.optimizers.SGD(0.01)
    x, y = tf.random.normal((BATCH, WIDTH)), tf.random.normal((BATCH, 1))

    @tf.function
    def step() -> None:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) - y))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))

i = 0
first = None
while True:
    step()
    now = time.time()
    print(f"step {i} {now:.4f}", flush=True)
    first = first or now
    i += 1
    if now - first >= args.seconds:
        break
