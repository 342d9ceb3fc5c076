"""ai.onnx.ml feature encoders and scalers, label and category maps, and map ops (dicts)."""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np

from jonnx._registry import Attrs, Inputs, OpContext, Outputs, register
from jonnx._values import is_concrete
from jonnx.ops._util import as_strings, canonical, from_attributes
from jonnx.ops.ml._common import ML, as_2d, float_features, is_string_tensor, need_concrete

# -- simple numeric ops ---------------------------------------------------------------------------


@register("ArrayFeatureExtractor", since=1, domain=ML)
def array_feature_extractor(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX-ML ``ArrayFeatureExtractor``-1: select entries of the last axis.

    As onnxruntime does, a 1-D ``X`` gives a ``[1, len(Y)]`` output. Out-of-range indices are
    an error when ``Y`` is concrete; traced, they are clamped (JAX gather semantics).
    """
    x, y = inputs
    count = int(np.prod(np.shape(y), dtype=np.int64))
    last = np.shape(x)[-1] if np.ndim(x) else 1
    if is_concrete(y):
        idx = np.asarray(y).reshape(-1)
        if np.any((idx < 0) | (idx >= last)):
            raise ctx.error(f"indices {idx.tolist()} out of range for a last axis of size {last}")
    shape = (1, count) if np.ndim(x) <= 1 else tuple(np.shape(x)[:-1]) + (count,)
    if is_string_tensor(x):
        need_concrete(y, ctx, "ArrayFeatureExtractor on strings")
        return (np.take(np.asarray(x), np.asarray(y).reshape(-1), axis=-1).reshape(shape),)
    idx = jnp.reshape(jnp.asarray(y), (-1,))
    return (jnp.reshape(jnp.take(x, idx, axis=-1, mode="clip"), shape),)


@register("Binarizer", since=1, domain=ML)
def binarizer(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX-ML ``Binarizer``-1: 1 where ``X > threshold``, else 0, in X's dtype."""
    (x,) = inputs
    x = jnp.asarray(x)
    return (jnp.where(x > jnp.asarray(attrs["threshold"], x.dtype), 1, 0).astype(x.dtype),)


@register("Scaler", since=1, domain=ML)
def scaler(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX-ML ``Scaler``-1: ``(X - offset) * scale`` per feature, as float."""
    (x,) = inputs
    x = float_features(x)
    offset = jnp.asarray(np.asarray(attrs["offset"] or (0.0,), np.float32), x.dtype)
    scale = jnp.asarray(np.asarray(attrs["scale"] or (1.0,), np.float32), x.dtype)
    for name, v in (("offset", offset), ("scale", scale)):
        if v.size not in (1, jnp.shape(x)[-1] if jnp.ndim(x) else 1):
            raise ctx.error(f"{name} has {v.size} values for {jnp.shape(x)[-1]} features")
    return (((x - offset) * scale).astype(np.float32),)


@register("Normalizer", since=1, domain=ML)
def normalizer(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX-ML ``Normalizer``-1: rows divided by their MAX, L1 or L2 norm (at least 1e-30).

    MAX is the max norm, the largest magnitude, as in the onnx reference and scikit-learn
    (whose ``Normalizer(norm="max")`` skl2onnx writes as MAX). onnxruntime divides by the
    largest value instead, reading the specification's ``X / max(X)`` literally as
    scikit-learn did before 0.23: rows whose largest magnitude is negative differ.
    """
    x = as_2d(float_features(inputs[0]), ctx)
    norm = attrs["norm"]
    if norm == "MAX":
        div = jnp.max(jnp.abs(x), axis=1, keepdims=True)
    elif norm == "L1":
        div = jnp.sum(jnp.abs(x), axis=1, keepdims=True)
    elif norm == "L2":
        sq = jnp.sum(x * x, axis=1, keepdims=True)
        # Double where: sqrt's gradient at an all-zero row would be inf * 0 = nan.
        div = jnp.where(sq > 0, jnp.sqrt(jnp.where(sq > 0, sq, 1.0)), 0.0)
    else:
        raise ctx.error(f"norm must be MAX, L1 or L2, got {norm!r}")
    out = x / jnp.maximum(div, 1e-30)
    return (jnp.reshape(out, jnp.shape(inputs[0])).astype(np.float32),)


@register("Imputer", since=1, domain=ML)
def imputer(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX-ML ``Imputer``-1: replace ``replaced_value_*`` (NaN included) by the imputed values."""
    (x,) = inputs
    x = jnp.asarray(x)
    floats, ints = attrs["imputed_value_floats"], attrs["imputed_value_int64s"]
    if floats:
        values, replaced = floats, attrs["replaced_value_float"]
    elif ints:
        values, replaced = ints, attrs["replaced_value_int64"]
    else:
        raise ctx.error("one of imputed_value_floats or imputed_value_int64s must be set")
    features = jnp.shape(x)[-1] if jnp.ndim(x) else 1
    if len(values) not in (1, features):
        raise ctx.error(f"{len(values)} imputed values for {features} features (need 1 or {features})")
    values = jnp.asarray(np.asarray(values), x.dtype)
    if jnp.issubdtype(x.dtype, jnp.floating) and math.isnan(replaced):
        hit = jnp.isnan(x)
    else:
        hit = x == jnp.asarray(replaced, x.dtype)
    return (jnp.where(hit, values, x),)


@register("FeatureVectorizer", since=1, domain=ML)
def feature_vectorizer(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX-ML ``FeatureVectorizer``-1: concatenate inputs' features, cut or zero-padded to
    ``inputdimensions``, as float32. A 1-D input is one row (``[1, C]``), as the specification
    says and onnxruntime does (the onnx reference reads it as a column).
    """
    dims = attrs["inputdimensions"]
    if dims is None or len(dims) != len(inputs):
        raise ctx.error(f"inputdimensions {dims} must give one size per input ({len(inputs)})")
    parts = []
    for x, d in zip(inputs, dims):
        x = jnp.asarray(x).astype(np.float32)
        if x.ndim == 1:
            x = x[None, :]
        if x.ndim != 2:
            raise ctx.error(f"every input must have rank 1 or 2, got shape {x.shape}")
        x = x[:, :d] if d <= x.shape[1] else jnp.pad(x, ((0, 0), (0, d - x.shape[1])))
        parts.append(x)
    rows = {x.shape[0] for x in parts}
    if len(rows) > 1:
        raise ctx.error(f"the inputs have different numbers of rows {sorted(rows)}")
    return (jnp.concatenate(parts, axis=1),)


@register(
    "OneHotEncoder",
    since=1,
    domain=ML,
    static_inputs=lambda attrs: (0,) if attrs["cats_strings"] and not attrs["cats_int64s"] else (),
    host=lambda attrs: bool(attrs["cats_strings"] and not attrs["cats_int64s"]),
)
def one_hot_encoder(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX-ML ``OneHotEncoder``-1: ``X.shape + [categories]`` of 0/1 floats.

    With ``zeros=0`` a value outside the categories is an error; that check needs a concrete
    input (traced, such rows are all zeros).
    """
    (x,) = inputs
    ints, strings = attrs["cats_int64s"], attrs["cats_strings"]
    if ints:
        if is_string_tensor(x):
            raise ctx.error("the node has cats_int64s, so X must be numeric, not strings")
        codes = jnp.asarray(x)
        if not jnp.issubdtype(codes.dtype, jnp.integer):
            codes = codes.astype(canonical(np.int64))
        cats = jnp.asarray(np.asarray(ints, np.int64), codes.dtype)
        out = (codes[..., None] == cats).astype(np.float32)
    elif strings:
        if not is_string_tensor(x):
            raise ctx.error("the node has cats_strings, so X must be a string tensor")
        table = from_attributes(attrs, "categories", lambda: {s: i for i, s in reversed(list(enumerate(strings)))})
        xs = as_strings(x)
        found = map(table.get, xs.reshape(-1).tolist(), itertools.repeat(-1))
        idx = np.fromiter(found, np.int64, count=xs.size)
        # One-hot rows by scattering ones (an unknown string, index -1, leaves its row zero).
        out = np.zeros((xs.size, len(strings) + 1), np.float32)
        out[np.arange(xs.size), idx] = 1
        out = out[:, :-1].reshape(*xs.shape, len(strings))
    else:
        raise ctx.error("one of cats_int64s or cats_strings must be set")
    if not attrs["zeros"] and is_concrete(x) and np.any(np.asarray(out).sum(-1) == 0):
        raise ctx.error("zeros=0 and an input value is not among the categories")
    return (out,)


# -- label and category maps ----------------------------------------------------------------------

_DEFAULTS = {"int": -1, "float": -0.0, "string": "_Unused"}


def _kind(dtype) -> str:
    dtype = np.dtype(dtype)
    return "string" if dtype.kind in "OUS" else "float" if dtype.kind == "f" else "int"


def _map_values(x, attrs: Attrs, spec, ctx: OpContext):
    """Look every element of ``x`` up in the node's map (the last repeated key wins; NaN matches
    NaN). ``spec(strings)`` gives it from ``attrs`` for a string input or not: ``(keys, values,
    default, out_dtype)``, as :func:`_map_spec` checks them.

    Built once per node and input dtype (:func:`from_attributes`): a host op runs on every call.
    Numeric keys are searched sorted (``searchsorted``): in jnp, so a traced input works, or in
    numpy where the values are strings (a host op then). String keys need a concrete input and
    a dict.
    """
    strings = is_string_tensor(x)
    keys, values, default, out_dtype = from_attributes(attrs, "map", lambda: spec(strings), strings)
    string_keys = _kind(keys.dtype) == "string"
    if strings != string_keys:
        raise ctx.error(
            f"input of dtype {np.asarray(x).dtype if is_concrete(x) else x.dtype} "
            f"does not match keys of type {_kind(keys.dtype)}"
        )
    if string_keys:
        need_concrete(x, ctx, "a lookup with string keys")
    elif out_dtype == object:
        need_concrete(x, ctx, "a lookup with string values")
    x_dtype = None if string_keys else np.dtype(x.dtype)
    lookup = from_attributes(attrs, "lookup", lambda: _Lookup(keys, values, default, out_dtype, x_dtype), x_dtype)
    return lookup(x)


def _map_spec(keys, values, default, out_dtype, ctx):
    keys, values = np.asarray(keys).reshape(-1), np.asarray(values).reshape(-1)
    if keys.size != values.size:
        raise ctx.error(f"{keys.size} keys but {values.size} values")
    return keys, values, default, out_dtype


class _Lookup:
    """A key -> value map ready to apply to inputs of one dtype (None: strings): a dict for
    string keys; for numbers the keys sorted for ``searchsorted``, NaN keys apart."""

    def __init__(self, keys, values, default, out_dtype, x_dtype):
        self.out_dtype, self.default = out_dtype, default
        if x_dtype is None:
            self.table = dict(zip(as_strings(keys).tolist(), values.tolist()))
            return
        self.host = out_dtype == object  # numbers to strings: the same search in numpy
        values = as_strings(values) if self.host else values.astype(out_dtype)
        keys = keys.astype(x_dtype)
        nan_keys = np.isnan(keys) if keys.dtype.kind == "f" else np.zeros(keys.size, bool)
        table = dict(zip(keys[~nan_keys].tolist(), values[~nan_keys].tolist()))
        sorted_keys = np.asarray(list(table), keys.dtype)
        order = np.argsort(sorted_keys, kind="stable")
        self.sorted_keys = sorted_keys[order]
        self.sorted_values = np.asarray(list(table.values()), values.dtype)[order]
        self.nan_value = values[nan_keys][-1] if nan_keys.any() else None
        self.table = None

    def __call__(self, x):
        if self.table is not None:
            found = list(map(self.table.get, as_strings(x).reshape(-1).tolist(), itertools.repeat(self.default)))
            out = as_strings(found) if self.out_dtype == object else np.asarray(found, self.out_dtype)
            return out.reshape(np.shape(x))
        xp = np if self.host else jnp
        x = xp.asarray(x)
        default = self.default if self.host else xp.asarray(self.default, self.out_dtype)
        keys = self.sorted_keys
        if keys.size:
            pos = xp.minimum(xp.searchsorted(xp.asarray(keys), x), keys.size - 1)  # (numpy's clip: 8 us)
            out = xp.where(xp.asarray(keys)[pos] == x, xp.asarray(self.sorted_values)[pos], default)
        else:
            out = xp.full(x.shape, default, self.out_dtype)
        if self.nan_value is not None:
            out = xp.where(xp.isnan(x), self.nan_value, out)
        return out if self.host else out.astype(self.out_dtype)


def _out_dtype(kind: str):
    return object if kind == "string" else canonical(np.int64) if kind == "int" else np.dtype(np.float32)


def _label_encoder_static(attrs):
    strings = attrs.get("classes_strings") is not None  # opset 1 always maps strings
    for name in ("keys_strings", "values_strings"):
        strings |= bool(attrs.get(name))
    for name in ("keys_tensor", "values_tensor"):
        t = attrs.get(name)
        strings |= t is not None and np.asarray(t).dtype.kind in "OUS"
    return (0,) if strings else ()


@register("LabelEncoder", since=1, domain=ML, static_inputs=_label_encoder_static, host=_label_encoder_static)
def label_encoder_1(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX-ML ``LabelEncoder``-1: strings -> their index in ``classes_strings`` (else
    ``default_int64``), or integers -> ``classes_strings[i]`` (else ``default_string``).
    """

    def spec(strings: bool):
        classes = np.asarray(attrs["classes_strings"] or (), object)
        index = np.arange(classes.size)
        if strings:
            return _map_spec(classes, index, attrs["default_int64"], canonical(np.int64), ctx)
        return _map_spec(index, classes, attrs["default_string"], object, ctx)

    return (_map_values(inputs[0], attrs, spec, ctx),)


def _pick(attrs, side: str):
    """The one set ``keys_*``/``values_*`` attribute: ``(array, kind)``."""
    found = []
    for kind, name in (("float", f"{side}_floats"), ("int", f"{side}_int64s"), ("string", f"{side}_strings")):
        if attrs.get(name):
            arr = np.asarray(attrs[name], {"float": np.float32, "int": np.int64, "string": object}[kind])
            found.append((arr, kind))
    tensor = attrs.get(f"{side}_tensor")
    if tensor is not None:
        tensor = np.asarray(tensor)
        found.append((as_strings(tensor) if tensor.dtype.kind in "OUS" else tensor, _kind(tensor.dtype)))
    return found


@register("LabelEncoder", since=(2, 4), domain=ML, static_inputs=_label_encoder_static, host=_label_encoder_static)
def label_encoder(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX-ML ``LabelEncoder``-2/4: map keys to values (4 adds ``keys_tensor``/``values_tensor``
    and ``default_tensor``, and more types). The last of repeated keys wins; NaN matches NaN.
    """
    return (_map_values(inputs[0], attrs, lambda strings: _label_encoder_spec(attrs, ctx), ctx),)


def _label_encoder_spec(attrs, ctx):
    keys, values = _pick(attrs, "keys"), _pick(attrs, "values")
    if len(keys) != 1 or len(values) != 1:
        raise ctx.error("exactly one keys_* and one values_* attribute must be set")
    (keys, _), (values, kind) = keys[0], values[0]
    default_tensor = attrs.get("default_tensor")
    if attrs.get("values_tensor") is not None:
        out_dtype = object if kind == "string" else canonical(values.dtype)
        if default_tensor is not None:
            default = np.asarray(default_tensor).reshape(-1)[0]
            default = as_strings([default])[0] if kind == "string" else default.item()
        else:
            default = _DEFAULTS[kind]
    else:
        out_dtype = _out_dtype(kind)
        default = attrs[f"default_{ {'int': 'int64', 'float': 'float', 'string': 'string'}[kind] }"]
    return _map_spec(keys, values, default, out_dtype, ctx)


@register("CategoryMapper", since=1, domain=ML, static_inputs=(0,), host=True)
def category_mapper(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX-ML ``CategoryMapper``-1: strings <-> int64 through ``cats_strings``/``cats_int64s``."""

    def spec(strings_in: bool):
        strings = np.asarray(attrs["cats_strings"] or (), object)
        ints = np.asarray(attrs["cats_int64s"] or (), np.int64)
        if strings.size != ints.size:
            raise ctx.error(f"cats_strings has {strings.size} entries and cats_int64s {ints.size}")
        if strings_in:
            return _map_spec(strings, ints, attrs["default_int64"], canonical(np.int64), ctx)
        return _map_spec(ints, strings, attrs["default_string"], object, ctx)

    return (_map_values(inputs[0], attrs, spec, ctx),)


# -- maps -----------------------------------------------------------------------------------------


def _stack(values, ctx):
    """Map values (Python scalars, numpy or jax 0-d arrays) as one 1-D array."""
    if any(isinstance(v, (str, bytes)) or (is_concrete(v) and np.asarray(v).dtype.kind in "OUS") for v in values):
        return as_strings(np.asarray([np.asarray(v).item() if is_concrete(v) else v for v in values], object))
    if all(is_concrete(v) or isinstance(v, (int, float)) for v in values):
        return np.asarray(values)
    return jnp.stack([jnp.asarray(v) for v in values])


def _dict_row(d, vocabulary, ctx):
    if not isinstance(d, dict):
        raise ctx.error(f"X must be a map (dict) or a sequence of maps, got {type(d).__name__}")
    index = {k: i for i, k in enumerate(vocabulary)}
    keys = ((_key(k), v) for k, v in d.items())
    return {index[k]: v for k, v in keys if k in index}


def _key(k):
    if isinstance(k, bytes):
        return k.decode("utf-8", errors="surrogateescape")
    if isinstance(k, (np.generic, np.ndarray)):
        return np.asarray(k).item()
    return k


@register("DictVectorizer", since=1, domain=ML)
def dict_vectorizer(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX-ML ``DictVectorizer``-1: a map -> a ``[1, V]`` tensor over the vocabulary (keys not in
    the map are 0, or "" for string values), as onnxruntime shapes it; a list of maps gives
    ``[len, V]``. Map values may be traced scalars.

    The specification says every key must be in the vocabulary; a key that is not is
    ignored, as onnxruntime and scikit-learn's DictVectorizer (what skl2onnx converts) do: a
    feature unseen in training.
    """
    (x,) = inputs
    vocabulary = list(attrs["string_vocabulary"] or ()) or list(attrs["int64_vocabulary"] or ())
    if not vocabulary:
        raise ctx.error("one of string_vocabulary or int64_vocabulary must be set")
    rows = x if isinstance(x, (list, tuple)) else [x]
    cells = [_dict_row(r, vocabulary, ctx) for r in rows]
    values = [v for row in cells for v in row.values()]
    if not values:
        return (np.zeros((len(rows), len(vocabulary)), np.float32),)
    flat = _stack(values, ctx)
    if isinstance(flat, np.ndarray) and flat.dtype == object:
        out = np.full((len(rows), len(vocabulary)), "", object)
        k = 0
        for i, row in enumerate(cells):
            for j in row:
                out[i, j] = flat[k]
                k += 1
        return (out,)
    flat = jnp.asarray(flat)
    if flat.dtype == np.float64 and all(not isinstance(v, jax.Array) for v in values):
        flat = flat if jax.config.jax_enable_x64 else flat.astype(np.float32)
    r = np.array([i for i, row in enumerate(cells) for _ in row])
    c = np.array([j for row in cells for j in row])
    out = jnp.zeros((len(rows), len(vocabulary)), flat.dtype).at[r, c].set(flat)
    return (out,)


@register("CastMap", since=1, domain=ML)
def cast_map(inputs: Inputs, attrs: Attrs, ctx: OpContext) -> Outputs:
    """ONNX-ML ``CastMap``-1: an int64-keyed map -> a ``[1, n]`` tensor ordered by key.

    DENSE keeps every value in key order; SPARSE writes value ``k`` at column ``k`` of
    ``max_map`` columns (missing keys 0, or "" for strings). Strings cast to float/int64 with
    Python's ``float`` (int64 truncates, as onnxruntime); numbers to strings as onnxruntime
    writes them (C++ ``std::to_string``: six decimals), so they need concrete values.
    """
    (x,) = inputs
    if not isinstance(x, dict):
        raise ctx.error(f"X must be a map (dict), got {type(x).__name__}")
    items = sorted((int(_key(k)), v) for k, v in x.items())
    cast_to, form = attrs["cast_to"], attrs["map_form"]
    if cast_to not in ("TO_FLOAT", "TO_STRING", "TO_INT64"):
        raise ctx.error(f"cast_to must be TO_FLOAT, TO_STRING or TO_INT64, got {cast_to!r}")
    if form == "DENSE":
        width, columns = len(items), list(range(len(items)))
    elif form == "SPARSE":
        width, columns = attrs["max_map"], [k for k, _ in items]
        if any(not 0 <= k < width for k in columns):
            raise ctx.error(f"SPARSE map keys must lie in [0, max_map={width})")
    else:
        raise ctx.error(f"map_form must be DENSE or SPARSE, got {form!r}")
    values = [v for _, v in items]
    if cast_to == "TO_STRING":
        if not all(is_concrete(v) or isinstance(v, (str, bytes)) for v in values):
            raise ctx.host_error("numbers cast to strings need their concrete values")
        out = np.full((1, width), "", object)
        for j, v in zip(columns, values):
            v = _key(v)
            out[0, j] = as_strings([v])[0] if isinstance(v, (str, bytes)) else f"{float(v):f}"
        return (out,)
    dtype = np.float32 if cast_to == "TO_FLOAT" else canonical(np.int64)
    converted = []
    for v in values:
        v = _key(v) if is_concrete(v) or isinstance(v, (str, bytes)) else v
        if isinstance(v, str):
            v = float(v)
        converted.append(
            jnp.asarray(v).astype(dtype) if isinstance(v, jax.Array) else dtype(v) if cast_to == "TO_FLOAT" else int(v)
        )
    if not converted:
        return (np.zeros((1, width), dtype),)
    stacked = jnp.stack([jnp.asarray(v, dtype) for v in converted])
    return (jnp.zeros((1, width), dtype).at[0, np.asarray(columns)].set(stacked),)
