"""Training with jonnx models: optax steps, frozen parameters, loops and inference helpers.

Installed as ``jonnx.training``. Everything is functional, in the JAX/optax style: a
:class:`TrainState` pytree holds the parameters, the running statistics and the optimizer
state; :func:`make_train_step` compiles one step; :func:`fit` loops over batches.

>>> import jax, optax, jonnx
>>> from jonnx import training
>>> model = jonnx.load("model.onnx")                                   # doctest: +SKIP
>>> step = training.make_train_step(
...     model, training.classification_loss(model), optax.adam(1e-3),
...     frozen="backbone.*")                                           # doctest: +SKIP
>>> ts, history = training.fit(step, step.init(), batches, epochs=5,
...                            key=jax.random.key(0))                  # doctest: +SKIP
>>> (logits,) = training.predict(model, ts, images)                    # doctest: +SKIP
>>> jonnx.save(model, "tuned.onnx", params=ts.params, state=ts.state)  # doctest: +SKIP
"""

from jonnx.training._inference import evaluate as evaluate, predict as predict
from jonnx.training._loop import History as History, fit as fit
from jonnx.training._losses import (
    LossFn as LossFn,
    classification_loss as classification_loss,
    loss_from_output as loss_from_output,
    output_index as output_index,
    supervised_loss as supervised_loss,
)
from jonnx.training._params import (
    ParamSelector as ParamSelector,
    mask_frozen as mask_frozen,
    trainable_mask as trainable_mask,
)
from jonnx.training._step import (
    TrainState as TrainState,
    TrainStep as TrainStep,
    make_train_step as make_train_step,
    model_inputs as model_inputs,
)

__all__ = [
    "History",
    "LossFn",
    "ParamSelector",
    "TrainState",
    "TrainStep",
    "classification_loss",
    "evaluate",
    "fit",
    "loss_from_output",
    "make_train_step",
    "mask_frozen",
    "model_inputs",
    "output_index",
    "predict",
    "supervised_loss",
    "trainable_mask",
]
