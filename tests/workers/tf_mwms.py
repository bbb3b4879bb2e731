"""A TensorFlow worker for crun's --contract tensorflow (tests/integration/test_contracts.py):
MultiWorkerMirroredStrategy from crun's TF_CONFIG, a custom training loop (Keras 3 breaks the
multi-worker Keras guide) of a small dense model on synthetic data, each worker on its own
shard; at the end it writes its weights, which must be identical on every worker.

  crun --contract tensorflow ... tf_mwms.py OUT_DIR [--die-once] [--take-port-once]

--die-once: on the first attempt the last rank SIGKILLs itself after step 5.
--take-port-once: on the first attempt rank 1 binds rank 0's port (from TF_CONFIG) before
rank 0 starts its server, as another process could in the moment between crun's reservation
and the worker's bind; rank 0 must fail, and the restart get new ports. Rank 1 then only holds
the port, without TensorFlow (whose workers take SIGTERM as a preemption notice and wait out
--shutdown-timeout): crun's stop ends it at once.
"""
import hashlib
import json
import os
import signal
import socket
import sys
import time

STEPS = 20
HOLD_S = 300  # rank 1 holding rank 0's port: crun stops it long before, when rank 0 fails


def take_port_of_rank0(out, cluster):
    """Rank 1, first attempt: listen on rank 0's port and say so in OUT_DIR."""
    host, port = cluster[0].rsplit(":", 1)
    s = socket.socket()
    s.bind(("", int(port)))
    s.listen()
    open(os.path.join(out, "port_taken"), "w").write(cluster[0])
    return s


def wait_for(path, seconds=60):
    deadline = time.monotonic() + seconds
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise SystemExit(f"{path} did not appear within {seconds} s")
        time.sleep(0.05)


def main():
    out = next(a for a in sys.argv[1:] if not a.startswith("--"))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    config = json.loads(os.environ["TF_CONFIG"])
    cluster = config["cluster"]["worker"]
    assert config["task"] == {"type": "worker", "index": rank}, config
    assert len(cluster) == world, cluster
    with open(os.path.join(out, f"tf_config_{rank}_{attempt}.json"), "w") as f:
        json.dump(config, f)
    if "--take-port-once" in sys.argv and attempt == 0:
        if rank == 1:
            held = take_port_of_rank0(out, cluster)
            time.sleep(HOLD_S)
            held.close()
            raise SystemExit(f"rank 0 did not fail at its port taken within {HOLD_S} s")
        if rank == 0:
            wait_for(os.path.join(out, "port_taken"))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ["CUDA_VISIBLE_DEVICES"] = "-1"
    import tensorflow as tf
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    assert strategy.num_replicas_in_sync == world
    with strategy.scope():
        tf.keras.utils.set_random_seed(0)  # the same initial weights on every worker
        model = tf.keras.Sequential([tf.keras.Input(shape=(8,)),
                                     tf.keras.layers.Dense(16, activation="relu"),
                                     tf.keras.layers.Dense(1)])
        opt = tf.keras.optimizers.SGD(0.01)
    gen = tf.random.Generator.from_seed(1 + rank)  # each worker its own data

    @tf.function
    def step():
        def replica_step():
            x = gen.normal((32, 8))
            y = tf.reduce_sum(x * tf.range(1.0, 9.0), axis=1, keepdims=True)
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((model(x) - y) ** 2)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            return loss
        per = strategy.run(replica_step)
        return strategy.reduce(tf.distribute.ReduceOp.MEAN, per, axis=None)

    for i in range(STEPS):
        loss = float(step())
        if rank == 0 and i % 5 == 0:
            print(f"step {i}: loss {loss:.3f}", flush=True)
        if "--die-once" in sys.argv and attempt == 0 and rank == world - 1 and i == 5:
            print(f"rank {rank}: SIGKILL to myself (--die-once)", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
    weights = [w.numpy().tolist() for w in model.trainable_variables]
    digest = hashlib.sha256(json.dumps(weights).encode()).hexdigest()
    with open(os.path.join(out, f"tf_{rank}_{attempt}.json"), "w") as f:
        json.dump({"rank": rank, "world": world, "cluster": cluster, "loss": loss,
                   "weights": digest, "tf": tf.__version__}, f)
    print(f"rank {rank}/{world}: {STEPS} steps, loss {loss:.3f}, weights {digest[:12]}",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
