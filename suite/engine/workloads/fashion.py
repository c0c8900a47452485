"""A deterministic stand-in for Fashion-MNIST (which cannot be downloaded here), with the same
interface as ``tf.keras.datasets.fashion_mnist.load_data()``: 28x28 uint8 images, labels 0-9.

Each class is a fixed random low-frequency template; an image is its class template, shifted
by up to 2 pixels, scaled, plus noise, so a small CNN learns it well above chance but not
trivially. Same arguments, same arrays, on every machine (numpy's PCG64 generator)."""

from __future__ import annotations

import numpy as np

CLASSES = 10
SIDE = 28


def _templates(rng) -> np.ndarray:
    coarse = rng.random((CLASSES, 7, 7))
    return np.kron(coarse, np.ones((4, 4)))  # 28x28 blocks: low-frequency shapes


def _images(rng, templates, n):
    labels = rng.integers(0, CLASSES, n)
    shifts = rng.integers(-2, 3, (n, 2))
    scale = rng.uniform(0.6, 1.0, n)
    noise = rng.normal(0.0, 0.25, (n, SIDE, SIDE))
    images = np.stack([np.roll(templates[c], tuple(s), axis=(0, 1)) for c, s in zip(labels, shifts)])
    pixels = np.clip(images * scale[:, None, None] + noise, 0.0, 1.0)
    return (pixels * 255).astype(np.uint8), labels.astype(np.uint8)


def load_data(n_train: int = 2048, n_test: int = 512, seed: int = 0):
    """``((x_train, y_train), (x_test, y_test))`` like ``fashion_mnist.load_data()``."""
    rng = np.random.default_rng(seed)
    templates = _templates(rng)
    return _images(rng, templates, n_train), _images(rng, templates, n_test)
