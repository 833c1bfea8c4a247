"""What a multi-worker survivor holds once a peer is lost mid-call: can it
save, and is what it would save the state of a step?

Two MultiWorkerMirroredStrategy workers on loopback (started here, each a
process of its own) train a small dense model, 50 steps per tf.function
call, as tfdistx's step loop does. Worker 1 exits before its sixth call;
worker 0's sixth call fails at its first all-reduce. Worker 0 then prints
how many steps the loop counted, the optimizer's own iteration count, which
weights the failed call changed, and whether a tf.train.Checkpoint of the
model and optimizer could still be written (and how long it took).

    python benchmarks/lost_peer_state.py

docs/elastic.md quotes it: why the chief saves the copy it took at the
last loop boundary (tfdistx/engine/commit.py), not what it holds when its
call fails.
"""

import json
import os
import socket
import subprocess
import sys
import tempfile
import time

STEPS_PER_CALL = 50
LOSS_AT_CALL = 5


def worker(index: int, ports: list, out: str) -> None:
    os.environ["TF_CONFIG"] = json.dumps(
        {"cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]}, "task": {"type": "worker", "index": index}}
    )
    import keras
    import numpy as np
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = keras.Sequential([keras.Input((10,)), keras.layers.Dense(64), keras.layers.Dense(1)])
        optimizer = keras.optimizers.Adam(1e-3)
        optimizer.build(model.trainable_variables)
    batches = iter(
        strategy.experimental_distribute_dataset(
            tf.data.Dataset.from_tensors((tf.ones([8, 10]), tf.ones([8, 1]))).repeat()
        )
    )

    def one(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x) - y) ** 2)
        grads = tf.distribute.get_replica_context().all_reduce("sum", tape.gradient(loss, model.trainable_variables))
        optimizer.apply_gradients(zip(grads, model.trainable_variables))

    @tf.function(autograph=False)
    def train(n):
        tf.while_loop(lambda i: i < n, lambda i: (strategy.run(one, args=next(batches)), i + 1)[1], [tf.constant(0)])

    steps = 0
    for call in range(1000):
        if index == 1 and call == LOSS_AT_CALL:
            os._exit(3)
        iterations, held = int(optimizer.iterations.numpy()), [v.numpy().copy() for v in model.trainable_variables]
        try:
            train(tf.constant(STEPS_PER_CALL))
            steps += STEPS_PER_CALL
        except tf.errors.OpError as error:
            found = {
                "failed_call": call,
                "error": type(error).__name__,
                "steps_counted": steps,
                "optimizer_iterations": int(optimizer.iterations.numpy()),
                "iterations_before_the_call": iterations,
                "weights_changed": [
                    bool(not np.array_equal(a, v.numpy())) for a, v in zip(held, model.trainable_variables)
                ],
            }
            started = time.perf_counter()
            try:
                tf.train.Checkpoint(model=model, optimizer=optimizer).write(os.path.join(out, "ckpt"))
                found["saved_in_seconds"] = round(time.perf_counter() - started, 3)
            except Exception as save_error:  # what TensorFlow says, whatever it is
                found["save_failed"] = f"{type(save_error).__name__}: {str(save_error).splitlines()[0]}"
            print(json.dumps(found), flush=True)
            os._exit(5)
    os._exit(0)


def main() -> None:
    sockets = [socket.socket() for _ in range(2)]
    for sock in sockets:
        sock.bind(("127.0.0.1", 0))
    ports = [sock.getsockname()[1] for sock in sockets]
    for sock in sockets:
        sock.close()
    with tempfile.TemporaryDirectory() as out:
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
        procs = [
            subprocess.Popen(
                [sys.executable, __file__, "--worker", str(i), ",".join(map(str, ports)), out],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
            for i in range(2)
        ]
        output, _ = procs[0].communicate(timeout=300)
        procs[1].wait(timeout=60)
    found = json.loads(output.strip().splitlines()[-1])
    print(f"worker 0, after worker 1 left before call {LOSS_AT_CALL} ({STEPS_PER_CALL} steps a call):")
    print(f"  the call failed: {found['error']}")
    print(
        f"  steps the loop counted: {found['steps_counted']}; the optimizer's iterations: "
        f"{found['optimizer_iterations']} ({found['optimizer_iterations'] - found['iterations_before_the_call']} in "
        "the failed call)"
    )
    print(f"  weights the failed call changed: {found['weights_changed']}")
    print(
        f"  a checkpoint written after the loss: {found.get('saved_in_seconds', 'no')} s"
        if "saved_in_seconds" in found
        else f"  the checkpoint could not be written: {found['save_failed']}"
    )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        worker(int(sys.argv[2]), [int(p) for p in sys.argv[3].split(",")], sys.argv[4])
    else:
        main()
