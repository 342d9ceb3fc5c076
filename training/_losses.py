"""Loss functions for :func:`~jonnx.training.make_train_step`.

Every loss function has the signature ``loss_fn(outputs, batch)``:

* ``outputs``: the model's outputs, a tuple in ``Model.output_names`` order (what
  ``Model.apply`` returns);
* ``batch``: the batch as given to the step (a dict holding the model inputs by name plus
  whatever else the loss needs, such as labels);

and returns a scalar loss, or ``(loss, aux)`` with ``aux`` a dict of scalar metrics that the
step reports next to the loss (accuracy, say). Any function of that shape works; the helpers
here build the common ones.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax

from jonnx._model import Model

__all__ = ["LossFn", "classification_loss", "loss_from_output", "output_index", "supervised_loss"]

#: ``loss_fn(outputs, batch) -> loss`` or ``-> (loss, aux)``; see the module docstring.
LossFn = Callable[[tuple, Any], Any]


def output_index(model: Model, output: int | str) -> int:
    """The position of ``output`` (a name or an index) among the model's outputs.

    Raises:
        ValueError: the model has no such output.
    """
    names = list(model.output_names)
    if isinstance(output, str):
        if output not in names:
            raise ValueError(f"the model has no output named {output!r}; outputs: {names}")
        return names.index(output)
    index = int(output)
    if not -len(names) <= index < len(names):
        raise ValueError(f"output index {index} is out of range: the model has {len(names)} output(s) {names}")
    return index % len(names)


def _target(batch: Any, target: str) -> Any:
    if not isinstance(batch, Mapping) or target not in batch:
        keys = sorted(batch) if isinstance(batch, Mapping) else type(batch).__name__
        raise KeyError(f"the batch has no {target!r} entry (the loss's target); batch keys: {keys}")
    return batch[target]


def loss_from_output(model: Model, output: int | str) -> LossFn:
    """The loss a model's graph computes itself, read from one of its outputs.

    For graphs exported with their loss: a ``SoftmaxCrossEntropyLoss`` or
    ``NegativeLogLikelihoodLoss`` node (or any arithmetic) whose result is a graph output.
    The labels are then graph inputs, so the batch holds them under their input names. A
    non-scalar output (``reduction="none"``) is averaged.

    Args:
        model: the model.
        output: the loss output's name or index.

    Returns:
        ``loss_fn(outputs, batch) -> loss``.

    Raises:
        ValueError: the model has no such output.

    Example:
        >>> import numpy as np, onnx, onnx.helper as oh, jonnx
        >>> from jonnx.training import loss_from_output
        >>> node = oh.make_node("SoftmaxCrossEntropyLoss", ["scores", "labels"], ["loss"])
        >>> graph = oh.make_graph([node], "g",
        ...     [oh.make_tensor_value_info("scores", onnx.TensorProto.FLOAT, [2, 3]),
        ...      oh.make_tensor_value_info("labels", onnx.TensorProto.INT64, [2])],
        ...     [oh.make_tensor_value_info("loss", onnx.TensorProto.FLOAT, [])])
        >>> model = jonnx.load(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)]))
        >>> loss_fn = loss_from_output(model, "loss")
        >>> batch = {"scores": np.zeros((2, 3), np.float32), "labels": np.array([0, 2])}
        >>> round(float(loss_fn(model.apply({}, **batch), batch)), 4)  # log(3)
        1.0986
    """
    index = output_index(model, output)

    def loss_fn(outputs: tuple, batch: Any) -> jax.Array:
        del batch  # the graph already read the labels from its inputs
        return jnp.mean(outputs[index])

    return loss_fn


def supervised_loss(
    model: Model,
    per_example: Callable[[jax.Array, jax.Array], jax.Array],
    *,
    output: int | str = 0,
    target: str = "label",
) -> LossFn:
    """A loss comparing one model output with a target from the batch, averaged.

    Args:
        model: the model.
        per_example: ``fn(prediction, target) -> losses``, e.g. ``optax.l2_loss`` or
            ``optax.softmax_cross_entropy_with_integer_labels``; the result is averaged.
        output: the output compared (name or index; default the first).
        target: the batch entry holding the targets.

    Returns:
        ``loss_fn(outputs, batch) -> loss``.

    Raises:
        ValueError: the model has no such output.
        KeyError: (when the step runs) the batch has no ``target`` entry.

    Example:
        >>> import numpy as np, optax, onnx, onnx.helper as oh, jonnx
        >>> from jonnx.training import supervised_loss
        >>> graph = oh.make_graph([oh.make_node("Identity", ["x"], ["y"])], "g",
        ...     [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
        ...     [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])])
        >>> model = jonnx.load(oh.make_model(graph))
        >>> loss_fn = supervised_loss(model, optax.l2_loss, target="y_true")
        >>> batch = {"x": np.array([1.0, 3.0], np.float32), "y_true": np.array([0.0, 1.0], np.float32)}
        >>> float(loss_fn(model.apply({}, batch["x"]), batch))  # mean(0.5 * [1, 4])
        1.25
    """
    index = output_index(model, output)

    def loss_fn(outputs: tuple, batch: Any) -> jax.Array:
        return jnp.mean(per_example(outputs[index], _target(batch, target)))

    return loss_fn


def classification_loss(
    model: Model,
    *,
    output: int | str = 0,
    target: str = "label",
    label_smoothing: float = 0.0,
) -> LossFn:
    """Softmax cross-entropy on logits against integer labels, with accuracy as a metric.

    Args:
        model: the model.
        output: the logits output ``[N, classes]`` (name or index; default the first).
        target: the batch entry holding the integer labels ``[N]``.
        label_smoothing: mixes the one-hot targets with the uniform distribution
            (``optax.smooth_labels``); 0 disables it.

    Returns:
        ``loss_fn(outputs, batch) -> (loss, {"accuracy": ...})``.

    Raises:
        ValueError: the model has no such output, or ``label_smoothing`` is outside [0, 1).

    Example:
        >>> import numpy as np, onnx, onnx.helper as oh, jonnx
        >>> from jonnx.training import classification_loss
        >>> graph = oh.make_graph([oh.make_node("Identity", ["x"], ["logits"])], "g",
        ...     [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 2])],
        ...     [oh.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, [2, 2])])
        >>> model = jonnx.load(oh.make_model(graph))
        >>> batch = {"x": np.array([[2.0, 0.0], [0.0, 1.0]], np.float32), "label": np.array([0, 0])}
        >>> loss, aux = classification_loss(model)(model.apply({}, batch["x"]), batch)
        >>> float(aux["accuracy"])
        0.5
    """
    index = output_index(model, output)
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1), not {label_smoothing}")

    def loss_fn(outputs: tuple, batch: Any) -> tuple[jax.Array, dict[str, jax.Array]]:
        logits = outputs[index]
        labels = jnp.asarray(_target(batch, target))
        if label_smoothing:
            onehot = optax.smooth_labels(jax.nn.one_hot(labels, logits.shape[-1], dtype=logits.dtype), label_smoothing)
            losses = optax.softmax_cross_entropy(logits, onehot)
        else:
            losses = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
        accuracy = jnp.mean((jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32))
        return jnp.mean(losses), {"accuracy": accuracy}

    return loss_fn
