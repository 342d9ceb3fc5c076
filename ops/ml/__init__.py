"""The ``ai.onnx.ml`` domain: classic machine-learning ops (scikit-learn via skl2onnx).

One module per family: ``linear`` (linear models, SVMs), ``trees`` (tree ensembles, ZipMap),
``encoders`` (scalers, encoders, label and category maps, dict ops); ``_common`` holds the
helpers they share (string labels, post transforms).

Numeric ops (linear models, SVMs, tree ensembles, scalers, ...) are written with jnp/lax and run
on traced inputs under ``jit``: a tree ensemble walks every tree of the forest at once, one
level per step, for a static number of steps (the forest's depth), so no Python runs per sample.

Strings and maps have no JAX type. String tensors are numpy object arrays of ``str`` and maps
are Python dicts, both known at trace time: ops that read them (LabelEncoder with string keys,
CategoryMapper, DictVectorizer, CastMap) need concrete inputs. Classifiers with string labels
compute the class index with jnp and turn it into strings only when the input is concrete;
integer labels work traced. ZipMap returns a list of dicts of scalars (a pytree, so it also
works traced).

Post transforms follow onnxruntime and the onnx reference: ``PROBIT`` uses their closed-form
approximation of ``erfinv`` (Winitzki, a = 0.147) and, as onnxruntime, gives -inf/+inf at scores
0 and 1; ``SOFTMAX_ZERO`` leaves exact zeros at zero.
"""

# Each module registers its family on import.
from jonnx.ops.ml import encoders, linear, trees  # noqa: F401
