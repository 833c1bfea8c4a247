"""The machine's fp32 matrix-multiply rate through TensorFlow, in GFLOP/s.

Square matmuls of `--size` in one tf.function (XLA off: the same oneDNN
kernels a Dense layer calls), repeated; prints one JSON line. The ceiling a
dense network's training can approach on this machine.
"""

import argparse
import json
import time

import tensorflow as tf


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    n = args.size
    a = tf.random.normal([n, n])
    b = tf.random.normal([n, n])

    @tf.function
    def chain(a, b):
        total = tf.zeros([n, n])
        for _ in tf.range(args.repeats):
            total += tf.matmul(a, b)
        return total

    chain(a, b).numpy()  # trace and warm up
    start = time.perf_counter()
    chain(a, b).numpy()
    elapsed = time.perf_counter() - start
    print(json.dumps({"gflops": 2 * n**3 * args.repeats / elapsed / 1e9}))


if __name__ == "__main__":
    main()
