"""The training step: :class:`TrainState` and :func:`make_train_step`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec

import jonnx
from jonnx import errors
from jonnx._model import Model
from jonnx.training._losses import LossFn
from jonnx.training._params import ParamSelector, mask_frozen, trainable_mask

__all__ = ["TrainState", "TrainStep", "make_train_step", "model_inputs"]

# optax >= 0.2.5 has optax.tree.norm and deprecates optax.global_norm.
_tree = getattr(optax, "tree", None)
_global_norm = _tree.norm if hasattr(_tree, "norm") else optax.global_norm


class TrainState(NamedTuple):
    """Everything a training step reads and returns: a pytree (a ``NamedTuple``).

    Being a plain pytree it can be passed through ``jax.jit``, saved with any pytree
    checkpointer, or inspected with ``jax.tree.map``; change a field with ``_replace``.

    Attributes:
        step: the number of steps taken, an int32 scalar array.
        params: every trainable initializer by name, float32 master copies (frozen ones
            included: they ride along unchanged, so ``jonnx.save(model, path,
            params=train_state.params)`` writes the whole model).
        state: the running statistics (BatchNormalization mean and variance) by name.
        opt_state: the optimizer's state (nothing for frozen parameters).
    """

    step: jax.Array
    params: dict[str, jax.Array]
    state: dict[str, jax.Array]
    opt_state: optax.OptState


def model_inputs(model: Model, batch: Any) -> dict[str, Any]:
    """The model's inputs taken from a batch dict by their names (the default ``input_fn``).

    Raises:
        TypeError: the batch is not a mapping.
        jonnx.errors.InputError: a model input is missing from the batch.
    """
    if not isinstance(batch, Mapping):
        raise TypeError(
            f"a batch must be a dict holding the model inputs {list(model.input_names)} by name "
            f"(plus labels), not a {type(batch).__name__}; pass input_fn= to read another structure"
        )
    missing = [n for n in model.input_names if n not in batch]
    if missing:
        raise errors.InputError(f"the batch lacks model input(s) {missing}; batch keys: {sorted(batch)}")
    return {n: batch[n] for n in model.input_names}


def _cast_floats(tree: Any, dtype: Any) -> Any:
    def cast(x):
        x = jnp.asarray(x) if not isinstance(x, jax.Array) else x
        return x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x

    return jax.tree.map(cast, tree)


def split_loss(result: Any) -> tuple[jax.Array, dict[str, jax.Array]]:
    if isinstance(result, tuple):
        if len(result) != 2 or not isinstance(result[1], Mapping):
            raise TypeError("a loss function returns a scalar, or (scalar, dict of metrics)")
        loss, aux = result
        if "loss" in aux:
            raise ValueError(
                "a loss function's metrics dict cannot use the name 'loss' (the step reports the loss itself)"
            )
        aux = dict(aux)
    else:
        loss, aux = result, {}
    loss = jnp.asarray(loss)
    if loss.shape != ():
        raise ValueError(f"the loss must be a scalar, but loss_fn returned shape {loss.shape}")
    return loss, aux


class TrainStep:
    """A compiled training step for one model, loss and optimizer; see :func:`make_train_step`.

    Call it as ``step(train_state, batch, key) -> (train_state, metrics)``.

    Attributes:
        model: the model trained.
        optimizer: the optimizer actually applied (``optimizer`` wrapped by
            :func:`mask_frozen` when parameters are frozen); :meth:`init` uses it.
        mask: ``{name: bool}``, which parameters train.
        mixed_precision: whether the forward and backward passes run in bfloat16.
        microbatches: how many parts each batch's gradient is accumulated over (1: whole).
        fn: the pure, un-jitted step function, for your own ``jax.jit``, ``vmap`` or sharding.
    """

    def __init__(
        self,
        model: Model,
        loss_fn: LossFn,
        optimizer: optax.GradientTransformation,
        mask: dict[str, bool],
        *,
        mixed_precision: bool,
        train: bool | None,
        input_fn: Callable[[Any], Any] | None,
        precision: Any,
        donate: bool,
        microbatches: int = 1,
    ):
        self.model = model
        self.loss_fn = loss_fn
        self.optimizer = mask_frozen(optimizer, mask)
        self.mask = mask
        self.mixed_precision = mixed_precision
        self.train = train
        self.input_fn = input_fn
        self.precision = precision
        self.microbatches = microbatches
        self.fn = self._step
        self.donate = donate
        self._jitted = jonnx.jit(self._step, donate_argnums=(0,) if donate else ())
        # On a mesh: the step compiled for the shardings of the train state it was given, so
        # that every output array keeps its input's sharding (see __call__).
        self._sharded: tuple[Any, Any] | None = None

    def __repr__(self) -> str:
        n_frozen = sum(not m for m in self.mask.values())
        return (
            f"TrainStep(params={len(self.mask)} ({n_frozen} frozen), "
            f"mixed_precision={self.mixed_precision}, train={self.train}"
            + (f", microbatches={self.microbatches})" if self.microbatches > 1 else ")")
        )

    def init(
        self,
        params: Mapping[str, jax.Array] | None = None,
        state: Mapping[str, jax.Array] | None = None,
    ) -> TrainState:
        """A fresh :class:`TrainState`: the model's parameters and statistics, step 0.

        Args:
            params: parameters overriding the model's own, by name (default: none).
            state: running statistics overriding the model's own, by name (default: none).

        Returns:
            The train state. Its arrays are copies, so a donating step never invalidates the
            model's own arrays.

        Raises:
            jonnx.errors.InputError: a name that is not a parameter (or statistic) of the model.
        """
        full_params = _merge(self.model.params, params, "trainable initializers")
        full_state = _merge(self.model.state, state, "state values")
        # Master weights and statistics stay in their stored dtype (float32 for exported
        # models) even under mixed precision: only the compute is cast.
        mesh = self.model.mesh
        if mesh is None:
            full_params = jax.tree.map(jnp.array, full_params)
            full_state = jax.tree.map(jnp.array, full_state)
            return TrainState(
                step=jnp.zeros((), jnp.int32),
                params=full_params,
                state=full_state,
                opt_state=self.optimizer.init(full_params),
            )
        # On a mesh every array is placed as the model placed its weights: each parameter's
        # optimizer state (Adam's moments...) like the parameter, the rest replicated.
        shardings, whole = self.model.shardings, NamedSharding(mesh, PartitionSpec())
        full_params = {n: jax.device_put(v, shardings.get(n, whole), may_alias=False) for n, v in full_params.items()}
        full_state = {n: jax.device_put(v, shardings.get(n, whole), may_alias=False) for n, v in full_state.items()}

        def place(path: tuple, leaf: Any) -> Any:
            names = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
            name = names[-1] if names else None
            like = name in full_params and jnp.shape(leaf) == full_params[name].shape
            return jax.device_put(leaf, shardings.get(name, whole) if like else whole)

        opt_state = jax.tree_util.tree_map_with_path(place, self.optimizer.init(full_params))
        return TrainState(
            step=jax.device_put(jnp.zeros((), jnp.int32), whole),
            params=full_params,
            state=full_state,
            opt_state=opt_state,
        )

    def __call__(
        self, train_state: TrainState, batch: Any, key: jax.Array | None = None
    ) -> tuple[TrainState, dict[str, jax.Array]]:
        """One optimization step (jit-compiled; compiled once per batch shape).

        Args:
            train_state: the current :class:`TrainState`.
            batch: a pytree of arrays; by default a dict with the model inputs by name plus
                what the loss reads.
            key: a base PRNG key for Dropout and other random ops. The step folds in
                ``train_state.step``, so passing the same key every step still gives each
                step fresh randomness. Needed when the model has random ops in training.

        Returns:
            ``(new_train_state, metrics)``; ``metrics`` holds ``"loss"``, ``"grad_norm"``
            (the global norm of the trainable gradients) and the loss function's aux metrics,
            as scalar arrays.
        """
        if self.model.mesh is None:
            return self._jitted(train_state, batch, key)
        shardings = jax.tree.map(lambda x: getattr(x, "sharding", None), train_state)
        if self._sharded is None or self._sharded[0] != shardings:
            whole = NamedSharding(self.model.mesh, PartitionSpec())
            step = jonnx.jit(self._step, donate_argnums=(0,) if self.donate else (), out_shardings=(shardings, whole))
            self._sharded = (shardings, step)
        return self._sharded[1](train_state, batch, key)

    def _step(self, ts: TrainState, batch: Any, key: jax.Array | None) -> tuple[TrainState, dict[str, jax.Array]]:
        mask = self.mask
        if key is not None:
            key = jax.random.fold_in(key, ts.step)
        trainable = {n: p for n, p in ts.params.items() if mask[n]}
        frozen = {n: p for n, p in ts.params.items() if not mask[n]}
        if self.microbatches > 1:
            loss, aux, new_state, grads = self._accumulated(trainable, frozen, ts.state, batch, key)
        else:
            loss, aux, new_state, grads = self._gradients(trainable, frozen, ts.state, batch, key)
        # Frozen leaves need a placeholder in the updates tree; set_to_zero never reads it.
        updates, opt_state = self.optimizer.update({**frozen, **grads}, ts.opt_state, ts.params)
        params = {n: optax.apply_updates(p, updates[n]) if mask[n] else p for n, p in ts.params.items()}
        metrics = {"loss": loss, "grad_norm": _global_norm(grads), **aux}
        new_ts = TrainState(step=ts.step + 1, params=params, state=new_state, opt_state=opt_state)
        return new_ts, metrics

    def _gradients(self, trainable: dict, frozen: dict, state: dict, batch: Any, key: jax.Array | None) -> tuple:
        """The loss, its metrics, the new running statistics and the trainable parameters'
        gradients on one batch."""
        model = self.model
        inputs = self.input_fn(batch) if self.input_fn is not None else model_inputs(model, batch)

        def objective(trainable):
            params = {**frozen, **trainable}
            feed = inputs
            if self.mixed_precision:
                params, feed = _cast_floats(params, jnp.bfloat16), _cast_floats(inputs, jnp.bfloat16)
            kwargs = dict(state=state, train=self.train, key=key, precision=self.precision)
            if isinstance(feed, Mapping):
                outputs, new_state = model.apply_with_state(params, **kwargs, **feed)
            else:
                outputs, new_state = model.apply_with_state(params, *feed, **kwargs)
            if self.mixed_precision:
                outputs = _cast_floats(outputs, jnp.float32)
            loss, aux = split_loss(self.loss_fn(outputs, batch))
            return loss.astype(jnp.float32), (aux, new_state)

        (loss, (aux, new_state)), grads = jax.value_and_grad(objective, has_aux=True)(trainable)
        return loss, aux, new_state, grads

    def _accumulated(self, trainable: dict, frozen: dict, state: dict, batch: Any, key: jax.Array | None) -> tuple:
        """:meth:`_gradients` over ``microbatches`` parts of the batch, one after another
        (``lax.scan``): the loss, metrics and gradients are the parts' means, the running
        statistics are updated by each part in turn, and each part draws its own random bits.
        Part ``j`` holds rows ``j, j + k, j + 2k...``: on a mesh each device's rows then
        feed every part alike."""
        parts = _split_rows(batch, self.microbatches)

        def body(carry, xs):
            total, state = carry
            part, index = xs
            part_key = None if key is None else jax.random.fold_in(key, index)
            loss, aux, new_state, grads = self._gradients(trainable, frozen, state, part, part_key)
            return (jax.tree.map(jnp.add, total, grads), new_state), (loss, aux)

        # Gradients summed in the carry (shaped as the parameters); the scalar loss and
        # metrics stacked, a few numbers a part.
        zeros = jax.tree.map(jnp.zeros_like, trainable)
        indices = jnp.arange(self.microbatches)
        (total, new_state), (losses, aux) = jax.lax.scan(body, (zeros, state), (parts, indices))
        grads = jax.tree.map(lambda g: g / self.microbatches, total)
        # Metrics are averaged as floats (a count of correct rows, say).
        aux = jax.tree.map(lambda x: jnp.mean(jnp.asarray(x, jnp.float32), axis=0), aux)
        return jnp.mean(losses), aux, new_state, grads


def _split_rows(batch: Any, parts: int) -> Any:
    """Each array of ``batch`` as ``(parts, rows / parts, ...)``, part ``j`` holding rows
    ``j, j + parts...``; every array must hold the same number of rows, which ``parts``
    divides."""
    leaves, tree = jax.tree.flatten(batch)
    rows = {jnp.shape(x)[0] if jnp.ndim(x) else None for x in leaves}
    if len(rows) != 1 or None in rows:
        shapes = [jnp.shape(x) for x in leaves]
        raise ValueError(
            f"microbatches={parts} splits every array of the batch along its first axis, so they must all "
            f"hold the same number of rows; the batch's arrays have shapes {shapes[:10]}"
        )
    (n,) = rows
    if n % parts:
        raise ValueError(f"microbatches={parts} must divide the batch's {n} rows")
    return jax.tree.unflatten(
        tree, [jnp.swapaxes(jnp.reshape(x, (n // parts, parts, *jnp.shape(x)[1:])), 0, 1) for x in leaves]
    )


def _merge(own: dict[str, jax.Array], given: Mapping[str, jax.Array] | None, what: str) -> dict[str, jax.Array]:
    given = dict(given or {})
    unknown = set(given) - set(own)
    if unknown:
        raise errors.InputError(f"{sorted(unknown)[:10]} are not {what} of the model")
    return {**own, **given}


def make_train_step(
    model: Model,
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation,
    *,
    trainable: ParamSelector | None = None,
    frozen: ParamSelector | None = None,
    mixed_precision: bool = False,
    train: bool | None = True,
    input_fn: Callable[[Any], Any] | None = None,
    precision: Any = None,
    donate: bool = False,
    microbatches: int = 1,
) -> TrainStep:
    """Build a jit-compiled training step for ``model``.

    The step is ``step(train_state, batch, key) -> (train_state, metrics)``: it runs the model
    in training mode (``Model.apply(..., train=True)``: BatchNormalization on batch statistics
    with its running statistics updated by ONNX's momentum rule, Dropout active with keys
    folded per node), differentiates ``loss_fn`` with respect to the trainable parameters
    only, and applies ``optimizer``.

    It returns a :class:`TrainStep` rather than a bare function because the optimizer it
    applies is ``optimizer`` wrapped for the frozen parameters: ``step.init()`` builds the
    matching :class:`TrainState`, so the two can never disagree.

    Mixed precision (``mixed_precision=True``): inside the step, the parameters and the
    floating-point inputs are cast to bfloat16, so the forward and backward passes compute in
    bfloat16; the outputs are cast back to float32 before ``loss_fn``, and the master weights,
    gradients, optimizer state and running statistics stay float32 (bfloat16 has float32's
    range, so no loss scaling is needed). It halves activation memory and speeds up
    accelerators with bfloat16 units, but on CPUs without them it is usually *slower* (in
    our measurements on this project's CPU it was) and it perturbs results at the 1e-2
    level, so it is off by default.

    Args:
        model: the model to train.
        loss_fn: ``loss_fn(outputs, batch) -> loss`` or ``-> (loss, aux)``, where ``outputs``
            is the tuple ``Model.apply`` returns (``Model.output_names`` order), ``batch`` is
            the batch given to the step, ``loss`` a scalar and ``aux`` a dict of scalar
            metrics reported next to the loss. See :func:`classification_loss`,
            :func:`supervised_loss`, and :func:`loss_from_output` for a loss the graph
            computes itself.
        optimizer: an optax gradient transformation, e.g. ``optax.adamw(1e-3)``.
        trainable: the parameters that train (default: all): names, glob patterns, compiled
            regexes or callables; see :func:`trainable_mask`.
        frozen: parameters kept fixed, in the same forms. Frozen parameters get no gradient
            computed, are returned bit-for-bit unchanged, and hold no optimizer state
            (``optax.multi_transform`` with ``optax.set_to_zero``).
        mixed_precision: compute in bfloat16 with float32 master weights (see above).
        train: the model's mode during the step: ``True`` (default) runs the whole model in
            training mode; ``None`` runs each node as the graph says; ``False`` runs it in
            inference mode (frozen BatchNormalization statistics, no Dropout), e.g. to
            fine-tune a head on top of fixed features.
        input_fn: ``input_fn(batch)`` -> the model inputs, as a dict by name or a tuple in
            ``Model.input_names`` order. Default: ``batch[name]`` for each model input.
        precision: ``jax.lax.Precision`` for MatMul/Gemm/Conv, as in ``Model.apply``.
        donate: donate the input train state's buffers to the step (saves memory on
            accelerators; the train state passed in must not be used afterwards).
        microbatches: accumulate each step's gradient over this many equal parts of the
            batch, run one after another inside the step: the loss, its metrics and the
            gradients are the parts' means (the whole batch's, for a loss that is a mean over
            rows), and the activations held at once are one part's, so a batch too large
            for memory still trains. On the CPU a large batch may also run faster, since
            its temporaries are reused from part to part instead of mapped afresh each step
            (docs/performance.md, "Large batches"). Every array of the batch must hold the
            rows along its first axis, a number ``microbatches`` divides. BatchNormalization
            in training mode normalizes each part by its own statistics and updates the
            running statistics once per part, as accumulating gradients over several calls
            would.

    Returns:
        A :class:`TrainStep`: call it as ``step(train_state, batch, key)``; make the first
        train state with ``step.init()``.

    Raises:
        ValueError: a ``trainable``/``frozen`` selector matches no parameter, or nothing is
            left to train.
        TypeError: ``optimizer`` is not an optax gradient transformation.

    Example:
        >>> import jax, numpy as np, onnx, onnx.helper as oh, optax, jonnx
        >>> from jonnx.training import make_train_step, supervised_loss
        >>> w = onnx.numpy_helper.from_array(np.zeros((2, 1), np.float32), "w")
        >>> graph = oh.make_graph([oh.make_node("MatMul", ["x", "w"], ["y"])], "g",
        ...     [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 2])],
        ...     [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 1])], [w])
        >>> model = jonnx.load(oh.make_model(graph))
        >>> step = make_train_step(model, supervised_loss(model, optax.l2_loss, target="t"), optax.sgd(0.5))
        >>> ts = step.init()
        >>> batch = {"x": np.eye(2, dtype=np.float32), "t": np.array([[1.0], [2.0]], np.float32)}
        >>> for _ in range(50):
        ...     ts, metrics = step(ts, batch, jax.random.key(0))
        >>> np.round(np.asarray(ts.params["w"]).ravel(), 3).tolist()
        [1.0, 2.0]
    """
    if not isinstance(optimizer, optax.GradientTransformation):
        raise TypeError(f"optimizer must be an optax.GradientTransformation, not {type(optimizer).__name__}")
    if not callable(loss_fn):
        raise TypeError(f"loss_fn must be callable, not {type(loss_fn).__name__}")
    if not isinstance(microbatches, int) or isinstance(microbatches, bool) or microbatches < 1:
        raise ValueError(f"microbatches must be a positive int, not {microbatches!r}")
    mask = trainable_mask(model.params, trainable=trainable, frozen=frozen)
    return TrainStep(
        model,
        loss_fn,
        optimizer,
        mask,
        mixed_precision=mixed_precision,
        train=train,
        input_fn=input_fn,
        precision=precision,
        donate=donate,
        microbatches=microbatches,
    )
