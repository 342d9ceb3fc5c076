"""CONTRIBUTING.md's "Adding an operator": its example is the repository's code, and it works
when followed for a new op."""

from __future__ import annotations

import functools
import pathlib
import re

import jax.numpy as jnp
import numpy as np
import onnx.defs

import jonnx
from jonnx._attributes import schema_defaults
from jonnx._registry import Attrs, Inputs, OpContext, Outputs, registered
from jonnx.ops._util import static_ints

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOMAIN = "jonnx.tests.contributing"


def _example() -> tuple[str, str]:
    """The guide's two python blocks: the op, and its tests."""
    text = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text.split("## Adding an operator", 1)[1], re.S)
    assert len(blocks) == 2, "the guide shows the op and its tests"
    return blocks[0], blocks[1]


def test_example_is_the_repositorys_code():
    op, tests = _example()
    assert op in (ROOT / "ops" / "shape.py").read_text(encoding="utf-8")
    assert tests in (ROOT / "tests" / "ops" / "test_shape.py").read_text(encoding="utf-8")


@functools.cache  # a registration is for the whole process
def _follow_the_guide(block: str) -> tuple[str, tuple[int, ...]]:
    """Run the guide's op block, registering the op again in a test domain: the op's name,
    and the versions the block claims."""
    claimed: dict = {}

    def register(op_type, *, since, **options):
        versions = (since,) if isinstance(since, int) else tuple(since)
        claimed.update(op_type=op_type, since=versions)
        schema = onnx.defs.get_schema(op_type, max(versions), "")
        # Step 4: onnx has no schema for the test domain, so the op declares its input count.
        return jonnx.register(
            op_type,
            since=versions,
            domain=DOMAIN,
            n_inputs=len(schema.inputs),
            attributes=schema_defaults(schema),
            **options,
        )

    names = {
        "__name__": "contributing_example",  # the module its functions report (never None)
        "register": register,
        "jnp": jnp,
        "static_ints": static_ints,
        "Inputs": Inputs,
        "Attrs": Attrs,
        "OpContext": OpContext,
        "Outputs": Outputs,
    }
    exec(compile(block, "CONTRIBUTING.md", "exec"), names)
    return claimed["op_type"], claimed["since"]


def test_example_op_follows_the_guide():
    op_type, since = _follow_the_guide(_example()[0])
    # Step 1 and 2: the op lives in the module the guide names, with every version onnx defines.
    versions = sorted(
        s.since_version for s in onnx.defs.get_all_schemas_with_history() if s.name == op_type and not s.domain
    )
    assert sorted(since) == versions
    assert registered()[("", op_type, versions[-1])].fn.__module__ == "jonnx.ops.shape"
    # Step 3: an omitted optional input arrives as None; attrs hold the schema's defaults.
    x = np.arange(2 * 4 * 5, dtype=np.float32).reshape(2, 4, 5)
    np.testing.assert_array_equal(jonnx.ops.call(op_type, x, domain=DOMAIN), np.triu(x))
    for k in (-1, 2):
        got = jonnx.ops.call(op_type, x, np.array(k, np.int64), domain=DOMAIN, upper=0)
        np.testing.assert_array_equal(got, np.tril(x, k))
