"""Inference-mode helpers: :func:`predict` and :func:`evaluate` (``train=False``, jit-compiled)."""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import jonnx
from jonnx._jit import DotChoosingJit, signature
from jonnx._model import Model
from jonnx.training._step import TrainState, model_inputs, split_loss

__all__ = ["evaluate", "predict"]

# Compiled inference functions per model, keyed by what they close over. Weak on the model, so
# a model's compiled functions go away with it.
_COMPILED: weakref.WeakKeyDictionary[Model, dict[Any, Callable]] = weakref.WeakKeyDictionary()


def _compiled(model: Model, key: tuple, make: Callable[[], Callable], signature_of: Callable | None = None) -> Callable:
    """``make()``, a function of (params, state, inputs), compiled for ``model`` under ``key``,
    its dots' library chosen per input shapes (large batches: XLA's own, see jonnx/_jit.py);
    ``signature_of`` for a function of other arguments."""
    per_model = _COMPILED.setdefault(model, {})
    if key not in per_model:
        per_model[key] = DotChoosingJit(make(), signature_of or (lambda params, state, inputs: signature(inputs)))
    return per_model[key]


def _variables(model: Model, train_state: TrainState | Mapping[str, Any] | None) -> tuple[dict, dict]:
    if train_state is None:
        return model.params, model.state
    if isinstance(train_state, TrainState):
        return dict(train_state.params), dict(train_state.state)
    if isinstance(train_state, Mapping):
        return dict(train_state), model.state
    raise TypeError(f"expected a TrainState, a params dict or None, not {type(train_state).__name__}")


def _inference_call(model: Model, train_state: Any) -> Callable[[Mapping[str, Any]], tuple]:
    """The model's own call in inference mode with these variables, on its inputs by name (all
    of them, in order: :meth:`Model.bind`'s). That is the segments ``Model(*inputs)`` compiles,
    with its layout pass and kept weight relayouts, large batches in chunks, host nodes;
    ``apply`` under one jit measured 1.15-3.2x slower on CNNs (docs/performance.md, "predict
    and evaluate"), and only serves a ``precision``."""
    variables = {}
    if train_state is not None:
        variables["params"], variables["state"] = _variables(model, train_state)
    # By position: an input may be named like one of the call's keywords (key, params, state).
    return lambda values: model(*values.values(), train=False, **variables)


def _apply_eval(model: Model, precision: Any) -> Callable:
    def run(params, state, inputs):
        return model.apply(params, state=state, train=False, precision=precision, **inputs)

    return run


def predict(
    model: Model,
    train_state: TrainState | Mapping[str, Any] | None,
    *inputs: Any,
    batch_size: int | None = None,
    precision: Any = None,
    **named_inputs: Any,
) -> tuple[jax.Array, ...]:
    """Run the model in inference mode, jit-compiled, with trained parameters.

    Inference mode everywhere (``train=False``): BatchNormalization uses the running
    statistics, Dropout is the identity, whatever mode the graph was exported in.

    This is the model's own call with these variables, ``Model(*inputs, params=, state=,
    train=False)``: its segments, layout pass, large batches in chunks, nodes on the host.
    With ``precision``, ``Model.apply(..., train=False)`` compiled under one jit.

    Args:
        model: the model.
        train_state: a :class:`TrainState` (its params and running statistics), a params
            dict, or ``None`` for the model's own values.
        *inputs: the model inputs in ``Model.input_names`` order.
        batch_size: run in chunks of this many examples along axis 0 of every input and
            concatenate the outputs (bounds memory on large sets). The last chunk is padded to
            the full size, so one compilation serves every chunk. Default: all at once.
        precision: ``jax.lax.Precision`` for MatMul/Gemm/Conv.
        **named_inputs: inputs by name instead.

    Returns:
        The outputs, a tuple in ``Model.output_names`` order.

    Raises:
        jonnx.errors.InputError: inputs missing, unknown or duplicated.
        ValueError: ``batch_size`` is given but the inputs disagree on their leading size, or
            an output has no batch axis.

    Example:
        >>> import numpy as np, onnx, onnx.helper as oh, jonnx
        >>> from jonnx.training import predict
        >>> graph = oh.make_graph([oh.make_node("Relu", ["x"], ["y"])], "g",
        ...     [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N"])],
        ...     [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N"])])
        >>> model = jonnx.load(oh.make_model(graph))
        >>> (y,) = predict(model, None, np.array([-1.0, 2.0, -3.0], np.float32), batch_size=2)
        >>> y.tolist()
        [0.0, 2.0, 0.0]
    """
    values = model.bind(*inputs, **named_inputs)
    if precision is None:
        run = _inference_call(model, train_state)
    else:
        params, state = _variables(model, train_state)
        static = {n: values.pop(n) for n in model.static_input_names if n in values}
        if static:
            # Shape-driving inputs are closed over as constants: one compilation per call.
            def apply(params, state, dynamic):
                return model.apply(params, state=state, train=False, precision=precision, **dynamic, **static)

            fn = jonnx.jit(apply)
        else:
            fn = _compiled(model, ("predict", precision), lambda: _apply_eval(model, precision))

        def run(values: Mapping[str, Any]) -> tuple:
            return fn(params, state, values)

    return tuple(run(values)) if batch_size is None else _batched(run, values, batch_size)


def _batched(run: Callable[[dict], tuple], values: dict, batch_size: int) -> tuple:
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, not {batch_size}")
    sizes = {n: np.shape(v)[0] for n, v in values.items() if np.ndim(v) > 0}
    if len(set(sizes.values())) != 1:
        raise ValueError(f"batch_size needs inputs with one shared leading size; got {sizes}")
    n = next(iter(sizes.values()))
    chunks = []
    for start in range(0, n, batch_size):
        # Repeat the last example to fill the final chunk, so it reuses the compiled shape.
        index = np.minimum(np.arange(start, start + batch_size), n - 1)
        chunk = {k: (jnp.take(jnp.asarray(v), index, axis=0) if np.ndim(v) > 0 else v) for k, v in values.items()}
        outputs = run(chunk)
        for i, o in enumerate(outputs):
            if np.ndim(o) == 0 or np.shape(o)[0] != batch_size:
                raise ValueError(
                    f"output {i} has shape {np.shape(o)}, without the batch axis batch_size splits; "
                    "call predict without batch_size"
                )
        chunks.append([o[: min(batch_size, n - start)] for o in outputs])
    return tuple(jnp.concatenate(parts, axis=0) for parts in zip(*chunks))


def evaluate(
    model: Model,
    train_state: TrainState | Mapping[str, Any] | None,
    batches: Iterable[Any],
    metric_fn: Callable[[tuple, Any], Any],
    *,
    input_fn: Callable[[Any], Any] | None = None,
    precision: Any = None,
) -> dict[str, float]:
    """Average metrics over batches, running the model in inference mode (jit-compiled).

    The model runs as in :func:`predict` (its own call in inference mode), ``metric_fn``
    under its own jit.

    Args:
        model: the model.
        train_state: a :class:`TrainState`, a params dict, or ``None`` for the model's own.
        batches: an iterable of batches (dicts holding the model inputs by name, plus what
            ``metric_fn`` reads).
        metric_fn: ``metric_fn(outputs, batch)`` returning a scalar (reported as ``"loss"``),
            ``(loss, aux_dict)`` (a loss function, as for :func:`make_train_step`), or a dict
            of scalars. Each metric must be a mean over the batch's examples: batches are
            weighted by their size (the leading size of the first model input).
        input_fn: ``input_fn(batch)`` -> the model inputs (dict by name or tuple in order).
        precision: ``jax.lax.Precision`` for MatMul/Gemm/Conv.

    Returns:
        ``{metric: example-weighted mean over all batches}``, as Python floats.

    Raises:
        ValueError: ``batches`` is empty.

    Example:
        >>> import numpy as np, onnx, onnx.helper as oh, jonnx
        >>> from jonnx.training import classification_loss, evaluate
        >>> graph = oh.make_graph([oh.make_node("Identity", ["x"], ["logits"])], "g",
        ...     [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 2])],
        ...     [oh.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, ["N", 2])])
        >>> model = jonnx.load(oh.make_model(graph))
        >>> batches = [{"x": np.array([[1.0, 0.0]], np.float32), "label": np.array([0])},
        ...            {"x": np.array([[1.0, 0.0], [1.0, 0.0]], np.float32), "label": np.array([1, 1])}]
        >>> round(evaluate(model, None, batches, classification_loss(model))["accuracy"], 4)
        0.3333
    """

    def make():
        def run(params, state, batch):
            inputs = input_fn(batch) if input_fn is not None else model_inputs(model, batch)
            kwargs = dict(state=state, train=False, precision=precision)
            if isinstance(inputs, Mapping):
                outputs = model.apply(params, **kwargs, **inputs)
            else:
                outputs = model.apply(params, *inputs, **kwargs)
            return _metrics(metric_fn, outputs, batch)

        return run

    if precision is None:
        call = _inference_call(model, train_state)
        metrics_of = _compiled(
            model,
            ("metrics", metric_fn),
            lambda: functools.partial(_metrics, metric_fn),
            lambda outputs, batch: signature((outputs, batch)),
        )

        def batch_metrics(batch: Any, inputs: Any) -> dict:
            values = model.bind(**inputs) if isinstance(inputs, Mapping) else model.bind(*inputs)
            return metrics_of(call(values), batch)

    else:
        params, state = _variables(model, train_state)
        fn = _compiled(model, ("evaluate", metric_fn, input_fn, precision), make)

        def batch_metrics(batch: Any, inputs: Any) -> dict:
            return fn(params, state, batch)

    totals: dict[str, Any] = {}
    count = 0
    for batch in batches:
        inputs = input_fn(batch) if input_fn is not None else model_inputs(model, batch)
        first = next(iter(inputs.values())) if isinstance(inputs, Mapping) else inputs[0]
        n = int(np.shape(first)[0]) if np.ndim(first) else 1
        for k, v in batch_metrics(batch, inputs).items():
            totals[k] = totals.get(k, 0.0) + v * n
        count += n
    if count == 0:
        raise ValueError("evaluate got no batches")
    return {k: float(v) / count for k, v in jax.device_get(totals).items()}


def _metrics(metric_fn: Callable[[tuple, Any], Any], outputs: tuple, batch: Any) -> dict[str, jax.Array]:
    """``metric_fn``'s result as ``{name: scalar}`` (a bare loss is ``"loss"``)."""
    result = metric_fn(outputs, batch)
    if isinstance(result, Mapping):
        return {k: jnp.asarray(v) for k, v in result.items()}
    loss, aux = split_loss(result)
    return {"loss": loss, **aux}
