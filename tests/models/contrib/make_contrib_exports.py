"""Make the real-export com.microsoft models in ``exports/`` with PyTorch, transformers and
onnxruntime's own tools (the files beside this script, from make_contrib_models.py, start from
graphs built with onnx.helper; these start from torch.onnx.export of transformers models).

Run offline, in a scratch environment (never a dependency of jonnx or its tests):

    python -m venv /tmp/venv && /tmp/venv/bin/pip install torch==2.13.0 transformers==5.24.0 \
        onnxruntime==1.32.0 onnx==1.23.2 onnxscript==0.7.2 onnxruntime-genai==0.18.0
    /tmp/venv/bin/python tests/models/contrib/make_contrib_exports.py

Versions that made the committed files: torch 2.13.0+cpu, transformers 5.24.0, onnx 1.23.2,
onnxruntime 1.32.0, onnxruntime-genai 0.18.0. Weights come from fixed seeds
(``torch.manual_seed``), so a rerun with the same versions writes the same graphs.

What is written (tiny random-weight models: hidden 32, 2 heads, 2 layers, vocabulary 64):

* BertModel, GPT2LMHeadModel, ViTModel and LlamaForCausalLM exported by the TorchScript
  exporter (``dynamo=False``, opset 17: the graphs the transformers optimizer's patterns are
  written for), then ``optimizer.optimize_model`` with model types bert, gpt2, vit and gpt2
  (it has no llama type; optimum uses gpt2 for decoders) at opt_level 1 and 2:
  ``hf_<model>_opt<level>.onnx``; BERT and Llama also from torch's default dynamo exporter
  (opset 20, static shapes) at level 2: ``hf_<model>_dynamo_opt2.onnx`` (GPT-2's dynamo
  export makes the optimizer fail with an IndexError in onnxruntime 1.32);
* ``quantize_dynamic`` (int8 weights) on the level-1 BERT and GPT-2:
  ``hf_<model>_opt1_dynamic_int8.onnx``;
* ``MatMulNBitsQuantizer`` (4 bits block 32, 8 bits block 16, asymmetric) on the level-1
  Llama: ``hf_llama_opt1_nbits<bits>.onnx``;
* onnxruntime-genai's model builder (``python -m onnxruntime_genai.models.builder -p int4
  -e cpu``) on a LlamaForCausalLM saved with save_pretrained: ``genai_llama_int4.onnx``
  (GroupQueryAttention, RotaryEmbedding, MatMulNBits, SkipSimplifiedLayerNormalization, ...),
  with its past/present KV cache inputs and outputs; the same on a Llama with tied
  embeddings and ``shared_embeddings=true`` (GatherBlockQuantized reads the int4 lm_head):
  ``genai_llama_tied_int4.onnx``; and with ``-e dml`` (float16, a separate RotaryEmbedding,
  a position_ids input, GatherBlockQuantized): ``genai_llama_dml_int4.onnx``.
"""

from __future__ import annotations

import logging
import pathlib
import subprocess
import sys
import tempfile
import warnings

import onnx

OUT = pathlib.Path(__file__).resolve().parent / "exports"
HIDDEN, HEADS, LAYERS, VOCAB, FFN, SEQ = 32, 2, 2, 64, 64, 8
LLAMA_FFN = 96


class _Wrap:
    """A torch module calling the transformers model with keyword arguments and returning
    one tensor (transformers 5 reordered forward's positional arguments)."""

    @staticmethod
    def make(model, names, output):
        import torch

        class Wrapped(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.model = model

            def forward(self, *args):
                out = self.model(**dict(zip(names, args)))
                return getattr(out, output)

        return Wrapped().eval()


def _export(model, names, output, args, path, dynamic):
    import torch

    if dynamic is None:  # torch's default exporter (dynamo, opset 20), static shapes
        torch.onnx.export(
            _Wrap.make(model, names, output),
            tuple(args),
            str(path),
            input_names=list(names),
            output_names=[output],
            dynamo=True,
            optimize=True,
        )
        return
    torch.onnx.export(
        _Wrap.make(model, names, output),
        tuple(args),
        str(path),
        input_names=list(names),
        output_names=[output],
        dynamic_axes={n: dynamic for n in names},
        opset_version=17,
        dynamo=False,
    )


def _models():
    import torch
    import transformers as tf

    common = {
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "intermediate_size": FFN,
        "hidden_size": HIDDEN,
        "attn_implementation": "eager",
    }
    ids = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, SEQ, dtype=torch.int64)
    mask[1, 5:] = 0
    batch_seq = {0: "batch", 1: "sequence"}

    torch.manual_seed(0)
    bert = tf.BertModel(tf.BertConfig(vocab_size=VOCAB, max_position_embeddings=16, **common))
    yield (
        "bert",
        bert,
        ("input_ids", "attention_mask", "token_type_ids"),
        "last_hidden_state",
        (ids, mask, torch.zeros_like(ids)),
        batch_seq,
    )
    torch.manual_seed(1)
    gpt2 = tf.GPT2LMHeadModel(
        tf.GPT2Config(
            vocab_size=VOCAB,
            n_positions=16,
            n_embd=HIDDEN,
            n_layer=LAYERS,
            n_head=HEADS,
            n_inner=FFN,
            attn_implementation="eager",
        )
    )
    yield "gpt2", gpt2, ("input_ids",), "logits", (ids,), batch_seq
    torch.manual_seed(2)
    vit = tf.ViTModel(
        tf.ViTConfig(image_size=16, patch_size=4, num_channels=3, **common),
        add_pooling_layer=False,
    )
    pixels = torch.randn(2, 3, 16, 16)
    yield "vit", vit, ("pixel_values",), "last_hidden_state", (pixels,), {0: "batch"}
    torch.manual_seed(3)
    # With an attention mask (all ones): without one transformers looks for packed sequences
    # with aten::diff, which the TorchScript exporter cannot write.
    ones = torch.ones_like(ids)
    yield (
        "llama",
        _llama(),
        ("input_ids", "attention_mask"),
        "logits",
        (ids, ones),
        batch_seq,
    )


def _llama():
    import transformers as tf

    return tf.LlamaForCausalLM(
        tf.LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=HIDDEN,
            # Not FFN (= VOCAB): the genai builder takes any Linear with vocabulary-many
            # outputs for the LM head, and would wire the logits to layer 0's MLP.
            intermediate_size=LLAMA_FFN,
            num_hidden_layers=LAYERS,
            num_attention_heads=HEADS,
            num_key_value_heads=1,
            max_position_embeddings=64,
            use_cache=False,
            attn_implementation="eager",
        )
    ).eval()


def _tokenizer():
    """A word-level tokenizer over the 64-token vocabulary, made offline."""
    import tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(VOCAB)}
    inner = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="t0"))
    inner.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=inner, unk_token="t0", bos_token="t1", eos_token="t2")


def _genai(tmp, seed, tag, ep="cpu", tied=False, extra=()):
    """Run onnxruntime-genai's int4 builder on a saved tiny Llama; return the model proto."""
    import torch

    torch.manual_seed(seed)
    src, out = tmp / f"genai_src_{tag}", tmp / f"genai_out_{tag}"
    model = _llama()
    model.config.use_cache = True
    model.config.tie_word_embeddings = tied  # tied: the embedding reads the int4 lm_head
    model.save_pretrained(src)
    _tokenizer().save_pretrained(src)  # the builder also writes the tokenizer's files
    cmd = [
        sys.executable,
        "-m",
        "onnxruntime_genai.models.builder",
        "-m",
        str(src),
        "-o",
        str(out),
        "-p",
        "int4",
        "-e",
        ep,
        "-c",
        str(tmp / "genai_cache"),
        *extra,
    ]
    subprocess.run(cmd, check=True)
    return onnx.load(out / "model.onnx")


def main():
    logging.disable(logging.INFO)
    warnings.filterwarnings("ignore")
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
    from onnxruntime.transformers import optimizer

    OUT.mkdir(exist_ok=True)
    written = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        for name, model, names, output, args, dynamic in _models():
            raw = tmp / f"{name}.onnx"
            _export(model.eval(), names, output, args, raw, dynamic)
            kind = {"llama": "gpt2"}.get(name, name)
            for level in (1, 2):
                opt = optimizer.optimize_model(
                    str(raw),
                    model_type=kind,
                    num_heads=HEADS,
                    hidden_size=HIDDEN,
                    opt_level=level,
                    use_gpu=False,
                )
                written[f"hf_{name}_opt{level}.onnx"] = opt.model
            if name in ("bert", "llama"):
                # The same model from torch's default (dynamo) exporter, at level 2.
                _export(model.eval(), names, output, args, raw, None)
                opt = optimizer.optimize_model(
                    str(raw),
                    model_type=kind,
                    num_heads=HEADS,
                    hidden_size=HIDDEN,
                    opt_level=2,
                    use_gpu=False,
                )
                written[f"hf_{name}_dynamo_opt2.onnx"] = opt.model
        for name in ("bert", "gpt2"):
            src = tmp / f"hf_{name}_opt1.onnx"
            onnx.save(written[src.name], src)
            dst = tmp / f"hf_{name}_opt1_dynamic_int8.onnx"
            # The fused com.microsoft nodes have no type inference: say the default type.
            quantize_dynamic(
                src,
                dst,
                weight_type=QuantType.QInt8,
                extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
            )
            written[dst.name] = onnx.load(dst)
        for bits, block in ((4, 32), (8, 16)):
            quantizer = MatMulNBitsQuantizer(
                onnx.load_from_string(written["hf_llama_opt1.onnx"].SerializeToString()),
                bits=bits,
                block_size=block,
                is_symmetric=False,
            )
            quantizer.process()
            written[f"hf_llama_opt1_nbits{bits}.onnx"] = quantizer.model.model
        written["genai_llama_int4.onnx"] = _genai(tmp, 4, "cpu")
        written["genai_llama_tied_int4.onnx"] = _genai(
            tmp,
            5,
            "tied",
            tied=True,
            extra=("--extra_options", "shared_embeddings=true"),
        )
        # For DirectML the builder writes float16, a separate RotaryEmbedding and position_ids
        # (the graph is EP-neutral: onnxruntime's CPU provider runs it).
        written["genai_llama_dml_int4.onnx"] = _genai(tmp, 5, "dml", ep="dml", tied=True)
    for name, model in written.items():
        onnx.save(model, OUT / name)
        ops = sorted({f"{n.domain + ':' if n.domain else ''}{n.op_type}" for n in model.graph.node})
        print(f"{name}: {(OUT / name).stat().st_size} bytes, ops {ops}")


if __name__ == "__main__":
    main()
