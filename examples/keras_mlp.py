"""A small Keras MLP trained on synthetic data, on the CPU, with the TensorFlow backend.

    dlprof run examples/keras_mlp.py --epochs 2
    python examples/keras_mlp.py          # the same, unprofiled

Under `dlprof run` each training batch of `model.fit` ends a step, TensorFlow's ops and Keras's
layers are recorded, and a region marks the evaluation after training.
"""

from __future__ import annotations

import argparse
import os
import time

# TensorFlow logs its setup on stderr; keep the example's output to what it prints itself.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

# Imported after the environment above is set: TensorFlow and Keras read it when they load.
import keras
import numpy as np

import dlprof


def build_model(features: int, classes: int, width: int, jit_compile: bool = False) -> keras.Model:
    model = keras.Sequential(
        [
            keras.Input((features,)),
            keras.layers.Dense(width, activation="relu", name="hidden_1"),
            keras.layers.Dense(width, activation="relu", name="hidden_2"),
            keras.layers.Dense(classes, name="logits"),
        ],
        name="mlp",
    )
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        jit_compile=jit_compile,
    )
    return model


def synthetic_data(samples: int, features: int, classes: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Points around one random centre per class: learnable, so the loss goes down."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(classes, features)).astype("float32")
    labels = rng.integers(0, classes, samples)
    points = centres[labels] + 0.5 * rng.normal(size=(samples, features)).astype("float32")
    return points.astype("float32"), labels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--jit", action="store_true", help="compile the training step with XLA")
    args = parser.parse_args()
    keras.utils.set_random_seed(0)
    features, classes = 32, 10
    x, y = synthetic_data(args.samples, features, classes)
    model = build_model(features, classes, args.width, jit_compile=args.jit)
    started = time.perf_counter()
    history = model.fit(x, y, batch_size=args.batch_size, epochs=args.epochs, verbose=0)
    with dlprof.region("evaluate"):
        loss, accuracy = model.evaluate(x[:512], y[:512], verbose=0)
    print(f"trained {args.epochs} epochs in {time.perf_counter() - started:.1f}s: "
          f"loss {history.history['loss'][-1]:.3f} -> {loss:.3f}, accuracy {accuracy:.2f}")


if __name__ == "__main__":
    main()
