"""Training with jonnx models: train/eval mode, running statistics, optax steps and loops.

Installed as ``jonnx.training``. The training API (``make_train_step``, ``fit``) arrives with
the training work; this package exists now so the layout and imports are stable.
"""

__all__: list[str] = []
