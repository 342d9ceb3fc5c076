"""Differential fuzzing: random one-node models through jonnx, onnxruntime and the ReferenceEvaluator.

A developer's tool, not a test: ``python -m tests.conformance.fuzz [--seed S] [--cases N]
[--families F ...] [--opset O] [--half] [--long] [--grad | --vmap] [--lowering elsewhere] [--trace]`` draws single-node models (shapes of rank 0-4 with empty
dimensions about a quarter of the time, broadcasting partners, attributes across their range,
inputs as graph inputs or as initializers), runs each through onnxruntime (or, where
onnxruntime refuses it, the ReferenceEvaluator; where both refuse, the op's formula in numpy
for the few ops in ``FORMULAS``) and through ``jonnx.load(model)(*inputs)``, and prints every
case where jonnx raises or differs. A difference from onnxruntime where jonnx
equals the ReferenceEvaluator is only counted: the two references disagree there; so is one
on a case where a reference departs from the specification as listed below (``DEPARTURES``). The
``microsoft`` and ``microsoft_quantized`` families draw onnxruntime's contrib ops, which only
onnxruntime can check. ``--grad`` checks jonnx's derivatives (float64, every float input not
needed at trace time) against central finite differences instead, and forward mode along a
random direction against that gradient (since 2026-12-03); ``--vmap`` checks
``jax.vmap`` over three rows of every numeric input and weight jonnx can trace, each batched on
an axis drawn at random, against each row run alone; ``--lowering elsewhere`` traces the ops
as jonnx lowers them off the CPU (for a GPU or TPU: XLA's convolutions and pooling) and runs
them here; ``--trace`` prints each case before it runs, to find one that crashes a reference.

The ``--vmap`` runs' first 1,000 cases (2026-12-03) found a process abort in XLA's
convolution operand swap (Col2Im of one channel with a kernel 2, stride 2, pads 1 axis; the
same pattern in Conv gradients and ConvTranspose, docs/known_issues.md), fixed in ops/conv.py,
and that GroupQueryAttention reads its total length differently traced (by design: the row
reference is therefore compiled with the same values traced).

Its first runs (2026-11-29) found the bugs fixed in ad7ffa0 (Gather and dilated MaxPool of empty
tensors, ArgMax over an empty axis, Resize with keep_aspect_ratio_policy) and TopK's order of
-0 and +0. What they still print is, as far as checked, where the specification leaves the
result open or onnxruntime departs from it:

- Cast of an out-of-range float to an integer type: undefined (jonnx saturates, onnxruntime
  wraps), so the fuzz draws floats in range;
- ReduceMean of an empty set: undefined (jonnx and the ReferenceEvaluator NaN, onnxruntime 0);
- NonZero of a scalar: onnxruntime reads it as 1-D ((1, n) indices, jonnx (0, n));
- ConvTranspose with auto_pad SAME and dilations, or a kernel shorter than the stride:
  onnxruntime's output shape is not the specified ``input * stride``;
- Squeeze with an empty ``axes`` tensor: onnxruntime squeezes every 1 (jonnx and the
  ReferenceEvaluator squeeze nothing);
- DynamicQuantizeLinear of a constant or empty tensor: onnxruntime's scale is 1, jonnx's and
  the ReferenceEvaluator's 1/255 (the quantized values agree);
- Resize with pytorch_half_pixel to a length of 1: the ReferenceEvaluator samples at -0.5, the
  specification (jonnx, onnxruntime) at 0;
- MaxPool with auto_pad SAME and dilations: onnxruntime pads for the undilated window (the
  specification, and jonnx, for the dilated one), and the ReferenceEvaluator pads SAME_LOWER
  as SAME_UPPER;
- pooling with auto_pad VALID and ceil_mode: jonnx takes the specified VALID length,
  ``ceil((input - window + 1) / stride)``, onnxruntime applies ceil_mode to its padded formula;
- a Loop body that passes its iteration number straight through as a scan output: onnxruntime
  1.32 stacks the final count in every row (``[4, 4, 4, 4]`` for four iterations; with an
  Identity node between, ``[0, 1, 2, 3]``, as the specification has it, and jonnx either way);
- Pad removing more than an empty axis holds, a pooling window larger than its input, and
  pooling whose SAME padding would be negative: jonnx refuses or clamps where onnxruntime
  accepts or refuses.

The ``loop`` family draws Loops whose exit depends on a runtime limit, with scan outputs,
which ``Model(*inputs)`` runs on the host; its first runs (2026-11-29, 2,000 cases) found
only the onnxruntime bug above.

The contrib families found nothing in their first 4,000 cases (2026-11-29). onnxruntime 1.32
crashes the process on LayerNormalization written with a trailing empty input name (bias
omitted as ``""``), which is why ``node_model`` leaves omitted trailing inputs out; it has no
CPU kernel for BiasAdd, BiasSoftmax, BiasSplitGelu, GemmFastGelu, MulInteger or
QLinearReduceMean, refuses every ReduceSumInteger node in its own type inference and FusedGemm
with a Clip activation, so the families leave those out.

The ``attention`` family draws the contrib Attention, MultiHeadAttention, GroupQueryAttention
and RotaryEmbedding and the default domain's Attention and RotaryEmbedding of opset 23 (masks,
past and present caches, grouped heads, windows, rotary); its first runs (2026-11-29, 2,400
cases) found no jonnx bug. They count one reference disagreement: Attention-23's
``qk_matmul_output_mode`` 2 output holds onnxruntime's lowest float where a key is masked,
the ReferenceEvaluator's (and jonnx's) -inf. The family leaves out, with a comment each, the
corners where onnxruntime's kernels refuse a valid model or depart without documentation.

The ``recurrent`` family draws RNN, GRU and LSTM; its first runs (2026-12-02: 1,800 cases of
its final draws, 1,400 while drafting them, 100 with ``--grad``) found no jonnx bug. What they
showed of the references, now drawn around (see the family's comments): onnxruntime runs these
ops in float32 and layout 0 only, aborts the process on a GRU with an empty sequence or batch
and on an LSTM with an empty batch, returns uninitialized memory as Y_h and Y_c after an empty
sequence, defaults a missing alpha or beta to 0 (ThresholdedRelu's alpha is 1.0 by the
specification) and compares ThresholdedRelu's threshold strictly (the RNN text says ``x >=
alpha``); the ReferenceEvaluator ignores ``clip``, ``sequence_lens``, ``input_forget`` and
``activations``. Since 2026-12-04 onnxruntime runs layout 1 too, as the same node in layout 0
between Transposes (``time_major_twin``; the graph fuzz had reported a GRU in layout 1 with
sequence lengths, where the ReferenceEvaluator was the only reference and ignored them), so
float32 cases draw either layout with every feature: 800 cases (seeds 520 and 522), all agree.
On 2026-12-06, after R's gradient was taken out of the scan (ops/rnn.py ``_recurrence``),
``--grad`` found a GRU with ``linear_before_reset`` and a constant R whose candidate product's
tangent was the bias's alone, not broadcast over the steps (fixed); 400 ``--grad``, 300 ``--grad
--half``, 300 ``--vmap`` and 600 plain cases after the fix agree.

The ``ml`` family draws ai.onnx.ml's TreeEnsembleRegressor, TreeEnsembleClassifier,
LinearRegressor and LinearClassifier; its first runs (2026-12-02, 1,200 cases of its final
draws) found no jonnx bug, and much where onnxruntime's results are its own (the family's
docstring lists what it leaves out). One is counted as a departure from the specification:
BRANCH_NEQ on a missing value, where onnxruntime compares NaN != threshold (true) instead of
following ``nodes_missing_value_tracks_true``. The ReferenceEvaluator gives LinearClassifier
NaN scores without ``intercepts`` (an optional attribute; onnxruntime refuses the model),
fails on NaN inputs when ``nodes_missing_value_tracks_true`` is absent, and returns
LinearRegressor's and the tree regressors' scores in the input's type where the schema says
float.

The ``ml_encoders`` family draws ai.onnx.ml's feature transforms and label maps and the
SVMs; its first runs (2026-12-02, 2,000 cases) found two jonnx bugs, now fixed: a 1-D
FeatureVectorizer input was read as a column (the specification and onnxruntime: one row),
and a string tensor indexed by computed indices (ArrayFeatureExtractor or Gather of class
names by an ArgMax, as skl2onnx writes string labels) was refused; it now runs on the host.
One reference disagreement is counted: Normalizer's MAX, where onnxruntime divides by the
largest value and the onnx reference (and jonnx, as scikit-learn) by the largest magnitude.
onnxruntime aborts the process on a FeatureVectorizer of an empty batch. A counted
departure: LabelEncoder-2 compares keys by bits, so a NaN key maps the same NaN; onnxruntime
(and the onnx reference) never match it there (at opset 4 onnxruntime does, as jonnx).

The ``text`` family draws the string ops, TfIdfVectorizer and onnxruntime's Tokenizer; its
first runs (2026-12-02, 1,600 cases) found four jonnx bugs, now fixed: TfIdfVectorizer
weighed output columns where the specification weighs pool n-grams, RegexFullMatch read
RE2's ASCII classes (``\\w``, ``\\d``, ``\\s``, ``\\b``) as Python's Unicode ones, StringSplit
kept trailing whitespace after ``maxsplit`` splits, and Tokenizer (then new) shaped an empty
``[0, C]`` input unlike onnxruntime. Counted departures of onnxruntime: StringSplit without a
delimiter splits at spaces only (the specification: whitespace), and of an empty string by
a delimiter gives no substring; StringNormalizer upper-cases ß one character at a time
(jonnx: SS). onnxruntime's StringNormalizer needs its locale installed (the family names
C.UTF-8); the ReferenceEvaluator's removes stopwords inside elements and strips accents.

The ``sequence`` family draws the sequence ops, its sequence inputs built inside the model
by SequenceConstruct (``Seq`` inputs, see ``_build``); its first runs (2026-12-02,
1,200 cases and 200 with ``--grad``) found nothing, nor did SequenceMap's (added later that day).

The ``optional`` family draws Optional, OptionalHasElement and OptionalGetElement on
optionals built in the model (``Opt`` inputs) and plain values; the ``maps`` family draws
DictVectorizer, CastMap and ZipMap on dicts fed as maps (``Map`` inputs). Their first runs
(2026-12-02, 2,500 cases with the sequence family) found three jonnx bugs, now fixed: a
map's values took the type Python gave them, not the declared one (float64 out of a float
map under x64), a map of strings failed inside a compiled segment, and CastMap to strings
failed (and wrote Python's ``str``, not onnxruntime's six decimals). DictVectorizer now
ignores keys outside its vocabulary, as onnxruntime and scikit-learn do (the specification
says they must not occur; jonnx refused them). A counted departure: onnxruntime writes
``0.f`` in a SPARSE string cast's empty cells. onnxruntime refuses empty maps and its Python
binding feeds maps of floats only; the ReferenceEvaluator shapes DictVectorizer's output
``[V]`` (onnxruntime, and jonnx, ``[1, V]``) and wraps OptionalGetElement's tensor in a list.

Later on 2026-12-02 the families grew to ops no family drew: Slice (``shape``: inputs of
either integer type at the int64 extremes, steps of both signs, opset 1's attributes), the
trigonometric and hyperbolic functions, IsInf, Shrink, Not, Or, LessOrEqual, GreaterOrEqual
and the Bitwise ops (``elementwise``), and two new families, ``loss``
(SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss with weights, ignore_index and every
reduction) and ``detection`` (NonMaxSuppression). Their first runs (2,300 cases of the shape and
elementwise families, 600 of each new family, 300 loss cases and 700 shape and elementwise
ones with ``--grad``) found nothing. GridSample, drawn by the ``resize`` family since, found
one jonnx bug (800 cases): cubic sampling with border padding moved a point past the border
onto it before weighing its taps, as the onnx reference does; PyTorch's grid_sample (which
exporters map GridSample to) and onnxruntime pad each tap and leave the point, as jonnx now
does. The ReferenceEvaluator's remaining cubic differences are counted as its own.

Since 2026-12-03 the ``detection`` family draws RoiAlign (opsets 10 and 16, both modes, both
coordinate modes, fixed and adaptive sample counts, regions as inputs or constants) and
MaxRoiPool too, on regions inside, across and off the map, degenerate ones included; its
first runs (1,200 cases, 150 with ``--grad``) found nothing. Later ``--grad`` runs found one
jonnx bug: RoiAlign's max mode, compiled, took its derivative by comparing the weighted
corners with their max, and XLA computed those products in more than one fusion, rounded
differently, so none matched (a NaN derivative) or the wrong one did; the max is now taken
by index. The other differences they showed were finite differences straddling jumps, now
skipped (:func:`_sampled_at_kinks`): MaxRoiPool's fed regions (rounded, and a batch-index
column) and RoiAlign's adaptive sample counts at regions of zero height or width. (Five
seeds of 60 ``--grad`` cases and 400 value cases after the fix: nothing.) onnxruntime's
RoiAlign warns that its max mode departs from the specification; jonnx follows it and the
onnx reference there (the max of the weighted corner values).

Also since 2026-12-03: Swish and CumProd (``elementwise``, ``reduce``), EyeLike and
CenterCropPad (``shape``), GlobalLpPool (``reduce``) and RMSNormalization
(``normalization``). Their first runs (2,500 cases, 450 with ``--grad``) found one jonnx bug,
now fixed, and not in a new op: GroupNormalization of an empty batch failed (its grouping
reshape divided by zero). onnxruntime refuses those cases, so only ``--grad``, which runs
jonnx alone, saw it: read its "does not run" count too.

Since 2026-12-03 too: a ``conv_variants`` family (MaxUnpool of non-overlapping windows with
and without ``output_shape``, Col2Im, DeformConv at opsets 19 and 22 with groups, offset
groups, bias and mask, ConvInteger with either weight type and optional zero points; empty
batches included), and AffineGrid (2-D and 3-D) and Upsample (opsets 7 and 9) in ``resize``.
Their first runs (950 value cases, 160 with ``--grad``) found nothing. AffineGrid with
align_corners=1 along an axis of one point: onnxruntime places it at +1, the onnx reference
and jonnx at -1 (the specification's Range from -1 by 2/0), PyTorch at 0; counted as the
references disagreeing. A ``--grad`` run of every family (40 cases each, seed 31) found
nothing either: its two "does not run" cases were errors by design (Gather of an empty axis,
ArrayFeatureExtractor on strings under ``apply``).

Also drawn since then: CastLike (opsets 15-21) and BitCast (opset 26, every bit pattern of
same-width types) in ``cast``, SwiGLU (opset 28) in ``elementwise``, Det in ``products``,
Scatter (opsets 9 and 10) and TensorScatter (opset 24, linear and circular) in ``indexing``:
1,150 value cases and 240 with ``--grad``, nothing found. (The ``indexing`` family no longer
draws a scalar index into an empty axis: out of range, an error for jonnx and onnxruntime,
while numpy's take, which the onnx reference uses, reads nothing and returns an empty array.)
The ``loop`` family draws Scan (opsets 9-21, every scan axis and direction) and If (opsets
11-21, branches reading outer tensors, the condition fed or constant) beside Loop: 600 value
cases and 80 with ``--grad``, nothing found. A Scan of zero steps is not drawn: onnxruntime
1.32 dies of a floating point exception on it (the whole process), and the ReferenceEvaluator
refuses it; jonnx returns the initial state and empty scan outputs. On 2026-12-03 it grew
Loops that carry a sequence (opsets 13-21: appended to, put first, or erased and appended,
empty or not at the start, with its length as a scan output), and ``--grad`` began to project
sequence outputs tensor by tensor instead of skipping them: 550 value and 300 ``--grad``
cases over the ``loop`` and ``sequence`` families, nothing found.

Since 2026-12-04 the cases both references refuse are checked against the op's formula in
numpy where one is written (``FORMULAS``: LRN on 3-D inputs,
MeanVarianceNormalization in float64, GroupNormalization of an empty batch, RMSNormalization
of one with ``stash_type`` 11), instead of going unchecked as ``no reference for <op>``. The
formulas agree with onnxruntime wherever it runs (153 cases: LRN 36, MeanVarianceNormalization
25, GroupNormalization 25 at opsets 18 and 21, RMSNormalization 67), except that over a unit
axis onnxruntime's MeanVarianceNormalization gives NaN (0/0: it leaves out the function
body's epsilon) where the ReferenceEvaluator, the formula and jonnx give 0; jonnx agreed with
them on every case of three seeds of 400 ``normalization`` cases. Then RNN, GRU and LSTM over
an empty sequence in float64 (an empty Y, the initial states as the last) and
com.microsoft's MatMulIntegerToFloat with int8 A and uint8 B (no onnxruntime kernel; the
formula agrees with onnxruntime on the three type pairs it runs): three seeds of 300
``recurrent``, ``microsoft_quantized`` and ``normalization`` cases used a formula 63 times,
and jonnx agreed every time.

Graphs of many ops, where the optimization passes act, are ``fuzz_graphs.py``'s.

The ``signal`` family draws DFT (opsets 17 and 20), STFT and the window ops; its first runs
(2026-12-02, 1,200 cases) found no jonnx bug. A symmetric window of one point is a departure
by choice: the formula divides by zero, onnxruntime returns NaN, jonnx [1] as numpy and torch.

At an old ``--opset`` the families still draw most ops in their newest forms. A model that
``onnx.checker`` refuses node by node (an op newer than the opset, an input or attribute of a
later version) is counted ``invalid model`` when jonnx refuses it too, per op; jonnx running it
where no reference does is the finding ``runs an invalid model``. The first runs at opsets 7 and
9 with that check (2026-12-04) found jonnx ignoring a later version's extra input (ReduceSum-1
with an ``axes`` input reduced over every axis; Clip-6, Split-2 likewise): loading now refuses
input and output counts outside the schema's. Until that day ``check_model``, which refuses every
one of these models for its untyped outputs, stood in for the per-node check, so every jonnx
error was counted ``invalid model``; runs of stop 56 at ``--opset`` 7, 11 and 16 were redone.
The same day the families began drawing older forms (Reduce* with axes attributes, Softmax-11,
ArgMax-11, Squeeze/Unsqueeze/Split-11, Pad-2, Clip-6, TopK-1, OneHot-9, BatchNormalization-6/7/9,
Gemm-6 with its broadcast attribute); a ``--grad`` run at
opset 11 found JAX's transpose of ``lax.pad`` failing for a traced fill over an input that is not
differentiated (now a select, ops/shape.py). Until the next day ``--grad`` and ``--vmap``
counted such invalid models as ``does not run`` (84-113 of 450 cases at opset 7); they now
count them ``invalid model`` per op, as the value check does.

The binary ops' versions before opset 7 (Add, Sub, Mul, Div of versions 1 and 6; Pow, And, Or,
Xor, Equal, Greater, Less of version 1) are drawn in their own form a quarter of the time: B of
A's shape, or with ``broadcast=1`` of one element or A's dims from ``axis`` on, with version 1's
``consumed_inputs``, in those versions' types (float16 among them). onnxruntime runs no version
before 7 and the ReferenceEvaluator broadcasts from the last axis whatever ``axis`` says, so
their formulas (``OLD_FORMS``) are the reference, asked before the ReferenceEvaluator; a model
whose shapes the version does not take is invalid (:func:`_legacy_broadcast_problem`). The
first runs (2026-12-04, 1,200 cases at seed 605, 42 of them old forms; opsets 5 and 6) found
float16 Div by a broadcast divisor one unit in the last place off: XLA divides by the reciprocal
(docs/known_issues.md; Div now computes half types in float32). AveragePool-1 over padding was a
departure of the ReferenceEvaluator's (it counts the pads; the version's text does not); since
2026-12-05 onnxruntime's version 7 checks it (:func:`later_twin`).

``--half`` draws float16 wherever the families draw floats. Its first run (seed 611, 300
``elementwise`` and ``normalization`` cases) found 99 of 293 one to four units in the last
place off onnxruntime (18 of them equal to the ReferenceEvaluator, which rounds step by step),
which computes half-precision activations, unary math and normalizations in
float32 and rounds once; jonnx went step by step in float16 (or cast back before a
normalization's scale, as the function bodies do). Those ops now compute in float32 too
(``ops._util.half_in_float32``, ``ops._util.widen_halves``), and the same run leaves 6: where
onnxruntime runs no kernel (BatchNormalization-1, SwiGLU) the ReferenceEvaluator rounds step by
step, and one is onnxruntime's NaN for MeanVarianceNormalization over a unit axis (above). Over
the other numeric families (seed 613: reduce, products, conv_pool, resize, attention, signal,
loss) 14 of 296 were off both references: SoftmaxCrossEntropyLoss, now in float32 too, and one
Softmax, which stays step by step (the node suite's float16 Attention expanded into its function
body expects that); where a loss is weighted or reduced onnxruntime rounds each log-probability to float16
first, a departure (jonnx's are the correctly rounded values, checked in tests/ops/test_loss.py).
19 more equal the ReferenceEvaluator and not onnxruntime (DFT, STFT, Gemm, ReduceMean, Attention,
Resize: onnxruntime computes those in float32 and rounds once; left as they are). Gemm, whose
product is exact in float16 but whose alpha/beta epilogue rounded after each step (41% of
outputs a unit off), now keeps the product's float32 sums and rounds once. The recurrent family
(seed 617, 200 cases) had 49 off onnxruntime (GRU, LSTM: cells stepping in float16); they now
carry float32 states and round the outputs once: 200 ok. Seed 616 over recurrent, quantize,
indexing, shape, cast, microsoft, microsoft_quantized, conv_variants: only those recurrent
cases. Seed 620 over reduce and detection: 43 of 285 off, the composite reductions
(ReduceSumSquare, ReduceL2, ReduceLogSumExp... squared or exponentiated in float16 first) and
RoiAlign; they compute in float32 now: 3 left (Softmax, a departure by choice, and one
ReduceLogSumExp against the ReferenceEvaluator's stepwise float16).

Loop and Scan in float16 (seeds 701 and 702, 2026-12-05): onnxruntime computes a chain of
float16 nodes in float32 and rounds once, so its bodies are no per-node reference there, and the
ReferenceEvaluator's own Loop and Scan stack scan outputs wrongly or refuse axes and directions
other than 0. :class:`StepByStep` runs those bodies one iteration at a time through the
ReferenceEvaluator, rounding after each node, and is their reference wherever a half-precision
value enters (52 of 300 "differs" at seed 702 were onnxruntime's). Behind them one jonnx bug:
XLA folded a body's constant into itself across an unrolled loop (``(h * c) * c`` as ``h *
c**2``; docs/known_issues.md "two constants in a chain"), fixed for every Add, Sub, Mul and Div
with a constant operand. TreeEnsemble*, Binarizer and the other ai.onnx.ml ops take no half
types (``ML_FLOATS``): the drawn float16 models were invalid. The same run found Einsum's
float16 reductions summed in float16 ('ij->', off the correctly rounded sum; now in float32, as
onnxruntime). Gemm and BatchNormalization (``is_test``) before opset 7, which onnxruntime
does not run, have formulas in ``OLD_FORMS`` (rounded once; the ReferenceEvaluator rounds after
each step: seed 714 had two such BatchNormalization cases "differ"), so ``products`` is pinned
under --half too. Seed 703 (products, reduce, attention, signal; 293 cases) leaves one
DFT output one unit off the correctly rounded value, a float32 near tie (onnxruntime: 11 of 360).

BatchNormalization in training (2026-12-05): a third of its draws train, at version 6
(``is_test=0``, per channel or per activation, by its formula in ``OLD_FORMS``) and versions 14
and 15 (``training_mode``, against onnxruntime). The first runs found jonnx's float16 running
statistics updated step by step in float16 (a unit or two off onnxruntime's; now in float32,
rounded once), and that ``--grad`` and ``--vmap`` had never checked such a case: with the
running statistics as initializers ``Model.apply`` returns ``(outputs, new_state)``, which the
checks called "not differentiable" and "not batchable" (they take ``apply_with_state``'s
outputs now, and the gradient check leaves the running statistics, which carry no gradient by
design, out of its projection). A ``--opset 6`` run crashed on a Gemm-6 without C (the formula
now declines it), and a C of another shape than the output without ``broadcast=1`` is an
invalid model (:func:`_legacy_gemm_problem`). Where jonnx differs from onnxruntime, the op's
formula settles it as ``reference disagrees`` as the ReferenceEvaluator does
(MeanVarianceNormalization in float16 over a unit axis: onnxruntime's NaN, and the
ReferenceEvaluator refuses float16 there). Left: in float16 onnxruntime is sometimes a unit off
the correctly rounded value at a float32 near tie where jonnx is not (InstanceNormalization at
seed 730, BatchNormalization in inference at 724: one element each in 250 cases).

The ``legacy`` family (2026-12-05) draws old versions in their own forms, which no other family
drew (their later forms drawn at an old ``--opset`` are invalid models): Upsample-1's height and
width scales, LpPool-1 and GlobalLpPool-1's float ``p``, AveragePool-1 (pads left out of the
divisor), Pad-1's ``paddings`` and Pad-2's ``pads`` attributes, Slice-1's and Reshape-1's
attributes, Split-1/2's ``split`` attribute, Clip-1/6's ``min`` and ``max``, Concat-1's default
axis 1 and Tile-1's one axis. onnxruntime runs few of them and the ReferenceEvaluator runs them
by later rules, so each is checked as the later version it equals (:func:`later_twin`,
``LATER_FORMS``), run by onnxruntime, else by the ReferenceEvaluator (Resize-13 for Upsample-1
in float64), else by a formula (GlobalLpPool in float64). Each twin is tested against its
version's text worked out in numpy. The first 300 cases (seed 740) all agreed with jonnx.
Under ``--half`` (seed 742) they found AveragePool, LpPool and GlobalLpPool summing float16
windows in float16 (29 of 300 a unit or more off onnxruntime's version 7; now in float32,
rounded once). A look at longer axes than the families draw then found ReduceSum, ReduceProd,
CumSum and LRN accumulating float16 in float16 too (ReduceSum over 40 values: 1,385 of 2,000
rows off; XLA keeps a reduction in its operands' type), all in float32 now. Where the
ReferenceEvaluator is the reference in float16 (ReduceL2-1, which onnxruntime refuses), it
rounds after each numpy step; a jonnx result that differs is then checked against the
ReferenceEvaluator run in float64 and rounded once (:func:`widened_outputs`), and equal to
it counts as ``reference disagrees`` (seeds 753, 754: 4 such cases). The same look over other
ops found Sum and Mean of three inputs, RotaryEmbedding, AffineGrid, DeformConv, the
com.microsoft Gelus and layer norms and the Scatter add reductions rounding between steps
(docs/known_issues.md, "a half-precision reduction"); all in float32 now. ``--long`` draws one
axis of each general shape (``Draw.shape``) with up to 64 values, so that such sums show: its
first runs (seeds 770-772, ``--half``, 150 cases each) found an Atan over 44 float16 values
giving NaN and zeros, XLA CPU's atan miscompiled with 512-bit vectors (docs/known_issues.md;
jonnx's Atan is now ``atan2(2x, 2)``). Since 2026-12-06 it also lengthens what the families
that draw their own dimensions draw (``Draw.length``: channels and maps of normalization and
conv_pool, which reach the size-gated convolution lowerings, classes of loss, sequences
and head sizes of attention, sequences and states of recurrent, resized maps, signals, boxes
of NonMaxSuppression, regions and maps of RoiAlign): seeds
800-811 (about 1,100 cases, plain, ``--half`` and ``--grad``) found no jonnx bug, and two in the tool:
BatchNormalization-6's training formula in float64 flagged float32 engines on batches of two
nearly equal values (it trained in the input's type until jonnx's batch mean was corrected on
2026-12-07, and is float64 again), and long recurrences with unbounded
activations, gates below 0 or recurrent weights of large gain grew or went chaotic, where
float32 engines part from each other (long sequences draw bounded activations and gates
within [0, 1], long states smaller weights). Large float16 outputs hold a few values within a
thousandth of a unit of a rounding midpoint, which float32 arithmetic cannot round reliably
either way; a result off only there is a ``near tie`` (:func:`settle_near_ties`), counted, not
printed. Seeds 820-828 (about 2,500 cases: every family with ``--long``, plain, ``--half``,
``--grad``, ``--vmap``, ``--opset 11`` and ``--lowering elsewhere``) found no jonnx bug; their
three findings were the tool's (Tanh gates over 16 steps, MeanVarianceNormalization without a
float64 reference, a float16 row under ``--vmap`` one unit off: :func:`one_unit_settled`), and
seeds 824 and 827 rerun after the fixes are clean. Since 2026-12-07 a fifth of the
normalizations that centre rows (``_CENTRED``) draw rows shifted by 1e3 to 3e6, whose float32
results are checked against a float64 run (:func:`widened_outputs`): their first run (seed
161020) found jonnx up to 0.18 off on rows near 3e6, centred on their mean rounded to float32
(ops/normalization.py ``centre`` puts that rounding back), and onnxruntime up to 2.9 off. Seed
161006 with ``--long`` found Resize's nearest modes reading a coordinate of exactly 0 as
1.1e-16 (ops/resize.py ``_snapped``).
"""

from __future__ import annotations

import argparse
import collections
import functools
import itertools
import math
import sys
import warnings
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

import jonnx
from tests.ops._harness import node_model

FLOATS = (np.float32, np.float64)
# --long: one axis of each shape that ``Draw.shape`` draws gets up to this many values (0: no
# long axis), and so may the lengths that families draw for themselves (``Draw.length``: the
# channels, maps, classes, sequences and signals). Short axes hide a half-precision sum
# rounded at each step; 40 values show it.
LONG_AXIS = 0
# The ai.onnx.ml ops' float types (no half types, whatever --half makes FLOATS).
ML_FLOATS = (np.float32, np.float64)
INTS = (np.int32, np.int64)


class Case(NamedTuple):
    op: str
    inputs: dict[str, Any]  # name -> array, or None for an omitted optional input
    attrs: dict[str, Any]
    n_outputs: int = 1
    constants: tuple[str, ...] = ()  # inputs that may become initializers
    domain: str = ""
    opset: int | None = None  # the default domain's opset, if not --opset (the domain's own, else)
    outer: tuple[str, ...] = ()  # graph inputs that only subgraphs read (If's branches), not the node


class Seq(NamedTuple):
    """A sequence input: its tensors' type and the tensors (``run`` builds it in the model)."""

    dtype: Any
    items: list


class Opt(NamedTuple):
    """An optional input: a tensor, a :class:`Seq`, or None for an empty one, of ``dtype``'s
    tensors or (``of_sequence``) sequences of them (``run`` builds it with an Optional node)."""

    dtype: Any
    value: Any
    of_sequence: bool = False


class Map(NamedTuple):
    """A map input, fed as a dict: its key and value types and the dict."""

    key: Any
    value: Any
    items: dict


STRUCTURES = (Seq, Opt, Map)  # inputs that are not tensors: built in the model or fed as they are


class Draw:
    """Random shapes, arrays and axes from one seeded generator."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)

    def pick(self, options):
        return options[int(self.rng.integers(len(options)))]

    def int(self, low: int, high: int) -> int:
        """An int in [low, high]."""
        return int(self.rng.integers(low, high + 1))

    def chance(self, p: float) -> bool:
        return bool(self.rng.random() < p)

    def shape(self, rank: int | None = None, empty: float = 0.25, most: int = 4) -> tuple[int, ...]:
        rank = self.int(0, 4) if rank is None else rank
        dims = [0 if self.chance(empty) else self.int(1, most) for _ in range(rank)]
        if LONG_AXIS and dims and self.chance(0.7):  # --long: one axis of many values
            dims[self.int(0, rank - 1)] = self.int(most + 1, LONG_AXIS)
        return tuple(dims)

    def length(self, low: int, high: int) -> int:
        """An axis length in [low, high]; under --long, sometimes up to ``LONG_AXIS`` (for the
        families that draw their own dimensions). Without --long it draws what ``int`` draws,
        so seeds keep their cases."""
        if LONG_AXIS and self.chance(0.4):
            return self.int(high + 1, max(high + 1, LONG_AXIS))
        return self.int(low, high)

    def partner(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """A shape that broadcasts against ``shape`` (a suffix, some dims 1)."""
        tail = shape[len(shape) - self.int(0, len(shape)) :]
        return tuple(1 if d and self.chance(0.3) else d for d in tail)

    def array(self, shape, dtype=np.float32) -> np.ndarray:
        dtype = np.dtype(dtype)
        if dtype.kind == "f":
            return self.rng.standard_normal(shape).astype(dtype)
        if dtype == np.bool_:
            return self.rng.random(shape) < 0.5
        low = -5 if dtype.kind == "i" else 0
        return self.rng.integers(low, 6, shape).astype(dtype)

    def axes(self, rank: int, count: int | None = None) -> list[int]:
        """Distinct axes, sorted, some written negative."""
        if rank == 0:
            return []
        count = self.int(0, rank) if count is None else count
        chosen = sorted(int(a) for a in self.rng.choice(rank, count, replace=False))
        return [a - rank if self.chance(0.3) else a for a in chosen]


# ------------------------------------------------------------------------------ families


def elementwise(d: Draw) -> Case | None:
    unary = ["Abs", "Neg", "Exp", "Log", "Sqrt", "Sigmoid", "Tanh", "Floor", "Ceil", "Sign", "Reciprocal"]
    unary += ["Softplus", "Erf", "Round", "Sin", "IsNaN", "HardSwish", "Mish", "Gelu", "Celu", "Elu", "Selu"]
    trig = ["Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh"]
    binary = ["Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Equal", "Less", "Greater", "Mod", "PRelu"]
    binary += ["LessOrEqual", "GreaterOrEqual"]
    bitwise = ["BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot"]
    op = d.pick(unary + trig + binary + bitwise + ["Where", "Clip", "BitShift", "And", "Or", "Xor", "Not", "Sum", "Mean"]
                + ["IsInf", "Shrink", "Swish", "SwiGLU"])  # fmt: skip
    s = d.shape()
    if op in LEGACY_BROADCAST and s and d.chance(0.25):
        return _legacy_binary(d, op, s)
    if op == "SwiGLU":  # opset 28: gate and value of one shape
        dtype = d.pick(FLOATS)
        attrs = {"alpha": d.pick([0.5, 1.0, 1.702])} if d.chance(0.6) else {}
        return Case(op, {"a": d.array(s, dtype), "b": d.array(s, dtype)}, attrs, opset=28)
    if op == "Swish":  # opset 24
        attrs = {"alpha": d.pick([0.5, 1.0, 1.702])} if d.chance(0.6) else {}
        return Case(op, {"x": d.array(s, d.pick(FLOATS))}, attrs, opset=24)
    if op in unary or op in trig:
        x = d.array(s, d.pick(FLOATS))
        if op in ("Asin", "Acos", "Atanh"):  # inside their domain, (-1, 1)
            x = (np.tanh(x) * 0.95).astype(x.dtype)
        elif op == "Acosh":
            x = (1 + np.abs(x)).astype(x.dtype)
        elif op == "Tan":  # away from the poles
            x = (np.tanh(x) * 1.4).astype(x.dtype)
        return Case(op, {"x": np.abs(x) if op in ("Log", "Sqrt") else x}, {})
    if op == "IsInf":
        x = d.array(s, d.pick(FLOATS))
        x[d.rng.random(s) < 0.3] = np.inf
        x[d.rng.random(s) < 0.2] = -np.inf
        x[d.rng.random(s) < 0.1] = np.nan
        flags = {"detect_positive": d.int(0, 1), "detect_negative": d.int(0, 1)} if d.chance(0.6) else {}
        return Case(op, {"x": x}, flags)
    if op == "Shrink":
        dtype = d.pick((*FLOATS, np.int32, np.int64, np.int8))
        attrs = {"lambd": d.pick([0.0, 0.5, 1.5]), "bias": d.pick([0.0, 0.5, 2.0])} if d.chance(0.7) else {}
        if np.dtype(dtype).kind == "i":
            attrs = {k: float(round(v)) for k, v in attrs.items()}  # whole numbers: exact in any type
        return Case(op, {"x": d.array(s, dtype)}, attrs)
    if op in bitwise:
        dtype = d.pick([np.int8, np.uint8, np.int16, np.int32, np.int64, np.uint32, np.uint64])
        info = np.iinfo(dtype)
        a = d.rng.integers(info.min, info.max, s, dtype=dtype, endpoint=True)
        if op == "BitwiseNot":
            return Case(op, {"x": a}, {})
        return Case(op, {"a": a, "b": d.rng.integers(info.min, info.max, d.partner(s), dtype=dtype, endpoint=True)}, {})
    if op == "Not":
        return Case(op, {"x": d.array(s, np.bool_)}, {})
    if op in ("And", "Or", "Xor"):
        return Case(op, {"a": d.array(s, np.bool_), "b": d.array(d.partner(s), np.bool_)}, {})
    if op == "BitShift":
        a, b = d.rng.integers(0, 100, s).astype(np.uint32), d.rng.integers(0, 4, d.partner(s)).astype(np.uint32)
        return Case(op, {"a": a, "b": b}, {"direction": d.pick(["LEFT", "RIGHT"])})
    if op == "Where":
        dtype = d.pick(FLOATS + INTS)
        return Case(
            op, {"c": d.array(d.partner(s), np.bool_), "a": d.array(s, dtype), "b": d.array(d.partner(s), dtype)}, {}
        )
    if op == "Clip":
        if d.chance(0.3):  # version 6: the bounds as attributes, floats only
            attrs = {k: v for k, v in (("min", -2.0), ("max", 3.0)) if d.chance(0.7)}
            return Case(op, {"x": d.array(s, d.pick(FLOATS))}, attrs, opset=6)
        dtype = d.pick((np.float32, *INTS))
        bounds = {
            "lo": np.array(-2, dtype) if d.chance(0.7) else None,
            "hi": np.array(3, dtype) if d.chance(0.7) else None,
        }
        return Case(op, {"x": d.array(s, dtype), **bounds}, {}, constants=("lo", "hi"))
    if op in ("Sum", "Mean"):
        return Case(op, {f"x{i}": d.array(d.partner(s) if i else s) for i in range(d.int(1, 3))}, {})
    integer = op in ("Add", "Sub", "Mul", "Div", "Max", "Min", "Equal", "Less", "Greater", "Mod", "Pow")
    integer = integer or op in ("LessOrEqual", "GreaterOrEqual")
    dtype = d.pick((*FLOATS, *INTS, np.int8, np.uint8)) if integer else d.pick(FLOATS)
    a, b = d.array(s, dtype), d.array(d.partner(s), dtype)
    if d.chance(0.5) and op != "PRelu":  # the broadcast partner on either side
        a, b = b, a
    attrs = {}
    if op in ("Div", "Mod") and np.dtype(dtype).kind in "iu":
        b = np.where(b == 0, 3, b).astype(dtype)  # no integer division by zero
    if op == "Mod":
        attrs["fmod"] = 1 if np.dtype(dtype).kind == "f" else d.int(0, 1)
        b = np.where(b == 0, 3, b).astype(dtype)
    if op == "Pow":
        a = (np.abs(a) + 1).astype(dtype) if np.dtype(dtype).kind == "f" else a
        b = (np.abs(b) % 3).astype(dtype)
    return Case(op, {"a": a, "b": b}, attrs)


# The binary ops' versions with a ``broadcast`` attribute (before numpy broadcasting, opset 7).
LEGACY_BROADCAST = {
    **dict.fromkeys(("Add", "Sub", "Mul", "Div"), (1, 6)),
    **dict.fromkeys(("Pow", "And", "Or", "Xor", "Equal", "Greater", "Less"), (1,)),
}


def _legacy_binary(d: Draw, op: str, s: tuple[int, ...]) -> Case:
    """Version 1 or 6 of a binary op: B of A's shape; or, with ``broadcast=1``, of one element,
    or A's dims from ``axis`` on for as many as B has (by default A's last ones). Version 1 of
    Add, Sub, Mul and Div also took ``consumed_inputs``, which changes nothing."""
    opset = d.pick(LEGACY_BROADCAST[op])
    if op in ("And", "Or", "Xor"):
        dtype = np.bool_
    elif op == "Equal":
        dtype = d.pick([np.bool_, np.int32, np.int64])
    else:
        dtype = d.pick((*FLOATS, np.float16, *((*INTS, np.uint32, np.uint64) if opset == 6 else ())))
    attrs = {}
    form = d.pick(["same", "one", "run"])
    if form == "same":
        b_shape = s
        if d.chance(0.5):
            attrs["broadcast"] = d.int(0, 1)
    elif form == "one":
        b_shape, attrs["broadcast"] = (1,) * d.int(0, len(s)), 1
    else:
        count = d.int(1, len(s))
        axis = d.int(0, len(s) - count)
        b_shape, attrs["broadcast"] = s[axis : axis + count], 1
        if axis + count < len(s) or d.chance(0.5):
            attrs["axis"] = axis
    if opset == 1 and op in ("Add", "Sub", "Mul", "Div") and d.chance(0.3):
        attrs["consumed_inputs"] = [0, 0]
    a, b = d.array(s, dtype), d.array(b_shape, dtype)
    if op == "Div" and np.dtype(dtype).kind in "iu":
        b = np.where(b == 0, 3, b).astype(dtype)
    if op == "Pow":
        a = (np.abs(a) + 1).astype(dtype)
        b = (np.abs(b) % 3).astype(dtype)
    return Case(op, {"a": a, "b": b}, attrs, opset=opset)


def reduce(d: Draw) -> Case | None:
    op = d.pick(["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2"]
                + ["ReduceLogSumExp", "ReduceSumSquare", "ReduceLogSum", "ArgMax", "ArgMin", "CumSum", "Softmax"]
                + ["LogSoftmax", "Hardmax", "CumProd", "GlobalLpPool"])  # fmt: skip
    s = d.shape()
    if op == "GlobalLpPool":  # here, not in conv_pool, whose seeds test_fuzz.py pins
        x = d.array((d.int(0, 2), d.int(1, 3), *(d.int(1, 4) for _ in range(d.int(1, 2)))))
        return Case(op, {"x": x}, {"p": d.int(1, 3)} if d.chance(0.7) else {})
    integer_ok = op in ("ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ArgMax", "ArgMin", "CumSum", "CumProd")
    x = d.array(s, d.pick(FLOATS + INTS) if integer_ok else d.pick(FLOATS))
    if op.startswith("Reduce"):
        x = np.abs(x) + 0.5 if op == "ReduceLogSum" else x
        attrs = {"keepdims": d.int(0, 1)}
        axes = d.axes(len(s))
        if d.chance(0.4):  # axes as an attribute, as before opset 18 (13 for ReduceSum); none: all
            opset = d.pick([1, 11] if op == "ReduceSum" else [1, 11, 13])
            if opset == 1:  # negative axes came with version 11
                axes = [a % len(s) for a in axes]
            return Case(op, {"x": x}, {**attrs, **({"axes": axes} if axes else {})}, opset=opset)
        if d.chance(0.2):
            attrs["noop_with_empty_axes"] = d.int(0, 1)
        inputs = {"x": x, "axes": np.array(axes, np.int64) if axes or d.chance(0.5) else None}
        return Case(op, inputs, attrs, constants=("axes",))
    if not s:
        return None
    axis = d.int(-len(s), len(s) - 1)
    if op in ("ArgMax", "ArgMin"):
        x = np.round(x).astype(x.dtype)  # ties, for select_last_index
        if d.chance(0.3):  # version 11: no select_last_index, the first of tied values
            return Case(op, {"x": x}, {"axis": axis, "keepdims": d.int(0, 1)}, opset=11)
        return Case(op, {"x": x}, {"axis": axis, "keepdims": d.int(0, 1), "select_last_index": d.int(0, 1)})
    if op in ("CumSum", "CumProd"):
        inputs = {"x": x, "axis": np.array(axis, np.int64)}
        attrs = {"exclusive": d.int(0, 1), "reverse": d.int(0, 1)}
        return Case(op, inputs, attrs, constants=("axis",), opset=26 if op == "CumProd" else None)
    # Softmax, LogSoftmax and Hardmax: version 11's form too (over the dimensions from the axis
    # on, the input read as a matrix), not only 13's (over the axis alone).
    return Case(op, {"x": x}, {"axis": axis}, opset=d.pick([None, 11]))


def shape_ops(d: Draw) -> Case | None:
    op = d.pick(["Transpose", "Concat", "Flatten", "Squeeze", "Unsqueeze", "Tile", "Expand", "Reshape", "Shape"]
                + ["Size", "Split", "Pad", "Trilu", "DepthToSpace", "SpaceToDepth", "Range", "ConstantOfShape"]
                + ["Slice", "Slice", "EyeLike", "CenterCropPad"])  # fmt: skip
    s = d.shape()
    r = len(s)
    x = d.array(s, d.pick(FLOATS + INTS))
    if op == "Transpose":
        return Case(op, {"x": x}, {"perm": [int(p) for p in d.rng.permutation(r)]}) if r else None
    if op == "Concat":
        if not r:
            return None
        axis = d.int(-r, r - 1)
        other = list(s)
        other[axis] = d.int(0, 2)
        return Case(op, {"a": x, "b": d.array(tuple(other), x.dtype)}, {"axis": axis})
    if op == "Flatten":
        return Case(op, {"x": x}, {"axis": d.int(-r, r)})
    if op == "Squeeze":
        axes = [a for a, n in enumerate(s) if n == 1 and d.chance(0.6)]
        if d.chance(0.3):  # version 11: axes as an attribute
            return Case(op, {"x": x}, {"axes": axes} if axes else {}, opset=11)
        return Case(op, {"x": x, "axes": np.array(axes, np.int64) if axes else None}, {}, constants=("axes",))
    if op == "Unsqueeze":
        k = d.int(1, 2)
        axes = d.axes(r + k, k)
        if d.chance(0.3):  # version 11: axes as an attribute
            return Case(op, {"x": x}, {"axes": axes}, opset=11)
        return Case(op, {"x": x, "axes": np.array(axes, np.int64)}, {}, constants=("axes",))
    if op == "Tile":
        return Case(op, {"x": x, "reps": d.rng.integers(0, 3, r).astype(np.int64)}, {}, constants=("reps",))
    if op == "Expand":
        target = [d.int(0, 2) if n == 1 else n for n in s]
        target = [d.int(1, 2) for _ in range(d.int(0, 1))] + target
        return Case(op, {"x": x, "shape": np.array(target, np.int64)}, {}, constants=("shape",))
    if op == "Reshape":
        n = int(np.prod(s))
        if n == 0:
            target, allowzero = ([0 if d.chance(0.5) else k for k in s] if d.chance(0.5) else [0]), d.int(0, 1)
        else:
            target, allowzero = ([n] if d.chance(0.5) else [-1, 1]), 0
        return Case(op, {"x": x, "shape": np.array(target, np.int64)}, {"allowzero": allowzero}, constants=("shape",))
    if op == "Shape":
        attrs = {"start": d.int(-r - 1, r + 1), "end": d.int(-r - 1, r + 1)} if d.chance(0.5) else {}
        return Case(op, {"x": x}, attrs)
    if op == "Size":
        return Case(op, {"x": x}, {})
    if op == "EyeLike":  # a 2-D input; the diagonal k anywhere, past the edges too; its type or another
        if r != 2:
            return None
        attrs = {"k": d.int(-s[0] - 1, s[1] + 1)} if d.chance(0.7) else {}
        if d.chance(0.5):
            attrs["dtype"] = d.pick([1, 6, 7, 9, 11])
        return Case(op, {"x": x}, attrs, opset=22)
    if op == "CenterCropPad":  # crops and pads at once, on every axis or the named ones
        if not r:
            return None
        axes = d.axes(r, d.int(1, r)) if d.chance(0.5) else None
        lengths = [d.int(0, 6) for _ in (axes if axes is not None else range(r))]
        attrs = {"axes": axes} if axes is not None else {}
        return Case(op, {"x": x, "shape": np.array(lengths, np.int64)}, attrs, constants=("shape",), opset=18)
    if op == "Slice":
        return _slice(d, x) if r else None
    if op == "Split":
        if not r:
            return None
        axis = d.int(-r, r - 1)
        if d.chance(0.3):  # version 11: the sizes as an attribute, or equal parts without it
            left = d.int(0, s[axis])
            if d.chance(0.5):
                return Case(op, {"x": x}, {"axis": axis, "split": [left, s[axis] - left]}, 2, opset=11)
            n = d.pick([k for k in (1, 2, 3) if s[axis] % k == 0])
            return Case(op, {"x": x}, {"axis": axis}, n, opset=11)
        if d.chance(0.5):
            left = d.int(0, s[axis])
            parts = [left, s[axis] - left]
            return Case(op, {"x": x, "split": np.array(parts, np.int64)}, {"axis": axis}, 2, ("split",))
        n = d.int(1, 3)
        return Case(op, {"x": x}, {"axis": axis, "num_outputs": n}, n) if s[axis] >= n else None
    if op == "Pad":
        mode = d.pick(["constant", "reflect", "edge", "wrap"])
        if mode != "constant" and 0 in s:
            return None
        pads = d.rng.integers(0, 3, 2 * r).astype(np.int64)
        if mode == "reflect" and any(p >= n for p, n in zip(pads, s + s)):
            return None
        if mode != "wrap" and x.dtype.kind == "f" and d.chance(0.3):  # version 2: attributes, floats only
            attrs = {"mode": mode, "pads": [int(p) for p in pads]}
            if mode == "constant" and d.chance(0.5):
                attrs["value"] = 2.0
            return Case(op, {"x": x}, attrs, opset=2)
        inputs = {"x": x, "pads": pads, "value": np.array(2, x.dtype) if mode == "constant" and d.chance(0.5) else None}
        return Case(op, inputs, {"mode": mode}, constants=("pads", "value"))
    if op == "Trilu":
        if r < 2:
            return None
        k = np.array(d.int(-4, 4), np.int64) if d.chance(0.7) else None
        return Case(op, {"x": x, "k": k}, {"upper": d.int(0, 1)}, constants=("k",))
    if op in ("DepthToSpace", "SpaceToDepth"):
        b = d.int(1, 2)
        if op == "DepthToSpace":
            image = d.array((d.int(0, 2), b * b * d.int(1, 2), d.int(0, 2), d.int(1, 2)), x.dtype)
            return Case(op, {"x": image}, {"blocksize": b, "mode": d.pick(["DCR", "CRD"])})
        return Case(op, {"x": d.array((d.int(0, 1), 2, 2 * b, 2 * b), x.dtype)}, {"blocksize": b})
    if op == "Range":
        dtype = d.pick(FLOATS + INTS)
        start, limit, delta = (np.array(v, dtype) for v in (d.int(-5, 5), d.int(-5, 5), d.pick([1, 2, -1, -3])))
        return Case(op, {"start": start, "limit": limit, "delta": delta}, {}, constants=("start", "limit", "delta"))
    return Case(op, {"shape": np.array(d.shape(), np.int64)}, {}, constants=("shape",))


def _slice(d: Draw, x: np.ndarray) -> Case:
    """Slice over some axes (negative, in any order, or all by default), with starts and ends
    negative, past either end and at the int64 extremes exporters write, and steps of either
    sign; as inputs (opset 10 on) or as opset 1's attributes (no steps)."""
    r = x.ndim
    axes = [int(a) for a in d.rng.permutation(r)[: d.int(1, r)]]
    axes = [a - r if d.chance(0.3) else a for a in axes]
    big = np.iinfo(np.int64)

    def bound(n: int) -> int:
        return d.pick([d.int(-n - 2, n + 2), d.int(-n - 2, n + 2), big.max, big.min, -1, 0])

    starts = [bound(x.shape[a]) for a in axes]
    ends = [bound(x.shape[a]) for a in axes]
    if d.chance(0.25):  # opset 1: attributes, step 1, every axis when `axes` is absent
        attrs = {"starts": starts, "ends": ends}
        if len(axes) < r or d.chance(0.5):
            attrs["axes"] = axes
        else:
            attrs["starts"] = [s for _, s in sorted(zip([a % r for a in axes], starts))]
            attrs["ends"] = [e for _, e in sorted(zip([a % r for a in axes], ends))]
        return Case("Slice", {"x": x}, attrs, opset=1)
    steps = [d.pick([1, 1, 2, 3, -1, -2]) for _ in axes]
    dtype = d.pick(INTS)
    limits = np.iinfo(dtype)  # int32 indices hold their own extremes
    inputs = {
        "x": x,
        "starts": np.clip(np.array(starts, np.int64), limits.min, limits.max).astype(dtype),
        "ends": np.clip(np.array(ends, np.int64), limits.min, limits.max).astype(dtype),
        "axes": np.array(axes, dtype) if d.chance(0.8) else None,
        "steps": np.array(steps, dtype) if d.chance(0.7) else None,
    }
    if inputs["axes"] is None:  # then starts and ends name axes 0, 1, ... in order
        k = len(axes)
        inputs["starts"], inputs["ends"] = inputs["starts"][:k], inputs["ends"][:k]
        if inputs["steps"] is not None:
            inputs["steps"] = inputs["steps"][:k]
    return Case("Slice", inputs, {}, constants=("starts", "ends", "axes", "steps"), opset=d.pick([10, 13]))


def indexing(d: Draw) -> Case | None:
    op = d.pick(["Gather", "GatherElements", "GatherND", "ScatterElements", "ScatterND", "TopK", "Compress"]
                + ["NonZero", "OneHot", "ReverseSequence", "Unique", "Scatter", "TensorScatter"])  # fmt: skip
    if op == "TensorScatter":
        return _tensor_scatter(d)
    s = d.shape(d.int(1, 4))
    r = len(s)
    x = d.array(s, d.pick(FLOATS + INTS))
    axis = d.int(-r, r - 1)
    n = s[axis]
    if op == "Gather":
        # An empty axis takes only empty indices (a scalar one is out of range: an error)
        index_shape = d.shape(d.int(0 if n else 1, 2), empty=1.0 if n == 0 else 0.25)
        indices = d.rng.integers(-n, n, index_shape).astype(d.pick(INTS)) if n else np.zeros(index_shape, np.int64)
        return Case(op, {"x": x, "i": indices}, {"axis": axis}, constants=("i",))
    if op == "GatherElements":
        index_shape = list(s)
        index_shape[axis] = d.int(0, 3) if n else 0
        indices = d.rng.integers(-n, n, index_shape).astype(np.int64) if n else np.zeros(index_shape, np.int64)
        return Case(op, {"x": x, "i": indices}, {"axis": axis})
    if op == "GatherND":
        batch = d.int(0, r - 1)
        k = d.int(1, r - batch)
        if 0 in s[batch : batch + k]:
            return None
        lead = tuple(s[:batch]) + d.shape(d.int(0, 1))
        indices = np.stack([d.rng.integers(-s[batch + j], s[batch + j], lead) for j in range(k)], -1)
        return Case(op, {"x": x, "i": indices.astype(np.int64)}, {"batch_dims": batch})
    if op in ("ScatterElements", "Scatter"):  # Scatter: opsets 9 and 10's ScatterElements
        if n == 0:
            return None
        index_shape = list(s)
        index_shape[axis] = d.int(0, n)
        reduction = d.pick(["none", "add", "mul", "max", "min"]) if op == "ScatterElements" else "none"
        if reduction == "none":  # no index twice along the axis: the result would depend on order
            picked = d.rng.permutation(n)[: index_shape[axis]]
            along = picked.reshape([-1 if a == axis % r else 1 for a in range(r)])
            indices = np.broadcast_to(along, index_shape).astype(np.int64)
        else:
            indices = d.rng.integers(-n, n, index_shape).astype(np.int64)
        updates = d.array(tuple(index_shape), x.dtype)
        if op == "Scatter":
            return Case(op, {"x": x, "i": indices, "u": updates}, {"axis": axis % r}, opset=d.pick([9, 10]))
        return Case(op, {"x": x, "i": indices, "u": updates}, {"axis": axis, "reduction": reduction})
    if op == "ScatterND":
        if 0 in s:
            return None
        k = d.int(1, r)
        every = list(itertools.product(*(range(m) for m in s[:k])))
        chosen = [every[i] for i in d.rng.permutation(len(every))[: d.int(0, 2)]]
        indices = np.array(chosen, np.int64).reshape(len(chosen), k)
        updates = d.array((len(chosen), *s[k:]), x.dtype)
        attrs = {"reduction": d.pick(["none", "add", "mul", "max", "min"])}
        return Case(op, {"x": x, "i": indices, "u": updates}, attrs)
    if op == "TopK":
        if d.chance(0.2):  # version 1: k as an attribute, the largest, sorted
            return Case(op, {"x": np.round(x).astype(x.dtype)}, {"axis": axis, "k": d.int(0, n)}, 2, opset=1)
        k = np.array([d.int(0, n)], np.int64)
        return Case(op, {"x": np.round(x).astype(x.dtype), "k": k}, {"axis": axis, "largest": d.int(0, 1)}, 2, ("k",))
    if op == "Compress":
        whole = d.chance(0.3)
        length = int(np.prod(s)) if whole else n
        condition = d.array((d.int(0, length),), np.bool_)
        return Case(op, {"x": x, "c": condition}, {} if whole else {"axis": axis}, constants=("c",))
    if op == "NonZero":
        return Case(op, {"x": x}, {})
    if op == "OneHot":
        indices = d.rng.integers(-4, 4, d.shape(d.int(0, 2))).astype(np.int64)
        inputs = {"i": indices, "depth": np.array(4, np.int64), "values": np.array([0, 1], x.dtype)}
        # Both versions: OneHot-9 gives negative indices all off, 11 counts them from the end.
        attrs = {"axis": d.int(-indices.ndim - 1, indices.ndim)}
        return Case(op, inputs, attrs, constants=("depth", "values"), opset=d.pick([9, 11]))
    if op == "ReverseSequence":
        if r < 2:
            return None
        batch_axis, time_axis = d.pick([(0, 1), (1, 0)])
        lengths = d.rng.integers(0, s[time_axis] + 1, s[batch_axis]).astype(np.int64)
        return Case(op, {"x": x, "lengths": lengths}, {"batch_axis": batch_axis, "time_axis": time_axis})
    if 0 in s:
        return None  # onnxruntime 1.32 aborts the process on Unique of an empty tensor with an axis
    values = d.rng.integers(0, 3, s).astype(d.pick((np.float32, np.int64)))
    return Case(op, {"x": values}, {"sorted": 1, **({"axis": axis} if d.chance(0.6) else {})}, 4)


def _tensor_scatter(d: Draw) -> Case:
    """TensorScatter (opset 24): a cache of rank 2-4 updated along an axis other than the
    batch's, linearly (the writes fit) or circularly (they wrap), with or without per-batch
    write positions."""
    rank = d.int(2, 4)
    axis = d.int(1, rank - 1)
    cache = [d.int(1, 3) for _ in range(rank)]
    cache[axis] = d.int(1, 5)
    update = list(cache)
    update[axis] = d.int(0, cache[axis])
    mode = d.pick(["linear", "circular"])
    room = cache[axis] - update[axis]  # linear writes must fit
    positions = d.rng.integers(0, room + 1 if mode == "linear" else 2 * cache[axis], cache[0]).astype(np.int64)
    dtype = d.pick(FLOATS + INTS)
    inputs = {"past": d.array(cache, dtype), "update": d.array(update, dtype), "positions": positions}
    if d.chance(0.3):
        inputs["positions"] = None  # zero for every batch
    attrs = {"mode": mode, "axis": axis - rank if d.chance(0.5) else axis}
    return Case("TensorScatter", inputs, attrs, constants=("positions",), opset=24)


def products(d: Draw) -> Case | None:
    dtype = d.pick(FLOATS)
    m, k, n = (d.int(0, 3) for _ in range(3))
    op = d.pick(["MatMul", "Gemm", "Einsum", "Det"])
    if op == "Det":  # batches of square matrices, empty batches and 0x0 matrices included
        size = d.int(0, 4)
        return Case(op, {"x": d.array((*d.shape(d.int(0, 2), empty=0.15), size, size), dtype)}, {}, opset=22)
    if op == "MatMul":
        batch = d.shape(d.int(0, 2), empty=0.2)
        a = d.array((*batch, m, k) if d.chance(0.7) else (k,), dtype)
        b = d.array((*d.partner(batch), k, n) if d.chance(0.7) else (k,), dtype)
        return Case(op, {"a": a, "b": b}, {}, constants=("b",))
    if op == "Gemm":
        ta, tb = d.int(0, 1), d.int(0, 1)
        inputs = {"a": d.array((k, m) if ta else (m, k), dtype), "b": d.array((n, k) if tb else (k, n), dtype)}
        inputs["c"] = d.array(d.partner((m, n)), dtype) if d.chance(0.7) else None
        attrs = {"transA": ta, "transB": tb, "alpha": d.pick([1.0, 0.5]), "beta": d.pick([1.0, 2.0])}
        if inputs["c"] is not None and d.chance(0.3):  # version 6: C required, broadcast by attribute
            full = inputs["c"].shape == (m, n)
            return Case(op, inputs, {**attrs, "broadcast": d.int(0, 1) if full else 1}, constants=("b", "c"), opset=6)
        return Case(op, inputs, attrs, constants=("b", "c"))
    equations = {
        "ij,jk->ik": [(m, k), (k, n)],
        "bij,bjk->bik": [(2, m, k), (2, k, n)],
        "ii->i": [(m, m)],
        "ij->": [(m, k)],
        "i,j->ij": [(m,), (n,)],
        "...ij,...jk->...ik": [(2, m, k), (k, n)],
        "ij,jk,kl->il": [(m, k), (k, n), (n, 2)],
        "iij->j": [(2, 2, k)],
    }
    equation = d.pick(list(equations))
    return Case(op, {f"x{i}": d.array(s, dtype) for i, s in enumerate(equations[equation])}, {"equation": equation})


def conv_pool(d: Draw) -> Case | None:
    op = d.pick(["Conv", "ConvTranspose", "MaxPool", "AveragePool", "LpPool", "GlobalAveragePool", "GlobalMaxPool"])
    c = d.length(1, 3)
    spatial = tuple(d.length(1, 6) for _ in range(d.int(1, 2)))
    x = d.array((d.int(0, 2), c, *spatial))
    kernel = [d.int(1, min(3, n)) for n in spatial]
    attrs: dict[str, Any] = {"strides": [d.int(1, 2) for _ in spatial]}
    if d.chance(0.5):
        attrs["auto_pad"] = d.pick(["SAME_UPPER", "SAME_LOWER", "VALID"])
    else:
        attrs["pads"] = [d.int(0, k - 1) for k in kernel] * 2
    if op.startswith("Global"):
        return Case(op, {"x": x}, {})
    if op in ("Conv", "ConvTranspose"):
        group = d.pick([1, c])
        m = d.int(1, 2) * group
        w_shape = (m, c // group, *kernel) if op == "Conv" else (c, m // group, *kernel)
        attrs.update(group=group, dilations=[d.int(1, 2) for _ in spatial])
        span = [(k - 1) * dil + 1 for k, dil in zip(kernel, attrs["dilations"])]
        if op == "Conv" and "pads" in attrs and any(w > n + 2 * p for w, n, p in zip(span, spatial, attrs["pads"])):
            return None  # a window larger than the padded input: an error everywhere
        inputs = {"x": x, "w": d.array(w_shape), "b": d.array((m,)) if d.chance(0.5) else None}
        return Case(op, inputs, attrs, constants=("w", "b"))
    attrs["kernel_shape"] = kernel
    if op != "LpPool" and d.chance(0.4):
        attrs["ceil_mode"] = 1
    if op == "AveragePool" and d.chance(0.5):
        attrs["count_include_pad"] = 1
    if op == "MaxPool" and d.chance(0.3):
        attrs["dilations"] = [d.int(1, 2) for _ in spatial]
    return Case(op, {"x": x}, attrs, 2 if op == "MaxPool" and d.chance(0.3) else 1)


def legacy(d: Draw) -> Case | None:
    """Versions before opset 7 (and Pad, Slice, Split, Clip, Tile before their inputs) in their
    own forms: attributes later versions made inputs, Upsample-1's two scales, LpPool-1's float
    ``p``, Concat-1's default axis, Tile-1's one axis. onnxruntime runs few of them; it runs the
    later version each is (:func:`later_twin`), which is the reference."""
    op = d.pick(["Upsample", "LpPool", "GlobalLpPool", "AveragePool", "Pad", "Slice", "Reshape"]
                + ["Split", "Clip", "Concat", "Tile"])  # fmt: skip
    dtype = d.pick(FLOATS)
    if op == "Upsample":
        mode = d.pick(["nearest", "bilinear"])
        if mode == "bilinear" and dtype == np.float16:
            # Weights of thirds and fifths put many float16 results on an exact tie, which
            # float32 arithmetic (jonnx's, onnxruntime's) breaks either way: one unit apart in
            # a tenth of the draws, each the correctly rounded one about as often (2026-12-05, seed 742).
            dtype = np.float32
        x = d.array((d.int(1, 2), d.int(1, 2), d.int(1, 4), d.int(1, 4)), dtype)
        scales = {"height_scale": d.pick([1.0, 2.0, 3.0, 1.5]), "width_scale": d.pick([1.0, 2.0, 2.5])}
        return Case(op, {"x": x}, {**scales, "mode": mode}, opset=1)
    if op in ("LpPool", "GlobalLpPool", "AveragePool"):
        spatial = tuple(d.int(1, 5) for _ in range(d.int(1, 2)))
        x = d.array((d.int(1, 2), d.int(1, 2), *spatial), dtype)
        attrs: dict[str, Any] = {} if op == "AveragePool" else {"p": d.pick([1.0, 2.0, 3.0])}
        if op != "GlobalLpPool":
            kernel = [d.int(1, n) for n in spatial]
            attrs.update(kernel_shape=kernel, strides=[d.int(1, 2) for _ in spatial])
            if d.chance(0.5):
                attrs["pads"] = [d.int(0, k - 1) for k in kernel] * 2
        return Case(op, {"x": x}, attrs, opset=1)
    x = d.array(tuple(d.int(1, 4) for _ in range(d.int(1, 3))), dtype)
    if op == "Pad":
        mode = d.pick(["constant", "reflect", "edge"])
        most = [n - 1 if mode == "reflect" else 2 for n in x.shape]  # a reflection stays inside
        pads = [d.int(0, m) for m in most] * 2
        version = d.pick([1, 2])
        attrs = {"paddings" if version == 1 else "pads": pads, "mode": mode, "value": d.pick([0.0, 1.5])}
        return Case(op, {"x": x}, attrs, opset=version)
    if op == "Slice":
        axes = d.axes(x.ndim, d.int(1, x.ndim))
        axes = [a % x.ndim for a in axes]  # version 1 takes axes from 0 on
        starts = [d.int(-x.shape[a] - 1, x.shape[a] + 1) for a in axes]
        ends = [d.pick([d.int(-x.shape[a] - 1, x.shape[a] + 1), 2**62]) for a in axes]
        attrs = {"starts": starts, "ends": ends} | ({"axes": axes} if d.chance(0.7) or len(axes) < x.ndim else {})
        if "axes" not in attrs:  # without axes: starts and ends for every axis
            attrs = {"starts": [d.int(0, n) for n in x.shape], "ends": [d.int(0, n + 1) for n in x.shape]}
        return Case(op, {"x": x}, attrs, opset=1)
    if op == "Reshape":
        target = [int(x.size)] if d.chance(0.3) else [*x.shape[:-1], -1]
        if len(target) > 1 and d.chance(0.5):
            target[0] = 0  # version 1: 0 keeps the input's dimension
        return Case(op, {"x": x}, {"shape": target}, opset=1)
    if op == "Split":
        axis = d.int(0, x.ndim - 1)
        parts = d.int(1, 3)
        attrs = {"axis": axis}
        if d.chance(0.6):
            cuts = sorted(d.int(0, x.shape[axis]) for _ in range(parts - 1))
            attrs["split"] = [b - a for a, b in zip([0, *cuts], [*cuts, x.shape[axis]])]
        elif x.shape[axis] % parts:
            parts = 1  # equal parts only where they divide the axis
        return Case(op, {"x": x}, attrs, parts, opset=d.pick([1, 2]))
    if op == "Clip":
        attrs = {k: v for k, v in (("min", d.pick([-0.5, None])), ("max", d.pick([0.7, None]))) if v is not None}
        return Case(op, {"x": x}, attrs, opset=d.pick([1, 6]))
    if op == "Concat":
        axis = d.int(0, x.ndim - 1) if x.ndim > 1 else 0
        others = [
            d.array(tuple(d.int(1, 3) if a == axis else n for a, n in enumerate(x.shape)), dtype)
            for _ in range(d.int(1, 2))
        ]
        inputs = {"x": x, **{f"x{i}": v for i, v in enumerate(others)}}
        # Version 1's axis is 1 by default (4 on: required).
        return Case(op, inputs, {} if axis == 1 and d.chance(0.5) else {"axis": axis}, opset=1)
    axis = d.int(0, x.ndim - 1)
    tiles = {"tiles": np.array(d.int(1, 3), np.int64), "axis": np.array(axis, np.int64)}
    return Case(op, {"x": x, **tiles}, {}, constants=("tiles", "axis"), opset=1)


def resize(d: Draw) -> Case | None:
    if d.chance(0.3):
        return _grid_sample(d)
    if d.chance(0.2):
        return _affine_grid(d) if d.chance(0.5) else _upsample(d)
    rank = d.int(3, 4)
    x = d.array((d.int(1, 2), d.int(1, 2), *(d.length(1, 5) for _ in range(rank - 2))))
    mode = d.pick(["nearest", "linear", "cubic"])
    ctm = d.pick(["half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel", "half_pixel_symmetric"])
    attrs: dict[str, Any] = {"mode": mode, "coordinate_transformation_mode": ctm}
    if mode == "nearest":
        attrs["nearest_mode"] = d.pick(["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"])
    else:
        attrs["antialias"] = int(d.chance(0.3))
    if mode == "cubic":
        attrs.update(cubic_coeff_a=d.pick([-0.75, -0.5]), exclude_outside=d.int(0, 1))
    inputs = {"x": x, "roi": None, "scales": None, "sizes": None}
    if d.chance(0.5):
        scales = [1.0, 1.0] + [d.pick([0.5, 0.6, 1.0, 1.5, 2.0, 3.0]) for _ in range(rank - 2)]
        inputs["scales"] = np.array(scales, np.float32)
    else:
        inputs["sizes"] = np.array([*x.shape[:2], *(d.int(1, 7) for _ in range(rank - 2))], np.int64)
        if d.chance(0.4):
            attrs.update(keep_aspect_ratio_policy=d.pick(["not_larger", "not_smaller"]), axes=list(range(2, rank)))
            inputs["sizes"] = inputs["sizes"][2:]
    return Case("Resize", inputs, attrs, constants=("scales", "sizes"))


def _affine_grid(d: Draw) -> Case:
    """AffineGrid (opset 20): 2-D and 3-D grids of any size, empty batches included."""
    rank = d.int(2, 3)
    n = d.int(0, 2)
    size = np.array([n, d.int(1, 3), *(d.int(1, 5) for _ in range(rank))], np.int64)
    theta = d.array((n, rank, rank + 1))
    return Case(
        "AffineGrid", {"theta": theta, "size": size}, {"align_corners": d.int(0, 1)}, constants=("size",), opset=20
    )


def _upsample(d: Draw) -> Case:
    """Upsample, opsets 7 (scales an attribute) and 9 (an input): nearest of any rank, linear of
    2-D images, scales at least 1 (it cannot shrink)."""
    opset = d.pick([7, 9])
    mode = d.pick(["nearest", "linear"])
    rank = 4 if mode == "linear" else d.int(1, 4)
    x = d.array(tuple(d.int(1, 3) for _ in range(rank)))
    scales = [d.pick([1.0, 1.5, 2.0, 3.0]) if mode == "nearest" or axis >= 2 else 1.0 for axis in range(rank)]
    if opset == 7:
        return Case("Upsample", {"x": x}, {"mode": mode, "scales": scales}, opset=7)
    return Case(
        "Upsample", {"x": x, "scales": np.array(scales, np.float32)}, {"mode": mode}, constants=("scales",), opset=9
    )


def _grid_sample(d: Draw) -> Case:
    """GridSample over 2-D images (opsets 16 and 20): every mode, padding mode and
    align_corners, grid points inside, on and past the borders."""
    opset = d.pick([16, 20])
    modes = ["bilinear", "nearest", "bicubic"] if opset == 16 else ["linear", "nearest", "cubic"]
    n, c = d.int(1, 2), d.int(1, 2)
    x = d.array((n, c, d.int(1, 5), d.int(1, 5)))
    grid = d.rng.uniform(-1.3, 1.3, (n, d.int(1, 4), d.int(1, 4), 2)).astype(np.float32)
    grid[d.rng.random(grid.shape) < 0.15] = d.pick([-1.0, 1.0, 0.0])  # exactly on a border or the centre
    attrs = {
        "mode": d.pick(modes),
        "padding_mode": d.pick(["zeros", "border", "reflection"]),
        "align_corners": d.int(0, 1),
    }
    return Case("GridSample", {"x": x, "grid": grid}, attrs, opset=opset)


def conv_variants(d: Draw) -> Case | None:
    """The convolution family's less common members: MaxUnpool, Col2Im, DeformConv and
    ConvInteger (kept out of ``conv_pool``, whose draws at seed 2026 a test pins)."""
    op = d.pick(["MaxUnpool", "Col2Im", "DeformConv", "ConvInteger"])
    if op == "MaxUnpool":
        return _max_unpool(d)
    if op == "Col2Im":
        return _col2im(d)
    if op == "DeformConv":
        return _deform_conv(d)
    c = d.int(1, 3)
    spatial = tuple(d.int(1, 5) for _ in range(d.int(1, 2)))
    kernel = [d.int(1, n) for n in spatial]
    group = d.pick([1, c])
    m = d.int(1, 2) * group
    qtype = d.pick([np.uint8, np.int8])  # onnxruntime's kernel: uint8 data, either weight type
    attrs = {"strides": [d.int(1, 2) for _ in spatial], "group": group, "dilations": [1 for _ in spatial]}
    if d.chance(0.5):
        attrs["pads"] = [d.int(0, k - 1) for k in kernel] * 2
    inputs = {
        "x": d.rng.integers(0, 256, (d.int(0, 2), c, *spatial)).astype(np.uint8),
        "w": d.array((m, c // group, *kernel), qtype) * 20,
        "x_zero_point": np.array(d.int(0, 255), np.uint8) if d.chance(0.6) else None,
        "w_zero_point": np.array(d.int(0, 5), qtype) if d.chance(0.4) else None,
    }
    if inputs["x_zero_point"] is None and inputs["w_zero_point"] is not None:
        inputs["x_zero_point"] = np.array(0, np.uint8)  # an omitted input cannot be followed by a given one
    return Case("ConvInteger", inputs, attrs, constants=("w", "x_zero_point", "w_zero_point"), opset=10)


def _max_unpool(d: Draw) -> Case:
    """MaxUnpool of windows that do not overlap (stride at least the kernel), each value sent
    to a cell of its window, as MaxPool's indices would (overlapping windows can send two
    values to one cell, whose order the specification leaves open); with an ``output_shape``
    larger than the inferred one at times."""
    rank = d.int(1, 2)
    n, c = d.int(1, 2), d.int(1, 2)
    kernel = [d.int(1, 3) for _ in range(rank)]
    strides = [k + d.int(0, 1) for k in kernel]
    pooled = [d.int(1, 3) for _ in range(rank)]
    pads = [0] * (2 * rank)
    if d.chance(0.3):
        pads = [d.int(0, k - 1) for k in kernel] + [0] * rank
    out = [(p - 1) * s - pads[i] - pads[rank + i] + k for i, (p, s, k) in enumerate(zip(pooled, strides, kernel))]
    cells = []
    for i in range(rank):  # per axis: each window's chosen cell, inside the output
        low = np.arange(pooled[i]) * strides[i] - pads[i]
        starts, stops = np.maximum(low, 0), np.minimum(low + kernel[i], out[i])
        cells.append(d.rng.integers(starts, np.maximum(stops, starts + 1)))
    grid = np.stack(np.meshgrid(*cells, indexing="ij"))  # (rank, *pooled)
    flat = np.ravel_multi_index(tuple(grid), out)
    plane = int(np.prod(out))
    offsets = np.arange(n * c).reshape(n, c, *([1] * rank)) * plane
    inputs = {"x": d.array((n, c, *pooled)), "i": (flat[None, None] + offsets).astype(np.int64), "output_shape": None}
    if d.chance(0.3):
        inputs["output_shape"] = np.array([n, c, *(o + d.int(0, 2) for o in out)], np.int64)
    attrs = {"kernel_shape": kernel, "strides": strides, "pads": pads}
    return Case("MaxUnpool", inputs, attrs, constants=("output_shape",), opset=d.pick([9, 11, 22]))


def _windows_along(spatial, kernel, strides, dilations, pads) -> list[int]:
    """How many windows fit along each axis (a convolution's output lengths; pads begins then ends)."""
    rank = len(spatial)
    return [
        (n + pads[i] + pads[rank + i] - dilations[i] * (kernel[i] - 1) - 1) // strides[i] + 1
        for i, n in enumerate(spatial)
    ]


def _col2im(d: Draw) -> Case:
    """Col2Im (opset 18) of 2-D images, with strides, dilations and padding."""
    image = [d.int(1, 5), d.int(1, 5)]
    block = [d.int(1, 3), d.int(1, 3)]
    dilations, strides = [d.int(1, 2), d.int(1, 2)], [d.int(1, 2), d.int(1, 2)]
    pads = [d.int(0, 1) for _ in range(4)]
    counts = _windows_along(image, block, strides, dilations, pads)
    if min(counts) < 1:
        return None
    c = d.int(1, 2)
    inputs = {
        "x": d.array((d.int(0, 2), c * block[0] * block[1], counts[0] * counts[1])),
        "image_shape": np.array(image, np.int64),
        "block_shape": np.array(block, np.int64),
    }
    attrs = {"dilations": dilations, "pads": pads, "strides": strides}
    return Case("Col2Im", inputs, attrs, constants=("image_shape", "block_shape"), opset=18)


def _deform_conv(d: Draw) -> Case | None:
    """DeformConv (opsets 19 and 22) of 2-D images: groups, offset groups, strides, dilations,
    padding, offsets reaching past the image, with and without a bias and a mask."""
    offset_group, group = d.int(1, 2), d.int(1, 2)
    c = int(np.lcm(offset_group, group)) * d.int(1, 2)  # both divide the channels
    h, w = d.int(1, 5), d.int(1, 5)
    kernel = [d.int(1, min(3, h)), d.int(1, min(3, w))]
    strides, dilations = [d.int(1, 2), d.int(1, 2)], [1, d.int(1, 2)]
    pads = [d.int(0, 1) for _ in range(4)]
    oh, ow = _windows_along([h, w], kernel, strides, dilations, pads)
    if oh < 1 or ow < 1:
        return None
    n, m, taps = d.int(0, 2), group * d.int(1, 2), kernel[0] * kernel[1]
    inputs = {
        "x": d.array((n, c, h, w)),
        "w": d.array((m, c // group, *kernel)),
        "offset": d.array((n, offset_group * 2 * taps, oh, ow)) * 1.5,
        "b": d.array((m,)) if d.chance(0.5) else None,
        "mask": d.rng.uniform(0, 1, (n, offset_group * taps, oh, ow)).astype(np.float32) if d.chance(0.5) else None,
    }
    if inputs["b"] is None and inputs["mask"] is not None:
        inputs["b"] = np.zeros(m, np.float32)
    attrs = {
        "kernel_shape": kernel,
        "strides": strides,
        "dilations": dilations,
        "pads": pads,
        "group": group,
        "offset_group": offset_group,
    }
    return Case("DeformConv", inputs, attrs, constants=("w", "b"), opset=d.pick([19, 22]))


def quantize(d: Draw) -> Case | None:
    op = d.pick(["QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "QLinearMatMul", "MatMulInteger"])
    s = d.shape(d.int(1, 3), empty=0.15)
    if op in ("QuantizeLinear", "DequantizeLinear"):
        qtype = d.pick([np.uint8, np.int8, np.uint16, np.int16])
        how = d.pick(["tensor", "axis", "block"])
        attrs: dict[str, Any] = {}
        scale_shape: tuple[int, ...] = ()
        if how != "tensor":
            attrs["axis"] = axis = d.int(-len(s), len(s) - 1)
            scale_shape = (s[axis],)
            if how == "block":
                attrs["block_size"] = block = d.int(1, 3)
                scale_shape = tuple(-(-n // block) if a == axis % len(s) else n for a, n in enumerate(s))
        scale = (np.abs(d.array(scale_shape)) + 0.05).astype(np.float32)
        zero_point = d.rng.integers(0, 5, scale_shape).astype(qtype) if d.chance(0.7) else None
        if op == "QuantizeLinear":
            x = d.array(s) * 50
        else:
            x = d.rng.integers(0, 100, s).astype(qtype)
        return Case(op, {"x": x, "scale": scale, "zero_point": zero_point}, attrs, constants=("scale", "zero_point"))
    if op == "DynamicQuantizeLinear":
        return Case(op, {"x": d.array(s) * d.pick([0.01, 1.0, 100.0])}, {}, 3)
    m, k, n = (d.int(1, 4) for _ in range(3))
    if op == "MatMulInteger":
        a, b = d.rng.integers(0, 100, (m, k)).astype(np.uint8), d.rng.integers(-50, 50, (k, n)).astype(np.int8)
        points = {"a_zero": np.uint8(3) if d.chance(0.5) else None, "b_zero": np.int8(-2) if d.chance(0.5) else None}
        return Case(op, {"a": a, "b": b, **points}, {}, constants=("b", "a_zero", "b_zero"))
    qtype = d.pick([np.uint8, np.int8])
    a, b = d.rng.integers(0, 100, (m, k)).astype(qtype), d.rng.integers(0, 100, (k, n)).astype(qtype)
    quant = {"a": a, "a_scale": np.float32(0.05), "a_zero": qtype(3), "b": b, "b_scale": np.float32(0.02)}
    quant.update(b_zero=qtype(5), y_scale=np.float32(0.7), y_zero=qtype(10))
    return Case(op, quant, {}, constants=tuple(name for name in quant if name != "a"))


# The normalizations that centre rows around their mean with the row-pivot sums of
# ops/normalization.py ``centre`` (BatchNormalization's training statistics are a plain mean
# corrected in the variance's pass, ``corrected_moments``: its training forms draw no offsets).
_CENTRED = ("GroupNormalization", "MeanVarianceNormalization", "InstanceNormalization", "LayerNormalization")


def normalization(d: Draw) -> Case | None:
    op = d.pick(["GroupNormalization", "MeanVarianceNormalization", "LpNormalization", "LRN"]
                + ["InstanceNormalization", "LayerNormalization", "BatchNormalization", "RMSNormalization"])  # fmt: skip
    c = 2 * d.length(1, 3)  # even: GroupNormalization draws two groups
    x = d.array((d.int(0, 2), c, *(d.length(1, 4) for _ in range(d.int(1, 2)))), d.pick(FLOATS))
    if op in _CENTRED and d.chance(0.2):
        # Rows whose mean dwarfs their spread: a float32 sum of them in order is off by its
        # rounding, where onnxruntime sums in double (ops/normalization.py ``centre``).
        x = (x + d.pick([1e3, 4.5e4, 3e6] if x.dtype == np.float32 else [1e2, 1e3])).astype(x.dtype)
    per_channel = {"scale": d.array((c,), x.dtype), "bias": d.array((c,), x.dtype)}
    if op == "GroupNormalization":  # opset 21: the scale and bias per channel (18: per group)
        attrs = {"num_groups": d.pick([1, 2])}
        return Case(op, {"x": x, **per_channel}, attrs, constants=("scale", "bias"), opset=21)
    if op == "MeanVarianceNormalization":
        return Case(op, {"x": x}, {"axes": sorted(d.axes(x.ndim, d.int(1, x.ndim)))})
    if op == "LpNormalization":
        return Case(op, {"x": x}, {"axis": d.int(-x.ndim, x.ndim - 1), "p": d.int(1, 2)})
    if op == "RMSNormalization":  # opset 23: the scale broadcasts against the normalized axes
        axis = d.int(-x.ndim, x.ndim - 1)
        normalized = x.shape[axis % x.ndim :]
        scale = d.array(d.partner(normalized), x.dtype)
        attrs = {"axis": axis, "epsilon": d.pick([1e-5, 1e-2])}
        if d.chance(0.3):
            attrs["stash_type"] = d.pick([1, 11])
        return Case(op, {"x": x, "scale": scale}, attrs, constants=("scale",), opset=23)
    if op == "LRN":
        return Case(op, {"x": x.astype(np.float32)}, {"size": d.pick([1, 3, 5]), "alpha": 0.001, "beta": 0.75})
    if op == "InstanceNormalization":
        return Case(op, {"x": x, **per_channel}, {}, constants=("scale", "bias"))
    if op == "LayerNormalization":
        if x.size == 0:
            return None  # onnxruntime 1.32 crashes (a segmentation fault) on an empty LayerNormalization
        axis = d.int(-x.ndim, x.ndim - 1)
        normalized = x.shape[axis % x.ndim :]
        inputs = {"x": x, "scale": d.array(normalized, x.dtype), "bias": d.array(normalized, x.dtype)}
        return Case(op, inputs, {"axis": axis}, constants=("scale", "bias"))
    return _batch_normalization(d, x, per_channel)


def _batch_normalization(d: Draw, x: np.ndarray, per_channel: dict[str, np.ndarray]) -> Case:
    """BatchNormalization in inference at every version: 6 (``is_test`` set), 7 (``spatial``, per
    channel by default), 9 and the --opset's (15 by default); in training (batch statistics, the
    running ones updated, as outputs 1 and 2) at 6 (``is_test=0``, by its formula), 14 and 15
    (``training_mode``); per activation (``spatial=0``, parameters of shape (C, D1, ...)) at 6
    and 7. Versions 7 and 9 train only with all five outputs, whose last one ONNX leaves open
    (onnxruntime's is an inverse standard deviation, jonnx's the variance): not drawn."""
    training, opset = d.chance(0.3), d.pick([None, 6, 7, 9])
    if training:
        opset = d.pick([6, 14, 15])
    spatial = opset not in (6, 7) or d.chance(0.7)
    params = per_channel if spatial else {k: d.array(x.shape[1:], x.dtype) for k in per_channel}
    shape = next(iter(params.values())).shape
    stats = {"mean": d.array(shape, x.dtype), "var": np.abs(d.array(shape, x.dtype))}
    attrs: dict[str, Any] = {} if spatial else {"spatial": 0}
    if opset == 6:
        attrs["is_test"] = int(not training)
    elif training:
        attrs["training_mode"] = 1
    if d.chance(0.3):
        attrs["epsilon"] = d.pick([1e-5, 1e-2])
    if training and d.chance(0.5):
        attrs["momentum"] = d.pick([0.9, 0.5])
    # ONNX's shape inference asks versions 14 on for all three outputs in training.
    n_outputs = (d.pick([1, 3]) if opset == 6 else 3) if training else 1
    inputs = {"x": x, **params, **stats}
    return Case("BatchNormalization", inputs, attrs, n_outputs, ("scale", "bias", "mean", "var"), opset=opset)


def loss(d: Draw) -> Case | None:
    """SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss (opsets 12 and 13): scores of
    rank 2 to 4, every reduction, class weights, an ignore_index that some labels hit (and
    may be negative), the log-probability output; what training-mode exports end in."""
    op = d.pick(["SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss"])
    batch, classes = d.int(1, 3), d.length(1, 4)
    extra = tuple(d.length(1, 3) for _ in range(d.int(0, 2)))
    scores = d.array((batch, classes, *extra), d.pick(FLOATS))
    labels = d.rng.integers(0, classes, (batch, *extra)).astype(d.pick(INTS))
    attrs: dict[str, Any] = {"reduction": d.pick(["none", "sum", "mean"])}
    if d.chance(0.4):
        ignore = d.pick([-1, -100, 0, classes - 1])
        attrs["ignore_index"] = ignore
        labels.flat[d.rng.random(labels.size) < 0.3] = ignore
    weights = np.abs(d.array((classes,), scores.dtype)) + 0.1 if d.chance(0.5) else None
    if op == "NegativeLogLikelihoodLoss":
        scores = np.log(np.abs(scores) / np.abs(scores).sum(1, keepdims=True)).astype(scores.dtype)
        return Case(op, {"input": scores, "target": labels, "weight": weights}, attrs, constants=("weight",),
                    opset=d.pick([12, 13]))  # fmt: skip
    n_outputs = d.int(1, 2)  # and the log-probabilities
    return Case(op, {"scores": scores, "labels": labels, "weights": weights}, attrs, n_outputs, ("weights",),
                opset=d.pick([12, 13]))  # fmt: skip


def detection(d: Draw) -> Case | None:
    """NonMaxSuppression (:func:`_non_max_suppression`), RoiAlign and MaxRoiPool (:func:`_roi`)."""
    return _non_max_suppression(d) if d.chance(0.4) else _roi(d)


def _roi(d: Draw) -> Case | None:
    """RoiAlign (opsets 10 and 16, both modes and coordinate modes, fixed or adaptive sample
    counts) and MaxRoiPool, on regions inside, across and outside the map, degenerate ones
    included, at several spatial scales; the regions as inputs (traced) or as constants."""
    n, c, h, w = d.int(1, 2), d.int(1, 3), d.length(1, 6), d.length(1, 6)
    x = d.array((n, c, h, w), d.pick(FLOATS))
    r = d.length(0, 4)
    scale = d.pick([1.0, 0.5, 2.0, 0.25])
    start = d.rng.uniform(-2, np.array([w, h]) / scale + 1, (r, 2))
    size = d.rng.uniform(0, 5, (r, 2)) * d.pick([1.0, 1.0, 0.2]) / scale
    size[d.rng.random((r, 2)) < 0.1] = 0  # degenerate: a line or a point
    corners = np.concatenate([start, start + size], 1)
    batch = d.rng.integers(0, n, r)
    if d.chance(0.3):
        x = x.astype(np.float32)  # onnxruntime's only MaxRoiPool kernel, the ReferenceEvaluator has none
        rois = np.concatenate([batch[:, None], np.round(corners)], 1).astype(x.dtype)
        attrs = {"pooled_shape": [d.int(1, 3), d.int(1, 3)], "spatial_scale": scale}
        return Case("MaxRoiPool", {"x": x, "rois": rois}, attrs, constants=("rois",))
    attrs = {
        "mode": d.pick(["avg", "max"]),
        "output_height": d.int(1, 3),
        "output_width": d.int(1, 3),
        "sampling_ratio": d.pick([0, 0, 1, 2, 3]),
        "spatial_scale": scale,
    }
    opset = d.pick([10, 16, 21])
    if opset >= 16 and d.chance(0.7):
        attrs["coordinate_transformation_mode"] = d.pick(["half_pixel", "output_half_pixel"])
    inputs = {"x": x, "rois": corners.astype(x.dtype), "batch_indices": batch.astype(np.int64)}
    return Case("RoiAlign", inputs, attrs, constants=("rois", "batch_indices"), opset=opset)


def _non_max_suppression(d: Draw) -> Case | None:
    """NonMaxSuppression: batches and classes, boxes as corners in either diagonal order or
    as centres, overlapping clusters, the limits given or omitted (as inputs or constants),
    negative and zero box counts; scores drawn continuous, so no ties decide the order."""
    batch, classes, n = d.int(1, 2), d.int(1, 3), d.length(0, 6)  # --long: dense clusters of boxes
    centre = d.int(0, 1)
    corners = d.rng.uniform(0, 4, (batch, n, 2)).astype(np.float32)
    sizes = d.rng.uniform(0.2, 2.5, (batch, n, 2)).astype(np.float32)
    if centre:
        boxes = np.concatenate([corners, sizes], -1)  # [x_centre, y_centre, width, height]
    else:
        far = corners + sizes
        flip = d.rng.random((batch, n, 1)) < 0.3  # the other diagonal: the specification allows either
        boxes = np.concatenate([np.where(flip, far, corners), np.where(flip, corners, far)], -1)
    scores = d.rng.random((batch, classes, n)).astype(np.float32)
    inputs: dict[str, Any] = {
        "boxes": boxes,
        "scores": scores,
        "max_output_boxes_per_class": np.array(d.pick([0, 1, 2, 5, 100]), np.int64) if d.chance(0.8) else None,
        "iou_threshold": np.array(d.pick([0.0, 0.3, 0.5, 0.9]), np.float32) if d.chance(0.8) else None,
        "score_threshold": np.array(d.pick([0.0, 0.2, 0.6]), np.float32) if d.chance(0.5) else None,
    }
    # Optional inputs are omitted only at the end: a later one given needs the earlier ones.
    names = list(inputs)
    last = max(i for i, k in enumerate(names) if inputs[k] is not None)
    for k in names[2:last]:
        if inputs[k] is None:
            inputs[k] = {"max_output_boxes_per_class": np.array(3, np.int64)}.get(k, np.array(0.5, np.float32))
    limits = ("max_output_boxes_per_class", "iou_threshold", "score_threshold")
    return Case("NonMaxSuppression", inputs, {"center_point_box": centre}, constants=limits)


# BitCast's pairs of types of one width (bool's byte is only 0 or 1: not drawn).
SAME_WIDTH = [
    (np.float32, np.int32), (np.float32, np.uint32), (np.int32, np.uint32), (np.float64, np.int64),
    (np.float64, np.uint64), (np.float16, np.int16), (np.float16, np.uint16), (np.int8, np.uint8),
]  # fmt: skip


def cast(d: Draw) -> Case | None:
    if d.chance(0.15):  # BitCast (opset 26): any bit pattern, NaNs and infinities included
        source, target = d.pick(SAME_WIDTH)[:: d.pick([1, -1])]
        bits = d.rng.integers(0, 256, (*d.shape(), np.dtype(source).itemsize), dtype=np.uint8)
        x = bits.view(source).reshape(bits.shape[:-1])
        return Case("BitCast", {"x": x}, {"to": onnx.helper.np_dtype_to_tensor_dtype(np.dtype(target))}, opset=26)
    source = d.pick([np.float32, np.float64, np.int32, np.int64, np.bool_, np.float16, np.uint8, np.int8])
    x = d.array(d.shape(), source)
    to = d.pick([1, 2, 3, 5, 6, 7, 9, 10, 11])
    if np.dtype(source).kind == "f":
        # In range of every integer target (out of range is undefined): |x| < 100, >= 0 for uint8.
        x = np.clip(x * 40, 0 if to == onnx.TensorProto.UINT8 else -99, 99).astype(source)
    if d.chance(0.25):  # CastLike: the type from a second input's, of any shape
        like = np.zeros(d.shape(d.int(0, 2)), onnx.helper.tensor_dtype_to_np_dtype(to))
        return Case("CastLike", {"x": x, "like": like}, {}, constants=("like",), opset=d.pick([15, 19, 21]))
    return Case("Cast", {"x": x}, {"to": to})


MS = "com.microsoft"
ACTIVATIONS = {  # FusedConv/FusedGemm activations and their float parameters
    "Relu": (),
    "Tanh": (),
    "Sigmoid": (),
    "LeakyRelu": (0.1,),
    "Clip": (-0.5, 0.7),
    "HardSigmoid": (0.2, 0.5),
}


def microsoft(d: Draw) -> Case | None:
    """onnxruntime's float contrib ops (com.microsoft, and the two it keeps in the default domain).
    BiasAdd, BiasSoftmax, BiasSplitGelu and GemmFastGelu have no CPU kernel to compare with."""
    op = d.pick(["Gelu", "BiasGelu", "FastGelu", "QuickGelu", "FusedConv", "FusedGemm", "FusedMatMul"]
                + ["TransposeMatMul", "Range", "GatherND", "Pad", "ExpandDims", "Inverse", "Trilu"]
                + ["LayerNormalization", "SimplifiedLayerNormalization", "SkipLayerNormalization"]
                + ["SkipSimplifiedLayerNormalization", "EmbedLayerNormalization"])  # fmt: skip
    c = d.int(1, 5)
    if op in ("Gelu", "QuickGelu"):
        attrs = {"alpha": d.pick([1.702, 0.5])} if op == "QuickGelu" and d.chance(0.5) else {}
        return Case(op, {"x": d.array((*d.shape(d.int(0, 3)), c))}, attrs, domain=MS)
    if op in ("BiasGelu", "FastGelu"):
        bias = d.array((c,)) if op == "BiasGelu" or d.chance(0.6) else None
        return Case(op, {"x": d.array((*d.shape(d.int(0, 2)), c)), "bias": bias}, {}, constants=("bias",), domain=MS)
    if op == "FusedConv":
        spatial = tuple(d.int(1, 5) for _ in range(d.int(1, 2)))
        kernel = [d.int(1, n) for n in spatial]
        group = d.pick([1, c])
        m = d.int(1, 2) * group
        activation = d.pick(list(ACTIVATIONS))
        attrs: dict[str, Any] = {"kernel_shape": kernel, "strides": [d.int(1, 2) for _ in spatial], "group": group}
        attrs.update(pads=[d.int(0, k - 1) for k in kernel] * 2, activation=activation)
        if ACTIVATIONS[activation]:
            attrs["activation_params"] = list(ACTIVATIONS[activation])
        inputs = {"x": d.array((d.int(0, 2), c, *spatial)), "w": d.array((m, c // group, *kernel))}
        inputs["b"] = d.array((m,)) if d.chance(0.6) else None
        return Case(op, inputs, attrs, constants=("w", "b"), domain=MS)
    if op == "FusedGemm":
        m, k, n = d.int(0, 3), d.int(1, 4), d.int(1, 4)
        ta, tb = d.int(0, 1), d.int(0, 1)
        inputs = {"a": d.array((k, m) if ta else (m, k)), "b": d.array((n, k) if tb else (k, n))}
        inputs["c"] = d.array(d.partner((m, n))) if d.chance(0.6) else None
        activation = d.pick([name for name in ACTIVATIONS if name != "Clip"])  # onnxruntime: "unknown kernel"
        attrs = {"transA": ta, "transB": tb, "alpha": d.pick([1.0, 0.5]), "beta": d.pick([1.0, 2.0])}
        attrs["activation"] = activation
        attrs.update(zip(("activation_alpha", "activation_beta"), ACTIVATIONS[activation]))
        return Case(op, inputs, attrs, constants=("b", "c"), domain=MS)
    if op in ("FusedMatMul", "TransposeMatMul"):
        m, k, n = d.int(0, 3), d.int(1, 3), d.int(1, 3)
        batch = d.shape(d.int(0, 2), empty=0.1, most=3)
        attrs = {"transA": d.int(0, 1), "transB": d.int(0, 1), "alpha": d.pick([1.0, 0.25])}
        if op == "FusedMatMul" and batch and d.chance(0.5):  # transBatch: the first dim moves behind the batch
            attrs.update(transBatchA=d.int(0, 1), transBatchB=d.int(0, 1))
        shapes = []
        for side, (rows, cols) in (("A", (m, k)), ("B", (k, n))):
            full = (*batch, *((cols, rows) if attrs[f"trans{side}"] else (rows, cols)))
            shapes.append((full[-2], *full[:-2], full[-1]) if attrs.get(f"transBatch{side}") else full)
        return Case(op, {"a": d.array(shapes[0]), "b": d.array(shapes[1])}, attrs, domain=MS)
    if op == "Range":
        dtype = d.pick((np.float32, np.int32, np.int64))
        inputs = {"start": np.array(d.int(-4, 4), dtype), "limit": np.array(d.int(-4, 6), dtype)}
        inputs["delta"] = np.array(d.pick([1, 2, -1]), dtype) if d.chance(0.6) else None
        return Case(op, inputs, {}, constants=tuple(inputs), domain=MS)
    if op == "GatherND":
        x = d.array((d.int(1, 3), d.int(1, 3), d.int(0, 2)))
        lead = d.shape(d.int(0, 2))
        indices = np.stack([d.rng.integers(0, x.shape[j], lead) for j in range(d.int(1, 2))], -1)
        return Case(op, {"x": x, "i": indices.astype(np.int64)}, {}, domain=MS)
    if op == "Pad":
        s = d.shape(d.int(1, 3), empty=0.15)
        mode = d.pick(["constant", "reflect", "edge"])
        if mode != "constant" and 0 in s:
            return None
        pads = d.rng.integers(0, 3, 2 * len(s)).astype(np.int64)
        if mode == "reflect" and any(p >= n for p, n in zip(pads, s + s)):
            return None
        value = np.array([1.5], np.float32) if mode == "constant" and d.chance(0.5) else None
        return Case(op, {"x": d.array(s), "pads": pads, "value": value}, {"mode": mode}, constants=("pads",), domain=MS)
    if op == "ExpandDims":
        s = d.shape()
        axis = np.array(d.int(-len(s) - 1, len(s)), np.int32)
        return Case(op, {"x": d.array(s), "axis": axis}, {}, constants=("axis",), domain=MS)
    if op == "Inverse":
        n = d.int(1, 4)
        x = d.array((*d.shape(d.int(0, 2), empty=0.1), n, n)) + 4 * np.eye(n, dtype=np.float32)
        return Case(op, {"x": x}, {}, domain=MS)
    if op == "Trilu":
        x = d.array((*d.shape(d.int(0, 1)), d.int(0, 4), d.int(0, 4)))
        k = np.array(d.int(-3, 3), np.int64) if d.chance(0.7) else None
        return Case(op, {"x": x, "k": k}, {"upper": d.int(0, 1)}, constants=("k",), domain=MS)
    hidden = d.int(1, 6)
    if op in ("LayerNormalization", "SimplifiedLayerNormalization"):  # default domain, as onnxruntime has them
        x = d.array((*d.shape(d.int(0, 2), empty=0.0), hidden))
        axis = d.int(-x.ndim, x.ndim - 1)
        normalized = x.shape[axis % x.ndim :]
        inputs = {"x": x, "scale": d.array(normalized)}
        if op == "LayerNormalization":
            inputs["bias"] = d.array(normalized) if d.chance(0.6) else None
        attrs = {"axis": axis, "epsilon": d.pick([1e-5, 1e-3])}
        return Case(op, inputs, attrs, 1, ("scale", "bias"), opset=d.pick([11, 13, 16]))
    n, s = d.int(1, 2), d.int(1, 3)
    if op in ("SkipLayerNormalization", "SkipSimplifiedLayerNormalization"):
        skip = d.array(d.pick([(n, s, hidden), (1, s, hidden), (s, hidden)]))
        inputs = {"x": d.array((n, s, hidden)), "skip": skip, "gamma": d.array((hidden,))}
        if op == "SkipLayerNormalization":
            inputs["beta"] = d.array((hidden,)) if d.chance(0.6) else None
        inputs["bias"] = d.array((hidden,)) if d.chance(0.6) else None
        attrs = {"epsilon": d.pick([1e-12, 1e-5])}
        return Case(op, inputs, attrs, d.pick([1, 4]), ("gamma", "beta", "bias"), domain=MS)
    vocab, positions, segments = d.int(2, 6), s + d.int(0, 2), 2
    inputs = {
        "ids": d.rng.integers(0, vocab, (n, s)).astype(np.int32),
        "segment_ids": d.rng.integers(0, segments, (n, s)).astype(np.int32) if d.chance(0.7) else None,
        "word": d.array((vocab, hidden)),
        "position": d.array((positions, hidden)),
    }
    inputs["segment"] = d.array((segments, hidden)) if inputs["segment_ids"] is not None else None
    inputs.update(gamma=d.array((hidden,)), beta=d.array((hidden,)))
    inputs["mask"] = (d.rng.random((n, s)) < 0.7).astype(np.int32) if d.chance(0.5) else None
    constants = ("word", "position", "segment", "gamma", "beta")
    return Case(op, inputs, {"epsilon": d.pick([1e-12, 1e-5])}, d.pick([2, 3]), constants, domain=MS)


def _qparams(d: Draw, qtype) -> tuple[np.ndarray, np.ndarray]:
    """A per-tensor scale and zero point for ``qtype``."""
    zero = d.int(0, 20) if np.dtype(qtype) == np.uint8 else d.int(-10, 10)
    # Not round numbers: with scales like 0.05 and 0.02 exact rounding ties are common, where
    # onnxruntime's integer kernels and jonnx's float arithmetic may round apart by one step.
    return np.array(d.rng.uniform(0.01, 0.15), np.float32), np.array(zero, qtype)


def microsoft_quantized(d: Draw) -> Case | None:
    """onnxruntime's quantized contrib ops (com.microsoft). MulInteger and QLinearReduceMean have
    no CPU kernel, and onnxruntime's own type inference refuses every ReduceSumInteger node."""
    op = d.pick(["MatMulNBits", "GatherBlockQuantized", "DynamicQuantizeMatMul", "MatMulIntegerToFloat"]
                + ["QLinearAdd", "QLinearMul", "QLinearSigmoid", "QLinearLeakyRelu", "QLinearGlobalAveragePool"]
                + ["QLinearConcat", "QLinearAveragePool", "QLinearSoftmax", "QLinearWhere", "QGemm", "QLinearConv"]
                + ["MatMulInteger16", "QuantizeLinear", "DequantizeLinear", "QEmbedLayerNormalization"])  # fmt: skip
    q = d.pick([np.uint8, np.int8])

    def qarray(shape, qtype=q):
        return (
            d.array(shape, np.int16).astype(qtype) * 9
            if np.dtype(qtype) == np.int8
            else d.rng.integers(0, 256, shape).astype(qtype)
        )

    if op == "MatMulNBits":
        bits, block = d.pick([4, 8]), d.pick([16, 32])
        n, k = d.int(1, 4), d.int(1, 3) * 16 + d.pick([0, 5])
        k_blocks = -(-k // block)
        b = d.rng.integers(0, 256, (n, k_blocks, block * bits // 8)).astype(np.uint8)
        scales = (np.abs(d.array((n * k_blocks,))) * 0.1 + 0.01).astype(np.float32)
        zero_points = None
        if d.chance(0.6):
            packed = -(-k_blocks * bits // 8)
            zero_points = d.rng.integers(0, 256, (n * packed,)).astype(np.uint8)
        inputs = {"a": d.array((*d.shape(d.int(0, 2)), k)), "b": b, "scales": scales, "zero_points": zero_points}
        inputs.update(g_idx=None, bias=d.array((n,)) if d.chance(0.5) else None)
        attrs = {"K": k, "N": n, "bits": bits, "block_size": block}
        return Case(op, inputs, attrs, constants=("b", "scales", "zero_points", "bias"), domain=MS)
    if op == "GatherBlockQuantized":
        rows, block = d.int(1, 4), d.pick([16, 32])
        columns = block * d.int(1, 2)
        data = d.rng.integers(0, 256, (rows, columns // 2)).astype(np.uint8)  # two 4-bit values a byte
        scales = (np.abs(d.array((rows, columns // block))) * 0.1 + 0.01).astype(np.float32)
        zero_points = (
            d.rng.integers(0, 256, (rows, -(-columns // block // 2))).astype(np.uint8) if d.chance(0.5) else None
        )
        indices = d.rng.integers(-rows, rows, d.shape(d.int(1, 2))).astype(d.pick(INTS))
        inputs = {"data": data, "indices": indices, "scales": scales, "zero_points": zero_points}
        attrs = {"block_size": block, "gather_axis": 0, "quantize_axis": 1, "bits": 4}
        return Case(op, inputs, attrs, constants=("data", "scales", "zero_points"), domain=MS)
    m, k, n = d.int(0, 3), d.int(1, 4), d.int(1, 4)
    if op in ("DynamicQuantizeMatMul", "MatMulIntegerToFloat"):
        per_column = d.chance(0.4)
        b_scale = (np.abs(d.array((n,) if per_column else ())) * 0.05 + 0.01).astype(np.float32)
        b_zero = (qarray((n,)) if per_column else qarray(())) if d.chance(0.5) else None
        bias = d.array((n,)) if d.chance(0.5) else None
        if op == "DynamicQuantizeMatMul":
            inputs = {"a": d.array((*d.shape(d.int(0, 1)), m, k)), "b": qarray((k, n)), "b_scale": b_scale}
            return Case(
                op,
                {**inputs, "b_zero": b_zero, "bias": bias},
                {},
                constants=("b", "b_scale", "b_zero", "bias"),
                domain=MS,
            )
        a_type = d.pick([np.uint8, np.int8])
        a_scale, a_zero = _qparams(d, a_type)
        inputs = {"a": qarray((*d.shape(d.int(0, 1)), m, k), a_type), "b": qarray((k, n)), "a_scale": a_scale}
        inputs.update(b_scale=b_scale, a_zero=a_zero if d.chance(0.6) else None, b_zero=b_zero, bias=bias)
        return Case(op, inputs, {}, constants=("b", "a_scale", "b_scale", "a_zero", "b_zero", "bias"), domain=MS)
    constants = ("x_scale", "x_zero", "a_scale", "a_zero", "b_scale", "b_zero", "y_scale", "y_zero")
    if op in ("QLinearAdd", "QLinearMul"):
        s = d.shape()
        a, b = qarray(s), qarray(d.partner(s))
        if d.chance(0.5):
            a, b = b, a
        inputs = {"a": a, **dict(zip(("a_scale", "a_zero"), _qparams(d, q)))}
        inputs.update(b=b, **dict(zip(("b_scale", "b_zero"), _qparams(d, q))))
        inputs.update(zip(("y_scale", "y_zero"), _qparams(d, q)))
        return Case(op, inputs, {}, constants=constants, domain=MS)
    x_params = dict(zip(("x_scale", "x_zero"), _qparams(d, q)))
    y_params = dict(zip(("y_scale", "y_zero"), _qparams(d, q)))
    if op in ("QLinearSigmoid", "QLinearLeakyRelu"):
        attrs = {"alpha": d.pick([0.1, 0.01])} if op == "QLinearLeakyRelu" else {}
        return Case(op, {"x": qarray(d.shape()), **x_params, **y_params}, attrs, constants=constants, domain=MS)
    if op in ("QLinearGlobalAveragePool", "QLinearAveragePool"):
        spatial = tuple(d.int(1, 5) for _ in range(d.int(1, 2)))
        channels_last = d.int(0, 1)
        shape = (d.int(1, 2), *spatial, d.int(1, 3)) if channels_last else (d.int(1, 2), d.int(1, 3), *spatial)
        attrs: dict[str, Any] = {"channels_last": channels_last}
        if op == "QLinearAveragePool":
            kernel = [d.int(1, s) for s in spatial]
            attrs.update(kernel_shape=kernel, strides=[d.int(1, 2) for _ in spatial])
            attrs.update(pads=[d.int(0, k - 1) for k in kernel] * 2, count_include_pad=d.int(0, 1))
        return Case(op, {"x": qarray(shape), **x_params, **y_params}, attrs, constants=constants, domain=MS)
    if op == "QLinearConcat":
        s = d.shape(d.int(1, 3))
        axis = d.int(-len(s), len(s) - 1)
        inputs: dict[str, Any] = dict(zip(("y_scale", "y_zero"), _qparams(d, q)))
        for i in range(d.int(1, 3)):
            part = list(s)
            part[axis] = d.int(0, 2)
            inputs[f"x{i}"] = qarray(tuple(part))
            inputs.update(zip((f"x{i}_scale", f"x{i}_zero"), _qparams(d, q)))
        return Case(op, inputs, {"axis": axis}, domain=MS)
    if op == "QLinearSoftmax":
        s = d.shape(d.int(1, 3), empty=0.1)
        opset = d.pick([11, 13])
        attrs = {"axis": d.int(-len(s), len(s) - 1), "opset": opset}
        y_params = {"y_scale": np.array(1 / 256, np.float32), "y_zero": np.array(0 if q == np.uint8 else -128, q)}
        return Case(op, {"x": qarray(s), **x_params, **y_params}, attrs, constants=constants, domain=MS)
    if op == "QLinearWhere":
        s = d.shape()
        inputs = {"c": d.array(d.partner(s), np.bool_), "x": qarray(s), **x_params}
        inputs.update(y=qarray(d.partner(s)), **y_params, **dict(zip(("z_scale", "z_zero"), _qparams(d, q))))
        return Case(op, inputs, {}, domain=MS)
    if op == "QGemm":
        ta, tb = d.int(0, 1), d.int(0, 1)
        inputs = {"a": qarray((k, m) if ta else (m, k)), **dict(zip(("a_scale", "a_zero"), _qparams(d, q)))}
        inputs.update(b=qarray((n, k) if tb else (k, n)), **dict(zip(("b_scale", "b_zero"), _qparams(d, q))))
        inputs["c"] = (
            d.rng.integers(-500, 500, d.pick([(n,), (m, n), (1, n)])).astype(np.int32) if d.chance(0.5) else None
        )
        requantize = d.chance(0.5)
        inputs.update(
            y_scale=y_params["y_scale"] if requantize else None, y_zero=y_params["y_zero"] if requantize else None
        )
        attrs = {"transA": ta, "transB": tb, "alpha": d.pick([1.0, 0.5])}
        return Case(op, inputs, attrs, constants=(*constants, "b", "c"), domain=MS)
    if op == "QLinearConv":
        spatial = tuple(d.int(1, 5) for _ in range(d.int(1, 2)))
        c = d.int(1, 3)
        group = d.pick([1, c])
        out = d.int(1, 2) * group
        kernel = [d.int(1, s) for s in spatial]
        channels_last = d.int(0, 1)
        shape = (d.int(1, 2), *spatial, c) if channels_last else (d.int(1, 2), c, *spatial)
        inputs = {"x": qarray(shape), **x_params, "w": qarray((out, c // group, *kernel), np.int8)}
        inputs.update(w_scale=np.array(0.03, np.float32), w_zero=np.array(0, np.int8), **y_params)
        inputs["b"] = d.rng.integers(-300, 300, (out,)).astype(np.int32) if d.chance(0.5) else None
        attrs = {"kernel_shape": kernel, "strides": [d.int(1, 2) for _ in spatial], "group": group}
        attrs.update(pads=[d.int(0, k - 1) for k in kernel] * 2, channels_last=channels_last)
        return Case(op, inputs, attrs, constants=(*constants, "w", "w_scale", "w_zero", "b"), domain=MS)
    if op == "MatMulInteger16":
        a = d.rng.integers(-3000, 3000, (m, k)).astype(np.int16)
        return Case(op, {"a": a, "b": d.rng.integers(-3000, 3000, (k, n)).astype(np.int16)}, {}, domain=MS)
    if op in ("QuantizeLinear", "DequantizeLinear"):
        s = d.shape(d.int(1, 3), empty=0.15)
        axis = d.int(-len(s), len(s) - 1)
        per_axis = d.chance(0.4)
        scale = (np.abs(d.array((s[axis],) if per_axis else ())) + 0.05).astype(np.float32)
        zero = qarray((s[axis],) if per_axis else ()) if d.chance(0.7) else None
        x = d.array(s) * 50 if op == "QuantizeLinear" else qarray(s)
        attrs = {"axis": axis} if per_axis or d.chance(0.3) else {}
        return Case(op, {"x": x, "scale": scale, "zero": zero}, attrs, constants=("scale", "zero"), domain=MS)
    batch, seq, hidden, vocab = d.int(1, 2), d.int(1, 3), d.int(1, 4), d.int(2, 5)
    segments = d.chance(0.6)
    inputs = {
        "ids": d.rng.integers(0, vocab, (batch, seq)).astype(np.int32),
        "segment_ids": d.rng.integers(0, 2, (batch, seq)).astype(np.int32) if segments else None,
        "word": qarray((vocab, hidden), np.uint8),
        "position": qarray((seq + 1, hidden), np.uint8),
        "segment": qarray((2, hidden), np.uint8) if segments else None,
        "gamma": qarray((hidden,), np.uint8),
        "beta": qarray((hidden,), np.uint8),
        "mask": (d.rng.random((batch, seq)) < 0.7).astype(np.int32) if d.chance(0.5) else None,
    }
    tables = ("word", "position", "segment", "gamma", "beta")
    inputs.update(
        {
            f"{t}_scale": np.array(0.01 * (i + 1), np.float32) if inputs[t] is not None else None
            for i, t in enumerate(tables)
        }
    )
    inputs.update({f"{t}_zero": np.array(d.int(100, 150), np.uint8) if inputs[t] is not None else None for t in tables})
    return Case(
        op,
        inputs,
        {"epsilon": d.pick([1e-12, 1e-5])},
        2,
        constants=tuple(n for n in inputs if n not in ("ids", "segment_ids", "mask")),
        domain=MS,
    )


def _rotary_cache(d: Draw, positions: int, half: int) -> tuple[np.ndarray, np.ndarray]:
    angles = d.rng.uniform(0, 3, (positions, half))
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def _lengths(d: Draw, batch: int, low: int, high: int) -> np.ndarray:
    return d.rng.integers(low, high + 1, batch).astype(np.int32)


def attention(d: Draw) -> Case | None:
    """onnxruntime's contrib attention ops (com.microsoft) and the default domain's Attention and
    RotaryEmbedding of opset 23, in float32 and small shapes. onnxruntime's CPU Attention kernel
    has no rotary embedding (``do_rotary``), no 4-D mask_index, and its MultiHeadAttention no
    packed Q/K/V or (2 * batch,) mask, so none is drawn; its GroupQueryAttention wants head
    sizes in multiples of 8 (16 with ``do_rotary``). Where a mask leaves a query row no key the
    result is unspecified or rounds apart, so every mask keeps each row's first key."""
    op = d.pick(["Attention", "MultiHeadAttention", "GroupQueryAttention", "RotaryEmbedding", "Attention-23"]
                + ["RotaryEmbedding-23"])  # fmt: skip
    b, s, n, h = d.int(1, 3), d.length(1, 5), d.int(1, 4), 2 * d.length(1, 4)
    past = d.length(1, 4) if d.chance(0.4) else 0
    total = past + s
    attrs: dict[str, Any] = {"scale": d.pick([0.5, 0.2])} if d.chance(0.25) and "Rotary" not in op else {}
    if op in ("Attention", "MultiHeadAttention"):
        attrs.update(num_heads=n, unidirectional=d.int(0, 1))
        if d.chance(0.25):
            attrs["mask_filter_value"] = d.pick([-1.0, -100.0])
        kv_len = s if past or op == "Attention" else d.int(1, 5)  # MultiHeadAttention: cross-attention too
        total = past + kv_len
        lengths = _lengths(d, b, 1, total)
        # Left padding under unidirectional would leave early queries only masked keys (see below).
        starts = np.minimum(_lengths(d, b, 0, total - 1), lengths - 1) * (1 - attrs["unidirectional"])
        offsets = np.arange(b + 1, dtype=np.int32)
        masks = {
            "none": None,
            "lengths": lengths,
            "raw": d.rng.random((b, total)) < 0.7,
            "3b+2": np.concatenate([lengths, offsets * s, offsets * total]),
        }
        if op == "Attention":
            masks.update(ends_starts=np.concatenate([lengths, starts]), raw3d=d.rng.random((b, s, total)) < 0.7)
        mask = masks[d.pick(list(masks))]
        if mask is not None and mask.ndim > 1:  # a row of masked keys only: every score is near
            mask[..., 0] = True  # mask_filter_value, where float32 sums round apart by 1e-3
        mask = mask.astype(np.int32) if mask is not None else None
        # onnxruntime: "Attention cannot have both past and attention_bias"
        with_bias = d.chance(0.3) and not (past and op == "Attention")
        attention_bias = d.array((d.pick([1, b]), d.pick([1, n]), s, total)) if with_bias else None
    if op == "Attention":
        d_in, hv = d.int(1, 6), h if past or d.chance(0.7) else 2 * d.int(1, 4)
        if hv != h or d.chance(0.2):
            attrs["qkv_hidden_sizes"] = [n * h, n * h, n * hv]
        width = n * (2 * h + hv)
        inputs = {"x": d.array((b, s, d_in)), "w": d.array((d_in, width)) * 0.5}
        inputs.update(bias=d.array((width,)) if d.chance(0.6) else None, mask=mask)
        inputs.update(past=d.array((2, b, n, past, h)) if past else None, attention_bias=attention_bias)
        n_out = 2 if past or (hv == h and d.chance(0.3)) else 1
        return Case(op, inputs, attrs, n_out, ("w", "bias"), domain=MS)
    if op == "MultiHeadAttention":
        bnsh = not past and d.chance(0.25)  # cross-attention K/V already split in heads
        hv = h if past or bnsh or d.chance(0.7) else 2 * d.int(1, 4)  # onnxruntime: one head size there
        inputs = {"q": d.array((b, s, n * h))}
        if bnsh:
            inputs.update(k=d.array((b, n, kv_len, h)), v=d.array((b, n, kv_len, hv)), bias=None)
        else:
            inputs.update(k=d.array((b, kv_len, n * h)), v=d.array((b, kv_len, n * hv)))
            inputs["bias"] = d.array((n * (2 * h + hv),)) if d.chance(0.4) else None
        inputs.update(mask=mask, attention_bias=attention_bias)
        if past:
            inputs.update(past_key=d.array((b, n, past, h)), past_value=d.array((b, n, past, hv)))
        return Case(op, inputs, attrs, 3 if past else d.pick([1, 3]), ("bias",), domain=MS)
    if op == "GroupQueryAttention":
        kv_heads = d.int(1, 2)
        attrs.update(num_heads=kv_heads * d.int(1, 2), kv_num_heads=kv_heads, do_rotary=int(d.chance(0.3)))
        n, h = attrs["num_heads"], 16 if attrs["do_rotary"] else 8
        if past and s > 1:
            b = 1  # onnxruntime takes one batch row only for a chunk with past
        if d.chance(0.3):
            attrs["local_window_size"] = d.int(1, 4)
        lengths = np.full(b, s, np.int32)
        if not past and "local_window_size" not in attrs and d.chance(0.3):
            # A right-padded prompt. A padding row's output is unspecified; outside the window
            # it has no key at all, and the engines' rows differ there: not drawn.
            lengths = _lengths(d, b, 1, s)
        elif past >= s and d.chance(0.5):  # onnxruntime: a static cache, no row longer than the past
            lengths = _lengths(d, b, s, past)
        elif past:  # or a growing one, past + sequence long
            lengths = _lengths(d, b, s, total)
            lengths[d.int(0, b - 1)] = total
        q, k, v = d.array((b, s, n * h)), d.array((b, s, kv_heads * h)), d.array((b, s, kv_heads * h))
        packed = d.chance(0.2)
        inputs = {"q": np.concatenate([q, k, v], -1) if packed else q, "k": None if packed else k}
        inputs["v"] = None if packed else v
        inputs.update({f"past_{x}": d.array((b, kv_heads, past, h)) if past else None for x in "kv"})
        total = max(int(lengths.max()), s)  # onnxruntime: no shorter than the prompt
        inputs.update(seqlens_k=lengths - 1, total=np.array(total, np.int32))
        cos, sin = _rotary_cache(d, total + 4, h // 2) if attrs["do_rotary"] else (None, None)
        inputs.update(cos=cos, sin=sin, position_ids=None)
        bias_shape = (d.pick([1, b]), d.pick([1, n]), s, total)
        inputs.update(attention_bias=d.array(bias_shape) if d.chance(0.15) else None)
        inputs["head_sink"] = d.array((n,)) if d.chance(0.15) else None
        if attrs["do_rotary"]:
            attrs["rotary_interleaved"] = d.int(0, 1)
        attrs.update({"softcap": d.pick([2.0, 5.0])} if d.chance(0.2) else {})
        attrs.update({"smooth_softmax": d.int(0, 1)} if d.chance(0.2) else {})
        return Case(op, inputs, attrs, 3, ("total", "cos", "sin", "head_sink"), domain=MS)
    if op == "RotaryEmbedding":
        rot = 2 * d.int(1, h // 2) if d.chance(0.3) else h
        attrs = {"interleaved": d.int(0, 1)}
        if rot != h or d.chance(0.3):
            attrs.update(rotary_embedding_dim=rot, num_heads=n)
        x = d.array((b, s, n * h) if d.chance(0.7) else (b, n, s, h))
        max_pos = s + d.int(0, 4)
        offset = np.array([d.int(0, max_pos - s)], np.int64)  # or the positions of each token:
        pos = offset if d.chance(0.3) else d.rng.integers(0, max_pos, (b, s)).astype(np.int64)
        cos, sin = _rotary_cache(d, max_pos, rot // 2)
        return Case(op, {"x": x, "pos": pos, "cos": cos, "sin": sin}, attrs, constants=("cos", "sin"), domain=MS)
    if op == "RotaryEmbedding-23":
        rot = 2 * d.int(1, h // 2) if d.chance(0.3) else h
        attrs = {"interleaved": d.int(0, 1), "rotary_embedding_dim": rot if rot != h or d.chance(0.3) else 0}
        x = d.array((b, n, s, h))
        if d.chance(0.5):
            x, attrs["num_heads"] = np.reshape(x.transpose(0, 2, 1, 3), (b, s, n * h)), n
        pos = d.rng.integers(0, s + 3, (b, s)).astype(np.int64) if d.chance(0.6) else None
        cos, sin = _rotary_cache(d, s + 3, rot // 2) if pos is not None else _rotary_cache(d, b * s, rot // 2)
        if pos is None:
            cos, sin = cos.reshape(b, s, -1), sin.reshape(b, s, -1)
        inputs = {"x": x, "cos": cos, "sin": sin, "pos": pos}
        return Case("RotaryEmbedding", inputs, attrs, constants=("cos", "sin", "pos"), opset=23)
    kv_heads = d.pick([k for k in range(1, n + 1) if n % k == 0])
    # With a past, onnxruntime aligns is_causal bottom-right where K/V's new length is not Q's
    # (the ReferenceEvaluator and jonnx top-left, after the past): not drawn.
    kv_len, hv = s if past or d.chance(0.5) else d.int(1, 5), h if d.chance(0.7) else 2 * d.int(1, 4)
    q, k, v = d.array((b, n, s, h)), d.array((b, kv_heads, kv_len, h)), d.array((b, kv_heads, kv_len, hv))
    if d.chance(0.5):
        q, k, v = (np.reshape(x.transpose(0, 2, 1, 3), (x.shape[0], x.shape[2], -1)) for x in (q, k, v))
        attrs.update(q_num_heads=n, kv_num_heads=kv_heads)
    total = past + kv_len
    mask_shape = d.pick([(s, total), (1, s, total), (d.pick([1, b]), d.pick([1, n]), s, total)])
    mask = d.pick([None, d.array(mask_shape), d.rng.random(mask_shape) < 0.7])  # none, float or bool
    if mask is not None and mask.dtype == np.bool_:
        mask[..., 0] = True  # (every key masked: zeros by the errata, not drawn)
    inputs = {"q": q, "k": k, "v": v, "mask": mask}
    if past:
        inputs.update(past_key=d.array((b, kv_heads, past, h)), past_value=d.array((b, kv_heads, past, hv)))
    attrs.update(is_causal=d.int(0, 1), **({"softcap": d.pick([2.0, 5.0])} if d.chance(0.2) else {}))
    n_out = d.pick([3, 4]) if past else d.pick([1, 4])  # onnxruntime: no past without the present
    if n_out == 4:
        attrs["qk_matmul_output_mode"] = d.int(0, 3)
    return Case("Attention", inputs, attrs, n_out, ("mask",), opset=23)


def loop(d: Draw) -> Case | None:
    """Loop (:func:`_loop`), Scan (:func:`_scan`) and If (:func:`_if`)."""
    pick = d.rng.random()
    if pick < 0.35:
        return _loop(d)
    return _loop_sequence(d) if pick < 0.5 else _scan(d) if pick < 0.75 else _if(d)


def _scan(d: Draw) -> Case:
    """A Scan (opsets 9-21) carrying one state over one scan input of 1-4 steps, each axis and
    direction of the scan input and output drawn."""
    dtype = d.pick(FLOATS)
    elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    k, steps = d.int(1, 3), d.int(1, 4)  # no empty scan: onnxruntime 1.32 dies of a floating point exception
    in_axis, out_axis = d.int(0, 1), d.int(0, 1)
    make = onnx.helper.make_node
    nodes = [
        make("Mul", ["x_t", "scale"], ["scaled"]),
        make(d.pick(["Tanh", "Neg", "Identity", "Sin"]), ["scaled"], ["stepped"]),
        make("Add", ["s_in", "stepped"], ["s_out"]),
        make(d.pick(["Mul", "Sub"]), ["s_out", "x_t"], ["y_t"]),
    ]
    info = onnx.helper.make_tensor_value_info
    body = onnx.helper.make_graph(
        nodes,
        "body",
        [info("s_in", elem, [k]), info("x_t", elem, [k])],
        [info("s_out", elem, [k]), info("y_t", elem, [k])],
        [onnx.helper.make_tensor("scale", elem, [], [d.pick([1.5, -0.7, 0.3])])],
    )
    attrs = {
        "body": body,
        "num_scan_inputs": 1,
        "scan_input_axes": [in_axis],
        "scan_output_axes": [out_axis],
        "scan_input_directions": [d.int(0, 1)],
        "scan_output_directions": [d.int(0, 1)],
    }
    inputs = {"s": d.array((k,), dtype), "x": d.array((steps, k) if in_axis == 0 else (k, steps), dtype)}
    return Case("Scan", inputs, attrs, 2, opset=d.pick([9, 11, 16, 19, 21]))


def _if(d: Draw) -> Case:
    """An If (opsets 11-21) whose branches read two outer tensors, broadcasting partners, and
    compute different functions of them; the condition fed or a constant."""
    dtype = d.pick(FLOATS)
    elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    x = d.array(d.shape(d.int(0, 3), empty=0.15), dtype)
    y = d.array(d.partner(x.shape), dtype)

    def branch(name: str, op: str) -> onnx.GraphProto:
        nodes = [onnx.helper.make_node(op, ["x", "y"], ["z"]), onnx.helper.make_node("Tanh", ["z"], [f"{name}_out"])]
        return onnx.helper.make_graph(nodes, name, [], [onnx.helper.make_tensor_value_info(f"{name}_out", elem, None)])

    attrs = {
        "then_branch": branch("then", d.pick(["Add", "Mul"])),
        "else_branch": branch("else", d.pick(["Sub", "Div"])),
    }
    inputs = {"cond": np.bool_(d.chance(0.5)), "x": x, "y": y}
    return Case("If", inputs, attrs, constants=("cond",), opset=d.pick([11, 13, 16, 19, 21]), outer=("x", "y"))


def _loop(d: Draw) -> Case | None:
    """A Loop of at most 12 iterations over a carried tensor ``h``, with an exit condition on
    ``h`` and a runtime ``limit`` (carried unchanged) and 0-2 scan outputs: where the exit is
    runtime data and the loop has scan outputs, ``Model(*inputs)`` runs it on the host."""
    dtype = d.pick(FLOATS)
    elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    h = d.array(d.shape(d.int(0, 2), empty=0.1), dtype)
    make = onnx.helper.make_node
    nodes = [
        make("Mul", ["h_in", "scale"], ["scaled"]),
        make(d.pick(["Tanh", "Abs", "Neg", "Identity"]), ["scaled"], ["stepped"]),
        make("Add", ["stepped", "h_in"], ["h_out"]),
        make(d.pick(["ReduceSum", "ReduceMax", "ReduceL1"]), ["h_out"], ["energy"], keepdims=0),
        make(d.pick(["Less", "Greater"]), ["energy", "limit_in"], ["c_out"]),
        make("Identity", ["limit_in"], ["limit_out"]),
        make("Identity", ["i"], ["i_row"]),
    ]
    # "i" straight from the body's input meets an onnxruntime bug (DEPARTURES); "i_row" not.
    scans = d.pick([[], ["h_out"], ["energy"], ["h_out", "i_row"], ["i"]])
    info = onnx.helper.make_tensor_value_info
    carried = [info("h_in", elem, h.shape), info("limit_in", elem, [])]
    body = _loop_body(nodes, carried, ["h_out", "limit_out", *scans], elem, d.pick([1.5, -1.3, 0.7, 2.0]))
    inputs = {
        "M": np.int64(d.int(0, 12)),
        "cond": None if d.chance(0.3) else np.bool_(d.chance(0.8)),
        "h": h,
        "limit": np.asarray(d.pick([-3.0, 0.0, 2.0, 10.0, 100.0]), dtype),
    }
    opset = d.pick([13, 16, 19, 21])
    return Case("Loop", inputs, {"body": body}, 2 + len(scans), ("M", "cond"), opset=opset)


def _loop_body(nodes, carried: list, outputs: list[str], elem: int, scale: float) -> onnx.GraphProto:
    """A Loop body reading the iteration number ``i``, the condition ``c_in`` and ``carried``,
    writing ``c_out`` and ``outputs``, with a scalar initializer ``scale``."""
    return onnx.helper.make_graph(
        nodes,
        "body",
        [
            onnx.helper.make_tensor_value_info("i", onnx.TensorProto.INT64, []),
            onnx.helper.make_tensor_value_info("c_in", onnx.TensorProto.BOOL, []),
            *carried,
        ],
        [onnx.helper.make_empty_tensor_value_info(n) for n in ["c_out", *outputs]],
        [onnx.helper.make_tensor("scale", elem, [], [scale])],
    )


def _loop_sequence(d: Draw) -> Case:
    """A Loop (opsets 13-21, which carry sequences) of 0-6 iterations that grows a carried
    sequence, empty or not at the start, by a tensor it computes: appended, put first, or
    appended after erasing the first; its length each iteration may be a scan output."""
    dtype = d.pick(FLOATS)
    elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    h = d.array(d.shape(d.int(0, 2), empty=0.1), dtype)
    start = Seq(dtype, [d.array(d.pick([h.shape, d.shape(d.int(0, 2))]), dtype) for _ in range(d.int(0, 3))])
    make = onnx.helper.make_node
    nodes = [
        make("Mul", ["h_in", "scale"], ["scaled"]),
        make(d.pick(["Tanh", "Neg", "Identity"]), ["scaled"], ["h_out"]),
    ]
    grow = d.pick(["append", "first", "erase first"] if start.items else ["append", "first"])
    if grow == "append":
        nodes.append(make("SequenceInsert", ["s_in", "h_out"], ["s_out"]))
    else:
        nodes.append(make("Constant", [], ["zero"], value=onnx.numpy_helper.from_array(np.array(0, np.int64))))
        if grow == "first":
            nodes.append(make("SequenceInsert", ["s_in", "h_out", "zero"], ["s_out"]))
        else:  # the sequence keeps its length: erase the first, then append
            nodes.append(make("SequenceErase", ["s_in", "zero"], ["s_kept"]))
            nodes.append(make("SequenceInsert", ["s_kept", "h_out"], ["s_out"]))
    nodes.append(make("Identity", ["c_in"], ["c_out"]))
    scans = d.pick([[], ["length"]])
    if scans:
        nodes.append(make("SequenceLength", ["s_out"], ["length"]))
    carried = [
        onnx.helper.make_tensor_value_info("h_in", elem, h.shape),
        onnx.helper.make_tensor_sequence_value_info("s_in", elem, None),
    ]
    body = _loop_body(nodes, carried, ["h_out", "s_out", *scans], elem, d.pick([1.5, -1.3, 0.7]))
    inputs = {"M": np.int64(d.int(0, 6)), "cond": None if d.chance(0.3) else np.bool_(True), "h": h, "s": start}
    return Case("Loop", inputs, {"body": body}, 2 + len(scans), ("M", "cond"), opset=d.pick([13, 16, 19, 21]))


# Activations the recurrent ops take, with whether each reads an alpha and a beta: an activation
# consumes the next alpha (beta) only if it takes one (onnxruntime's reading; the spec says "in
# order"), so the lists are drawn to match.
RECURRENT_ACTIVATIONS = {
    "Tanh": (False, False),
    "Sigmoid": (False, False),
    "Relu": (False, False),
    "Softsign": (False, False),
    "Softplus": (False, False),
    "LeakyRelu": (True, False),
    "ThresholdedRelu": (True, False),
    "Elu": (True, False),
    "HardSigmoid": (True, True),
    "ScaledTanh": (True, True),
    "Affine": (True, True),
}

BOUNDED_GATES = ["Sigmoid", "HardSigmoid", "Tanh", "Softsign"]
UNIT_GATES = ["Sigmoid", "HardSigmoid"]  # within [0, 1]


def recurrent(d: Draw) -> Case | None:
    """RNN, GRU or LSTM: one or two directions, with or without bias, initial states, sequence
    lengths, peepholes, clipping and other activations.

    onnxruntime runs these ops in float32 and layout 0 only (layout 1 as its time-major twin,
    :func:`time_major_twin`, since 2026-12-04); the ReferenceEvaluator's ignore ``clip``,
    ``sequence_lens``, ``input_forget`` and ``activations`` (checked 2026-12-02), so float64
    cases, which only it runs, draw none of those. onnxruntime's defaults
    for an activation's missing alpha or beta are 0 except LeakyRelu's, HardSigmoid's and
    Elu's; the specification's are the ONNX operators' (ThresholdedRelu's alpha 1.0, as in
    jonnx), and Affine and ScaledTanh are no operators any more: cases with any of those three
    give every alpha and beta.
    """
    op = d.pick(["RNN", "GRU", "LSTM"])
    gates = {"RNN": 1, "GRU": 3, "LSTM": 4}[op]
    direction = d.pick(["forward", "reverse", "bidirectional"])
    dirs = 2 if direction == "bidirectional" else 1
    seq, batch, size, hidden = d.length(1, 4), d.int(1, 3), d.length(1, 4), d.length(1, 4)
    # Empty sequences and batches where onnxruntime 1.32 survives them: it aborts the process
    # on a GRU with either and on an LSTM with an empty batch. After an empty sequence its
    # Y_h and Y_c are uninitialized memory (jonnx's are the initial state), so only Y is read.
    if op == "RNN" and d.chance(0.15):
        batch = 0
    empty_sequence = op != "GRU" and d.chance(0.1)
    if empty_sequence:
        seq = 0
    onnxruntime_runs = d.chance(0.7)
    layout = d.int(0, 1)  # onnxruntime runs layout 1 as its time-major twin (time_major_twin)
    dtype = np.float32 if onnxruntime_runs else d.pick(FLOATS)
    x = d.array((seq, batch, size) if layout == 0 else (batch, seq, size), dtype)
    inputs: dict[str, Any] = {
        "x": x,
        "w": d.array((dirs, gates * hidden, size), dtype) * 0.5,
        # Recurrent weights of gain about 0.5 sqrt(hidden), at most 1 for the short states; the
        # long ones of --long get 0.75, off the chaos of random networks of larger gain, where
        # float32 engines part from each other after a few steps.
        "r": d.array((dirs, gates * hidden, hidden), dtype) * (0.5 if hidden <= 4 else 0.75 / math.sqrt(hidden)),
        "b": d.array((dirs, 2 * gates * hidden), dtype) * 0.5 if d.chance(0.7) else None,
        "sequence_lens": None,
    }
    state = (dirs, batch, hidden) if layout == 0 else (batch, dirs, hidden)
    inputs["initial_h"] = d.array(state, dtype) if d.chance(0.5) else None
    if op == "LSTM":
        inputs["initial_c"] = d.array(state, dtype) if d.chance(0.5) else None
        inputs["p"] = d.array((dirs, 3 * hidden), dtype) * 0.5 if d.chance(0.3) else None
    attrs: dict[str, Any] = {"hidden_size": hidden, "direction": direction}
    if layout:
        attrs["layout"] = layout
    if onnxruntime_runs and seq and d.chance(0.4):
        inputs["sequence_lens"] = d.rng.integers(1, seq + 1, batch).astype(np.int32)
    if onnxruntime_runs and d.chance(0.3):
        attrs["clip"] = d.pick([0.5, 1.0, 3.0])
    if op == "GRU" and d.chance(0.5):
        attrs["linear_before_reset"] = 1
    if op == "LSTM" and onnxruntime_runs and d.chance(0.2):
        attrs["input_forget"] = 1
    if onnxruntime_runs and d.chance(0.4):
        # A gate (GRU's and LSTM's first activation) stays within [-1, 1]: an unbounded one
        # (Affine, Relu) grows the state geometrically until float32 overflows, where
        # onnxruntime's Softplus gives inf and jonnx's the finite value.
        # Over a long sequence (--long) every activation is bounded and the gates within [0, 1]:
        # an unbounded activation grows the state geometrically (an Elu after Softsign gates:
        # 1e29 after 52 steps), and a gate below 0 weighs the new state by up to 2, which
        # doubles rounding errors each step (a GRU with Tanh gates over 16 steps: float32
        # engines 1e-5 apart, each as far from float64).
        per_direction = {"RNN": 1, "GRU": 2, "LSTM": 3}[op]
        gates, others = (BOUNDED_GATES, list(RECURRENT_ACTIVATIONS)) if seq <= 4 else (UNIT_GATES, BOUNDED_GATES)
        names = [
            d.pick(gates if op != "RNN" and k % per_direction == 0 else others) for k in range(per_direction * dirs)
        ]
        attrs["activations"] = names
        if d.chance(0.5) or {"ThresholdedRelu", "Affine", "ScaledTanh"} & set(names):
            # No alpha equals a clip bound: ThresholdedRelu at x == alpha is x in the RNN
            # text (x >= alpha, jonnx) and 0 in the operator's and onnxruntime's (x > alpha).
            alphas = [d.pick([0.1, 0.7, 1.5]) for n in names if RECURRENT_ACTIVATIONS[n][0]]
            betas = [d.pick([0.0, 0.3, 0.5]) for n in names if RECURRENT_ACTIVATIONS[n][1]]
            attrs.update({k: v for k, v in (("activation_alpha", alphas), ("activation_beta", betas)) if v})
    # Trailing omitted inputs are left out (onnxruntime mishandles some written as "").
    while inputs and next(reversed(inputs.values())) is None:
        inputs.popitem()
    n_outputs = 1 if empty_sequence else d.int(1, 3 if op == "LSTM" else 2)
    opset = 14 if layout else d.pick([7, 14, 21])
    return Case(
        op, inputs, attrs, n_outputs, ("w", "r", "b", "sequence_lens", "initial_h", "initial_c", "p"), opset=opset
    )


ML = "ai.onnx.ml"
# Thresholds and, some of the time, inputs on one grid of halves, so that inputs meet
# thresholds exactly and each comparison mode's tie is exercised.
GRID = np.arange(-2.0, 2.5, 0.5)


def _tree_nodes(d: Draw, n_features: int, depth: int, modes: list[str]) -> list[dict]:
    """One random tree in preorder: each node a dict of mode, feature, threshold and children."""
    nodes: list[dict] = []

    def grow(level: int) -> int:
        k = len(nodes)
        nodes.append({})
        if level == depth or (level > 0 and d.chance(0.3)):
            nodes[k] = {"mode": "LEAF", "feature": 0, "value": 0.0, "true": 0, "false": 0}
            return k
        feature, value, mode = d.int(0, n_features - 1), float(d.pick(GRID)), d.pick(modes)
        true, false = grow(level + 1), grow(level + 1)
        nodes[k] = {"mode": mode, "feature": feature, "value": value, "true": true, "false": false}
        return k

    grow(0)
    return nodes


def _forest(
    d: Draw, n_features: int, n_targets: int, prefix: str, missing: bool, every_target: bool
) -> dict[str, list]:
    """TreeEnsembleRegressor/Classifier attributes of 1-4 random trees (``prefix``: target or
    class), each leaf weighting one or two targets, or all of them (``every_target``)."""
    keys = ["treeids", "nodeids", "modes", "featureids", "values", "truenodeids", "falsenodeids"]
    attrs: dict[str, list] = {f"nodes_{k}": [] for k in keys}
    attrs.update({f"{prefix}_{k}": [] for k in ("treeids", "nodeids", "ids", "weights")})
    if missing:
        attrs["nodes_missing_value_tracks_true"] = []
    modes = ["BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT"] + (
        ["BRANCH_EQ", "BRANCH_NEQ"] if d.chance(0.3) else []
    )
    for tree in range(d.int(1, 4)):
        for i, node in enumerate(_tree_nodes(d, n_features, d.int(0, 3), modes)):
            values = (tree, i, node["mode"], node["feature"], node["value"], node["true"], node["false"])
            for k, v in zip(keys, values):
                attrs[f"nodes_{k}"].append(v)
            if missing:
                attrs["nodes_missing_value_tracks_true"].append(d.int(0, 1))
            if node["mode"] == "LEAF":
                count = n_targets if every_target else min(n_targets, d.int(1, 2))
                for target in d.rng.choice(n_targets, size=count, replace=False):
                    for k, v in zip(("treeids", "nodeids", "ids"), (tree, i, int(target))):
                        attrs[f"{prefix}_{k}"].append(v)
                    attrs[f"{prefix}_weights"].append(float(d.pick([-1.5, -0.5, 0.25, 1.0, 2.0])))
    return attrs


def ml(d: Draw) -> Case | None:
    """ai.onnx.ml's tree ensembles and linear models: forests of random depth with every
    comparison mode, ties on the thresholds, missing values (NaN) on either branch, several
    targets or classes, base values, the NONE, SOFTMAX and LOGISTIC post transforms, and float
    or double inputs (onnxruntime runs no integer ones; the onnx reference keeps their type).

    Left out, where onnxruntime's behaviour is its own and the specification says nothing (jonnx
    follows the onnx reference implementation there): binary classifiers (onnxruntime derives
    a second score from one column of weights in several ways, depending on the signs of the
    weights and how many base values there are, and with two columns of weights labels its rows
    1 and 0 whatever the class labels), a post transform other than PROBIT on a one-target
    regressor (onnxruntime skips it), classifiers without base values (onnxruntime's label is
    the best of the classes that some leaf scored, jonnx's the best of all scores, the unscored
    ones 0) and, with base values or under MIN or MAX, targets that no leaf reached scores
    (onnxruntime leaves out such a target's base value, and its MIN or MAX is 0 where jonnx's
    and the onnx reference's is the float range's end): there every leaf scores every target.
    The post transforms are NONE, SOFTMAX and LOGISTIC: onnxruntime's SOFTMAX_ZERO ignores the
    base values and is NaN over all-zero scores, and PROBIT is NaN outside (0, 1), where the two
    pick different labels among NaN scores.
    """
    op = d.pick(["TreeEnsembleRegressor", "TreeEnsembleClassifier", "LinearRegressor", "LinearClassifier"])
    n_features, rows = d.int(1, 4), d.int(0, 6)
    dtype = d.pick(ML_FLOATS) if op.startswith("Tree") else np.float32
    on_grid = d.chance(0.5)
    x = GRID[d.rng.integers(len(GRID), size=(rows, n_features))] if on_grid else d.array((rows, n_features))
    x = x.astype(dtype)
    if d.chance(0.3):
        x[d.rng.random(x.shape) < 0.3] = np.nan
    classifier = op.endswith("Classifier")
    targets = d.int(3, 5) if classifier else d.int(1, 3)
    attrs: dict[str, Any] = {}
    if classifier:
        if d.chance(0.6):  # the attribute's name differs between the two classifiers
            ints = "classlabels_int64s" if op.startswith("Tree") else "classlabels_ints"
            attrs[ints] = list(range(10, 10 + targets))
        else:
            attrs["classlabels_strings"] = [f"c{k}" for k in range(targets)]
    post = d.pick(["NONE", "SOFTMAX", "LOGISTIC"])
    if not classifier and targets == 1:
        post = "NONE"
    if op.startswith("TreeEnsemble"):
        prefix = "class" if classifier else "target"
        aggregate = "SUM" if classifier else d.pick(["SUM", "AVERAGE", "MIN", "MAX"])
        base = classifier or d.chance(0.5)
        every_target = base or aggregate in ("MIN", "MAX")
        attrs.update(_forest(d, n_features, targets, prefix, d.chance(0.4), every_target))
        if not classifier:
            attrs.update(n_targets=targets, aggregate_function=aggregate)
        if base:
            attrs["base_values"] = [float(d.pick([-0.5, 0.0, 0.5])) for _ in range(targets)]
        opset = d.pick([1, 3])
    else:
        attrs["coefficients"] = [float(v) for v in GRID[d.rng.integers(len(GRID), size=targets * n_features)]]
        if classifier or d.chance(0.7):
            attrs["intercepts"] = [float(d.pick([-0.5, 0.0, 0.5])) for _ in range(targets)]
        if not classifier:
            attrs["targets"] = targets
        opset = 1
    if post != "NONE":
        attrs["post_transform"] = post
    return Case(op, {"x": x}, attrs, 2 if classifier else 1, domain=ML, opset=opset)


WORDS = ["a", "b", "c", "", "é", "ab"]  # short strings, one empty and one beyond ASCII


def _strings(d: Draw, shape) -> np.ndarray:
    return np.asarray(d.rng.choice(WORDS, size=shape), dtype=object)


def _label_encoder(d: Draw, x_kind: str) -> tuple[dict[str, Any], np.ndarray, int]:
    """LabelEncoder-2 or -4 attributes mapping ``x_kind`` keys to values of a random kind;
    returns them, the keys (the input is drawn among them and beside them) and the opset."""
    opset = d.pick([2, 4])
    y_kind = d.pick(["int", "float", "string"])
    n = d.int(1, 5)
    pools = {
        "int": lambda k: d.rng.choice(np.arange(-3, 4), size=k, replace=False).astype(np.int64),
        "float": lambda k: d.rng.choice(GRID, size=k, replace=False).astype(np.float32),
        "string": lambda k: np.asarray(d.rng.choice(WORDS, size=k, replace=False), dtype=object),
    }
    keys, values = pools[x_kind](n), pools[y_kind](n)
    if x_kind == "float" and d.chance(0.2):
        keys[0] = np.nan  # NaN keys match NaN inputs
    names = {"int": "int64s", "float": "floats", "string": "strings"}
    attrs: dict[str, Any] = {}
    if opset == 4 and d.chance(0.5):
        attrs["keys_tensor"] = onnx.numpy_helper.from_array(keys, "keys")
        attrs["values_tensor"] = onnx.numpy_helper.from_array(values, "values")
        if d.chance(0.5):
            attrs["default_tensor"] = onnx.numpy_helper.from_array(pools[y_kind](1), "default")
    else:
        attrs[f"keys_{names[x_kind]}"] = keys.tolist()
        attrs[f"values_{names[y_kind]}"] = values.tolist()
        if d.chance(0.5):
            default = {
                "int": ("default_int64", -7),
                "float": ("default_float", 9.5),
                "string": ("default_string", "zz"),
            }
            attrs[default[y_kind][0]] = default[y_kind][1]
    return attrs, keys, opset


def _svm_kernel(d: Draw) -> dict[str, Any]:
    return {
        "kernel_type": d.pick(["LINEAR", "POLY", "RBF", "SIGMOID"]),
        "kernel_params": [float(d.pick([0.1, 0.5, 1.0])), float(d.pick([0.0, 1.0])), float(d.int(1, 3))],
    }


def _svm_classifier(d: Draw, rows: int, features: int) -> Case:
    """SVMClassifier: one-vs-one over support vectors (votes, or libsvm's pairwise-coupled
    probabilities with ``prob_a``/``prob_b``) or a linear model, two to four classes."""
    classes = d.int(2, 4)
    attrs: dict[str, Any] = {}
    if d.chance(0.5):
        attrs["classlabels_ints"] = list(range(5, 5 + classes))
    else:
        attrs["classlabels_strings"] = [f"k{k}" for k in range(classes)]
    pairs = classes * (classes - 1) // 2
    if d.chance(0.8):
        per_class = [d.int(1, 2) for _ in range(classes)]
        n = sum(per_class)
        attrs.update(
            vectors_per_class=per_class,
            support_vectors=d.array((n * features,)).tolist(),
            # Of both signs, as a trained SVC's dual coefficients are (they sum to zero):
            # onnxruntime labels a two-class model with all-positive ones by its own rule.
            coefficients=(np.abs(d.array(((classes - 1) * n,))) * np.resize([1, -1], (classes - 1) * n)).tolist(),
            rho=d.array((pairs,)).tolist(),
            **_svm_kernel(d),
        )
        if d.chance(0.5):
            attrs.update(prob_a=d.array((pairs,)).tolist(), prob_b=d.array((pairs,)).tolist())
    else:
        attrs.update(coefficients=d.array((classes * features,)).tolist(), rho=d.array((classes,)).tolist())
    return Case("SVMClassifier", {"x": d.array((rows, features))}, attrs, 2, domain=ML, opset=1)


def ml_encoders(d: Draw) -> Case | None:
    """ai.onnx.ml's feature transforms and label maps: Binarizer, Scaler, Normalizer, Imputer,
    ArrayFeatureExtractor, OneHotEncoder, LabelEncoder (opsets 1, 2 and 4, numeric and string
    keys and values, NaN and -0.0, defaults), CategoryMapper, FeatureVectorizer, and the
    SVMRegressor and SVMClassifier (every kernel, votes or probabilities), on float, double,
    integer and string inputs, with empty batches."""
    op = d.pick(
        [
            "Binarizer",
            "Scaler",
            "Normalizer",
            "Imputer",
            "ArrayFeatureExtractor",
            "OneHotEncoder",
            "LabelEncoder",
            "CategoryMapper",
            "FeatureVectorizer",
            "SVMRegressor",
            "SVMClassifier",
        ]
    )
    rows, features = d.int(0, 4), d.int(1, 4)
    on_grid = lambda shape, dtype: GRID[d.rng.integers(len(GRID), size=shape)].astype(dtype)  # noqa: E731
    if op == "Binarizer":
        x = on_grid((rows, features), d.pick(ML_FLOATS))
        return Case(op, {"x": x}, {"threshold": float(d.pick(GRID))}, domain=ML, opset=1)
    if op == "Scaler":
        x = d.array((rows, features), d.pick([np.float32, np.float64, np.int64, np.int32]))
        count = d.pick([1, features])
        attrs = {"offset": d.array((count,)).tolist(), "scale": d.array((count,)).tolist()}
        return Case(op, {"x": x}, attrs, domain=ML, opset=1)
    if op == "Normalizer":  # float32: the onnx reference keeps a double input's type
        norm = d.pick(["MAX", "L1", "L2"])
        # Under MAX a reference disagreement (the family's docstring), which only the onnx
        # reference, reading 2-D inputs only, can settle.
        x = on_grid((rows, features) if norm == "MAX" or d.chance(0.8) else (features,), np.float32)
        return Case(op, {"x": x}, {"norm": norm}, domain=ML, opset=1)
    if op == "Imputer":
        count = d.pick([1, features])
        if d.chance(0.6):
            x = on_grid((rows, features), np.float32)
            replaced = float(d.pick(GRID)) if d.chance(0.4) else float("nan")
            x[d.rng.random(x.shape) < 0.3] = replaced
            attrs = {"imputed_value_floats": d.array((count,)).tolist(), "replaced_value_float": replaced}
        else:
            x = d.array((rows, features), np.int64)
            attrs = {"imputed_value_int64s": d.array((count,), np.int64).tolist(), "replaced_value_int64": d.int(-5, 5)}
        return Case(op, {"x": x}, attrs, domain=ML, opset=1)
    if op == "ArrayFeatureExtractor":
        shape = d.shape(d.int(1, 3), empty=0.1)[:-1] + (features,)
        kind = d.pick(["float", "int", "string"])
        x = {
            "float": lambda: d.array(shape),
            "int": lambda: d.array(shape, np.int64),
            "string": lambda: _strings(d, shape),
        }[kind]()
        y = d.rng.integers(0, features, size=d.int(1, 4)).astype(np.int64)
        return Case(op, {"x": x, "y": y}, {}, constants=("y",), domain=ML, opset=1)
    if op == "OneHotEncoder":
        zeros = d.int(0, 1)
        if d.chance(0.5):
            cats = sorted(int(v) for v in d.rng.choice(np.arange(-3, 4), size=d.int(1, 4), replace=False))
            pool = np.arange(-3, 4) if zeros else np.asarray(cats)
            x = d.rng.choice(pool, size=(rows, features)).astype(d.pick([np.int64, np.int32, np.float32, np.float64]))
            attrs = {"cats_int64s": cats}
        else:
            cats = [str(s) for s in d.rng.choice(WORDS, size=d.int(1, 4), replace=False)]
            x = np.asarray(d.rng.choice(WORDS if zeros else cats, size=(rows, features)), dtype=object)
            attrs = {"cats_strings": cats}
        return Case(op, {"x": x}, {**attrs, "zeros": zeros}, domain=ML, opset=1)
    if op == "CategoryMapper":
        count = d.int(1, 4)
        strings = [str(s) for s in d.rng.choice(WORDS, size=count, replace=False)]
        ints = [int(v) for v in d.rng.choice(np.arange(-3, 4), size=count, replace=False)]
        attrs = {"cats_strings": strings, "cats_int64s": ints}
        if d.chance(0.5):
            attrs.update(default_int64=-9, default_string="none")
        x = _strings(d, (rows, features)) if d.chance(0.5) else d.rng.integers(-3, 4, size=(rows, features))
        return Case(op, {"x": x}, attrs, domain=ML, opset=1)
    if op == "LabelEncoder":
        if d.chance(0.25):  # opset 1: strings to their class index, or indices to strings
            classes = [str(s) for s in d.rng.choice(WORDS, size=d.int(1, 4), replace=False)]
            attrs = {"classes_strings": classes}
            if d.chance(0.5):
                attrs.update(default_int64=-9, default_string="none")
            x = _strings(d, (rows, features)) if d.chance(0.5) else d.rng.integers(-1, 5, size=(rows, features))
            return Case(op, {"x": x}, attrs, domain=ML, opset=1)
        x_kind = d.pick(["int", "float", "string"])
        attrs, keys, opset = _label_encoder(d, x_kind)
        beside = {"int": np.arange(-4, 5), "float": GRID, "string": np.asarray(WORDS, object)}[x_kind]
        pool = np.concatenate([keys, beside]) if x_kind != "string" else np.asarray(list(keys) + list(beside), object)
        x = d.rng.choice(pool, size=(rows, features) if d.chance(0.8) else (features,))
        x = x.astype(object if x_kind == "string" else keys.dtype)
        if x_kind == "float" and d.chance(0.3):
            x[x == 0] = -0.0  # equal to a key of 0.0
        return Case(op, {"x": x}, attrs, domain=ML, opset=opset)
    if op == "FeatureVectorizer":  # onnxruntime aborts the process on an empty batch
        inputs, dims = {}, []
        dtype, rows = d.pick([np.float32, np.float64, np.int64, np.int32]), max(rows, 1)
        for k in range(d.int(1, 3)):
            # A vector is one row (the specification), so only beside other single rows.
            width = d.int(1, 3)
            inputs[f"x{k}"] = d.array((width,) if rows == 1 and d.chance(0.5) else (rows, width), dtype)
            dims.append(d.int(1, 4))
        return Case(op, inputs, {"inputdimensions": dims}, domain=ML, opset=1)
    if op == "SVMClassifier":
        return _svm_classifier(d, rows, features)
    # SVMRegressor: support vectors or a linear model, every kernel, one-class; float32, as
    # onnxruntime runs no other (and the onnx reference keeps a double input's type).
    x = d.array((rows, features))
    attrs: dict[str, Any] = {"rho": [float(d.pick([-0.5, 0.0, 0.5]))]}
    if d.chance(0.8):
        n = d.int(1, 4)
        attrs.update(
            n_supports=n,
            support_vectors=d.array((n * features,)).tolist(),
            coefficients=d.array((n,)).tolist(),
            **_svm_kernel(d),
        )
    else:
        attrs.update(coefficients=d.array((features,)).tolist())
    if d.chance(0.3):
        attrs["one_class"] = 1
    return Case(op, {"x": x}, attrs, domain=ML, opset=1)


def signal(d: Draw) -> Case | None:
    """DFT (opsets 17 and 20: the axis an attribute or an input), STFT and the window ops:
    real or complex signals with batch axes, transform lengths shorter or longer than the
    axis, forward or inverse, one-sided, frames with and without a window."""
    op = d.pick(["DFT", "DFT", "STFT", "HannWindow", "HammingWindow", "BlackmanWindow"])
    dtype = d.pick(FLOATS)
    if op.endswith("Window"):
        attrs = {"periodic": d.int(0, 1)}
        if d.chance(0.5):
            attrs["output_datatype"] = d.pick([1, 11])
        return Case(op, {"size": np.array(d.int(1, 9), np.int64)}, attrs, constants=("size",), opset=17)
    complex_ = d.chance(0.4)
    if op == "STFT":
        frame = d.int(2, 8)
        x = d.array((d.int(1, 2), d.length(frame, 20), 2 if complex_ else 1), dtype)
        inputs = {
            "x": x,
            "step": np.array(d.int(1, frame), np.int64),
            "window": None,
            "frame_length": np.array(frame, np.int64),
        }
        if d.chance(0.5):
            inputs["window"] = d.array((frame,), dtype)
            if d.chance(0.5):
                inputs["frame_length"] = None
        attrs = {"onesided": 0 if complex_ else d.int(0, 1)}
        return Case(op, inputs, attrs, constants=("step", "frame_length"), opset=17)
    rank = d.int(2, 4)  # the last axis holds the real and imaginary parts
    x = d.array((*(d.length(1, 6) for _ in range(rank - 1)), 2 if complex_ else 1), dtype)
    axis = d.int(0, rank - 2)
    attrs = {"inverse": d.int(0, 1), "onesided": 0 if complex_ else d.int(0, 1)}
    if attrs["inverse"] and attrs["onesided"]:
        attrs["onesided"] = 0  # an inverse transform of a real signal is not one-sided
    length = np.array(d.int(1, 8), np.int64) if d.chance(0.5) else None
    opset = d.pick([17, 20])
    if opset == 17:
        attrs["axis"] = axis
        inputs = {"x": x, "dft_length": length}
    else:
        written = axis - rank if d.chance(0.3) else axis
        inputs = {"x": x, "dft_length": length, "axis": np.array(written, np.int64)}
    return Case(op, inputs, attrs, constants=("dft_length", "axis"), opset=opset)


TEXT_WORDS = [
    "Apple",
    "apple",
    "APPLE",
    "b",
    "",
    "Éa",
    "éA",
    "straße",
    "a,b",
    "a,,b",
    " x  y ",
    "1.5",
    "-3",
    "tab\tsep",
]
REGEXES = [r"a.*", r"[A-Z][a-z]+", r"\d+(\.\d+)?", r"(?i)apple", r".*,.*", r"\w+", r"\s*\S+\s*", r"[^,]*", r"a|b|"]
REGEXES += [r"[[:alpha:]]+", r"[[:upper:]][[:lower:]]*", r".*\b.*", r"\W*\w+\W*", r"[\w,]*", r"\D+"]
# The Tokenizer's separators and token patterns: none matches an empty string, where
# onnxruntime's rule (the next character is swallowed) is tested apart.
SEPARATORS = [" ", ",", ",,", r"\s+", "[,;]", "a", r"\W"]
TOKENS = [r"\w+", r"[a-z]+", r"[[:alpha:]]+", r"\S+", r"\d+|[A-Z]", "."]


def text(d: Draw) -> Case | None:
    """The string ops: StringNormalizer (stopwords either case, case changes, [C] and [1, C]),
    StringConcat (broadcasting), StringSplit (whitespace, one- and two-character delimiters,
    maxsplit), RegexFullMatch (RE2 patterns, ASCII and POSIX classes among them),
    TfIdfVectorizer (string and integer pools, n-grams with skips, the three modes, weights)
    and onnxruntime's Tokenizer (separators, token patterns, characters, marks, mincharnum),
    on inputs with empty, accented and delimiter-only strings."""
    op = d.pick(["StringNormalizer", "StringConcat", "StringSplit", "RegexFullMatch", "TfIdfVectorizer", "Tokenizer"])
    words = np.asarray(TEXT_WORDS, object)

    def strings(shape):
        return np.asarray(d.rng.choice(words, size=shape), dtype=object)

    if op == "StringNormalizer":
        count = d.int(1, 5)
        x = strings((count,) if d.chance(0.5) else (1, count))
        # onnxruntime needs a locale the system has: its default, en_US.UTF-8, is often
        # missing (then it refuses the node), C.UTF-8 is not. jonnx ignores the attribute.
        attrs: dict[str, Any] = {"case_change_action": d.pick(["NONE", "LOWER", "UPPER"]), "locale": "C.UTF-8"}
        if d.chance(0.7):
            attrs["stopwords"] = [str(w) for w in d.rng.choice(words[:5], size=d.int(1, 3), replace=False)]
        if d.chance(0.5):
            attrs["is_case_sensitive"] = d.int(0, 1)
        return Case(op, {"x": x}, attrs, opset=10)
    if op == "StringConcat":
        shape = d.shape(d.int(0, 3), empty=0.15, most=3)
        return Case(op, {"x": strings(shape), "y": strings(d.partner(shape))}, {}, opset=20)
    if op == "StringSplit":
        attrs = {}
        if d.chance(0.7):
            attrs["delimiter"] = d.pick([",", ",,", " ", "a"])
        if d.chance(0.4):
            attrs["maxsplit"] = d.int(0, 2)
        return Case(op, {"x": strings(d.shape(d.int(0, 2), empty=0.15, most=3))}, attrs, n_outputs=2, opset=20)
    if op == "RegexFullMatch":
        x = strings(d.shape(d.int(0, 3), empty=0.15, most=3))
        return Case(op, {"x": x}, {"pattern": d.pick(REGEXES)}, opset=20)
    if op == "Tokenizer":  # onnxruntime's, which skl2onnx writes for its text vectorizers
        attrs = {"mark": d.int(0, 1), "pad_value": d.pick(["#", ""]), "mincharnum": d.int(1, 3)}
        if d.chance(0.15):
            attrs.update(d.pick([{"separators": [""]}, {"tokenexp": "."}]), mincharnum=1)
        elif d.chance(0.5):
            attrs["separators"] = [str(s) for s in d.rng.choice(SEPARATORS, size=d.int(1, 2), replace=False)]
        else:
            attrs["tokenexp"] = d.pick(TOKENS)
        x = strings(d.shape(d.int(1, 2), empty=0.15, most=3))
        return Case(op, {"x": x}, attrs, domain=MS, opset=1)
    # TfIdfVectorizer over a pool of 1- and 2-grams (3-grams some of the time).
    use_strings = d.chance(0.5)
    vocabulary = ["a", "b", "c", "d"] if use_strings else [1, 2, 3, 4]
    lengths = [1, 2, 3] if d.chance(0.3) else [1, 2]
    pool, counts = [], []
    for n in lengths:
        counts.append(len(pool))
        grams = {tuple(d.rng.choice(vocabulary, size=n)) for _ in range(d.int(1, 3))}
        for g in sorted(grams):
            pool.extend(g)
    n_grams = sum(
        ((counts[i + 1] if i + 1 < len(counts) else len(pool)) - counts[i]) // n for i, n in enumerate(lengths)
    )
    low = d.int(1, len(lengths))
    attrs = {
        "mode": d.pick(["TF", "IDF", "TFIDF"]),
        "min_gram_length": low,
        "max_gram_length": d.int(low, len(lengths)),
        "max_skip_count": d.int(0, 2),
        "ngram_counts": counts,
        "ngram_indexes": [int(i) for i in d.rng.permutation(n_grams)],
    }
    attrs["pool_strings" if use_strings else "pool_int64s"] = [str(v) if use_strings else int(v) for v in pool]
    if d.chance(0.5):
        attrs["weights"] = [float(d.pick([0.5, 1.0, 2.0])) for _ in range(n_grams)]
    shape = (d.int(1, 8),) if d.chance(0.5) else (d.int(1, 3), d.int(1, 8))
    tokens = list(vocabulary) + (["z"] if use_strings else [7])
    x = d.rng.choice(np.asarray(tokens, object if use_strings else np.int64), size=shape)
    if not use_strings:
        x = x.astype(d.pick([np.int32, np.int64]))
    return Case(op, {"x": x}, attrs, opset=9)


def sequence(d: Draw) -> Case | None:
    """The sequence ops: SequenceAt, SequenceInsert, SequenceErase, SequenceLength,
    ConcatFromSequence (new axis or not), SplitToSequence (sizes, one size, or one per
    element, keepdims) and SequenceMap (:func:`_sequence_map`), with positions negative and at
    the ends, empty sequences and empty tensors. A :class:`Seq` input is built in the model by
    SequenceConstruct (SequenceEmpty when it has no tensors)."""
    op = d.pick(
        [
            "SequenceAt",
            "SequenceInsert",
            "SequenceErase",
            "SequenceLength",
            "ConcatFromSequence",
            "SplitToSequence",
            "SequenceMap",
        ]
    )
    if op == "SequenceMap":
        return _sequence_map(d)
    dtype = d.pick([np.float32, np.int64])
    rank = d.int(1, 3)
    base = d.shape(rank, empty=0.15, most=3)
    if op == "SplitToSequence":
        x = d.array(base, dtype)
        axis = d.int(-rank, rank - 1)
        length = base[axis]
        inputs: dict[str, Any] = {"x": x, "split": None}
        attrs: dict[str, Any] = {"axis": axis}
        choice = d.int(0, 2)
        if choice == 0 and length:  # sizes summing to the axis
            cuts = sorted(int(c) for c in d.rng.integers(0, length + 1, size=d.int(0, 2)))
            inputs["split"] = np.diff([0, *cuts, length]).astype(np.int64)
        elif choice == 1 and length:  # one size: equal pieces, the last shorter
            inputs["split"] = np.array(d.int(1, length), np.int64)
        else:
            attrs["keepdims"] = d.int(0, 1)
        return Case(op, inputs, attrs, constants=("split",), opset=d.pick([11, 24]))
    # The sequence's tensors: one shape, or (for SequenceAt/Erase/Length/Insert) shapes that
    # differ along one axis as a ConcatFromSequence would take them.
    count = d.int(1 if op == "SequenceAt" else 0, 4)
    axis = d.int(0, rank - 1)
    tensors = []
    for _ in range(count):
        shape = list(base)
        if d.chance(0.5):
            shape[axis] = d.int(0, 3)
        tensors.append(d.array(tuple(shape), dtype))
    if op == "ConcatFromSequence":
        if not tensors:
            return None  # concatenating nothing has no shape
        new_axis = d.int(0, 1)
        if new_axis:  # stacked: every tensor of one shape
            tensors = [d.array(base, dtype) for _ in tensors]
            written = d.int(-rank - 1, rank)
        else:
            written = axis - rank if d.chance(0.3) else axis
        return Case(op, {"seq": Seq(dtype, tensors)}, {"axis": written, "new_axis": new_axis}, opset=11)
    position = None
    if op in ("SequenceAt", "SequenceErase", "SequenceInsert"):
        if op == "SequenceErase" and not count:
            return None  # erasing from an empty sequence is an error
        if op == "SequenceAt" or d.chance(0.7):
            high = count if op == "SequenceInsert" else count - 1
            position = np.array(d.int(-count, high), d.pick([np.int32, np.int64]))
    if op == "SequenceAt":
        return Case(op, {"seq": Seq(dtype, tensors), "position": position}, {}, constants=("position",), opset=11)
    if op == "SequenceLength":
        return Case(op, {"seq": Seq(dtype, tensors)}, {}, opset=11)
    if op == "SequenceErase":
        return Case(op, {"seq": Seq(dtype, tensors), "position": position}, {}, constants=("position",), opset=11)
    return Case(
        op,
        {"seq": Seq(dtype, tensors), "tensor": d.array(base, dtype), "position": position},
        {},
        constants=("position",),
        opset=11,
    )


def _body(nodes, inputs: list[tuple[str, Any]], outputs: list[tuple[str, Any]]) -> onnx.GraphProto:
    """A subgraph of ``nodes`` whose inputs and outputs are tensors of the given types, shapes
    left open (a SequenceMap body sees tensors of every shape in its sequences)."""

    def info(name, dtype):
        return onnx.helper.make_tensor_value_info(name, onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), None)

    return onnx.helper.make_graph(nodes, "body", [info(*i) for i in inputs], [info(*o) for o in outputs])


def _sequence_map(d: Draw) -> Case:
    """SequenceMap over one or two sequences of one length (tensors of differing shapes, or
    none), with a body of one or two outputs, and sometimes a tensor input that every iteration
    sees whole."""
    dtype = d.pick([np.float32, np.int64])
    count = d.int(0, 3)
    rank = d.int(0, 2)
    shapes = [d.shape(rank, empty=0.15, most=3) for _ in range(count)]
    inputs: dict[str, Any] = {"xs": Seq(dtype, [d.array(s, dtype) for s in shapes])}
    nodes, body_in, body_out = [], [("x", dtype)], []
    form = d.pick(["unary", "pair", "with_tensor"])
    if form == "pair":  # a second sequence, its tensors shaped as the first's
        inputs["ys"] = Seq(dtype, [d.array(s, dtype) for s in shapes])
        body_in.append(("y", dtype))
        nodes.append(onnx.helper.make_node(d.pick(["Add", "Mul", "Sub"]), ["x", "y"], ["z"]))
    elif form == "with_tensor":  # a tensor broadcast against every element (a scalar or a 1)
        inputs["t"] = d.array(d.pick([(), (1,)]), dtype)
        body_in.append(("t", dtype))
        nodes.append(onnx.helper.make_node(d.pick(["Add", "Mul", "Max"]), ["x", "t"], ["z"]))
    else:
        nodes.append(onnx.helper.make_node(d.pick(["Neg", "Identity", "Abs"]), ["x"], ["z"]))
    body_out.append(("z", dtype))
    n_outputs = 1
    if d.chance(0.5):  # a second output: each element's shape, or its sum
        if d.chance(0.5):
            nodes.append(onnx.helper.make_node("Shape", ["x"], ["w"]))
            body_out.append(("w", np.int64))
        else:
            nodes.append(onnx.helper.make_node("ReduceSum", ["x"], ["w"], keepdims=d.int(0, 1)))
            body_out.append(("w", dtype))
        n_outputs = 2
    return Case("SequenceMap", inputs, {"body": _body(nodes, body_in, body_out)}, n_outputs, opset=17)


def optional(d: Draw) -> Case | None:
    """Optional (of a tensor, of a sequence, or empty by its ``type``), OptionalHasElement and
    OptionalGetElement, on optionals built in the model (:class:`Opt`) and, from opset 18, on
    plain tensors and sequences."""
    op = d.pick(["Optional", "OptionalHasElement", "OptionalGetElement"])
    dtype = d.pick([np.float32, np.int64, np.bool_])
    tensor = d.array(d.shape(empty=0.2, most=3), dtype)
    kind = d.pick(["tensor", "sequence"])
    value = tensor if kind == "tensor" else Seq(dtype, [d.array(d.shape(2, most=3), dtype) for _ in range(d.int(0, 2))])
    if op == "Optional":
        if d.chance(0.3):  # empty, typed by the attribute
            elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
            tp = onnx.helper.make_tensor_type_proto(elem, None)
            if kind == "sequence":
                tp = onnx.helper.make_sequence_type_proto(tp)
            return Case(op, {}, {"type": tp}, opset=d.pick([15, 18]))
        return Case(op, {"x": value}, {}, opset=d.pick([15, 18]))
    opset = d.pick([15, 18])
    if opset == 18 and d.chance(0.4):  # a plain tensor or sequence, not wrapped
        return Case(op, {"x": value}, {}, opset=opset)
    if op == "OptionalGetElement" or d.chance(0.6):
        return Case(op, {"x": Opt(dtype, value)}, {}, opset=opset)
    return Case(op, {"x": Opt(dtype, None, of_sequence=kind == "sequence")}, {}, opset=opset)


def maps(d: Draw) -> Case | None:
    """ai.onnx.ml's map ops: DictVectorizer (string or int64 keys, keys outside the
    vocabulary), CastMap (DENSE and SPARSE, every cast) and ZipMap (string or int64 labels, a
    batch of one or more rows). Maps of float values only: onnxruntime's Python binding cannot
    feed the others (it reads every value as float; tests/ops/test_ml.py has them)."""
    op = d.pick(["DictVectorizer", "CastMap", "ZipMap"])
    if op == "ZipMap":
        rows, classes = d.int(1, 3), d.int(1, 4)
        x = d.array((rows, classes), np.float32)
        if d.chance(0.5):
            attrs = {"classlabels_strings": [f"c{i}" for i in d.rng.permutation(classes)]}
        else:
            attrs = {"classlabels_int64s": [int(v) for v in d.rng.choice(20, classes, replace=False) - 5]}
        return Case(op, {"x": x}, attrs, domain="ai.onnx.ml")
    if op == "CastMap":
        size = d.int(1, 4)  # onnxruntime refuses an empty map
        keys = sorted(int(k) for k in d.rng.choice(6, size, replace=False))
        values = [float(v) for v in d.array((size,), np.float32)]
        form = d.pick(["DENSE", "SPARSE"])
        attrs = {"cast_to": d.pick(["TO_FLOAT", "TO_INT64", "TO_STRING"]), "map_form": form}
        if form == "SPARSE":
            attrs["max_map"] = d.int(max(keys, default=-1) + 1, 7)
        return Case(op, {"x": Map(np.int64, np.float32, dict(zip(keys, values)))}, attrs, domain="ai.onnx.ml")
    key = d.pick([str, np.int64])
    vocabulary = (
        [f"k{i}" for i in range(d.int(1, 5))]
        if key is str
        else sorted(d.rng.choice(9, d.int(1, 5), replace=False).tolist())
    )
    candidates = list(vocabulary) + ([f"k{len(vocabulary)}"] if key is str else [99])  # one key outside
    chosen = [k for k in candidates if d.chance(0.6)] or [vocabulary[0]]  # onnxruntime refuses an empty map
    values = [float(v) for v in d.array((len(chosen),), np.float32)]
    attrs = {"string_vocabulary" if key is str else "int64_vocabulary": vocabulary}
    return Case(op, {"x": Map(key, np.float32, dict(zip(chosen, values)))}, attrs, domain="ai.onnx.ml")


FAMILIES: dict[str, Callable[[Draw], Case | None]] = {
    "detection": detection,
    "elementwise": elementwise,
    "reduce": reduce,
    "shape": shape_ops,
    "indexing": indexing,
    "products": products,
    "conv_pool": conv_pool,
    "conv_variants": conv_variants,
    "legacy": legacy,
    "resize": resize,
    "quantize": quantize,
    "normalization": normalization,
    "cast": cast,
    "microsoft": microsoft,
    "microsoft_quantized": microsoft_quantized,
    "attention": attention,
    "loop": loop,
    "loss": loss,
    "recurrent": recurrent,
    "ml": ml,
    "ml_encoders": ml_encoders,
    "maps": maps,
    "optional": optional,
    "sequence": sequence,
    "signal": signal,
    "text": text,
}


# ------------------------------------------------------------------------------ running


# The specification's formulas, in numpy, for cases that neither onnxruntime nor the
# ReferenceEvaluator runs, which would otherwise go unchecked: LRN on inputs of other than 4
# dimensions (both refuse them; ONNX defines LRN on (N, C, D1, ..., Dk)), MeanVarianceNormalization
# in float64 (onnxruntime has no kernel, the ReferenceEvaluator's function body mixes float32
# constants in), GroupNormalization of an empty batch (both reshape with a -1 there) and
# RMSNormalization of one with stash_type 11 (onnxruntime refuses the empty axis, the
# ReferenceEvaluator stash_type 11), RNN, GRU and LSTM over an empty sequence in float64
# (onnxruntime runs float32 only, the ReferenceEvaluator no empty sequence) and
# MatMulIntegerToFloat with types onnxruntime has no kernel for. Each returns its outputs in
# their ONNX types.


def _lrn_formula(x, *, size, alpha=1e-4, beta=0.75, bias=1.0, opset):
    """LRN: each channel over the sum of squares of the ``size`` channels around it, in
    float64, rounded once (onnxruntime computes float16 in float32 and rounds once)."""
    squares, channels = np.square(x.astype(np.float64)), x.shape[1]
    before, after = (size - 1) // 2, -(-(size - 1) // 2)
    sums = np.stack(
        [squares[:, max(0, c - before) : min(channels, c + after + 1)].sum(axis=1) for c in range(channels)], axis=1
    )
    return (x / (bias + alpha / size * sums) ** beta).astype(x.dtype)


def _mvn_formula(x, *, axes=(0, 2, 3), opset):
    """MeanVarianceNormalization's function body: (X - E[X]) / (sqrt(E[X^2] - E[X]^2) + 1e-9),
    half types in float32 and rounded once (the body adds a float32 epsilon to them: the
    ReferenceEvaluator refuses it, and 1e-9 is 0 in float16)."""
    wide = x.astype(np.promote_types(x.dtype, np.float32))
    mean = wide.mean(axis=tuple(axes), keepdims=True)
    variance = np.square(wide).mean(axis=tuple(axes), keepdims=True) - np.square(mean)
    return ((wide - mean) / (np.sqrt(variance) + wide.dtype.type(1e-9))).astype(x.dtype)


def _group_norm_formula(x, scale, bias, *, num_groups, epsilon=1e-5, stash_type=1, opset):
    """GroupNormalization: each group of channels normalized over its channels and map, then
    scaled per group (opset 18) or per channel (21). Computed in the input's type, whatever
    ``stash_type`` says: what reaches it is an empty batch, where no value is computed, or
    :func:`widened_outputs`' float64 (the ReferenceEvaluator computes the statistics in the
    stash type, float32 by default: 2.8 off on rows near 3e6)."""
    n, c = x.shape[:2]
    groups = x.reshape(n, num_groups, (c // num_groups) * int(np.prod(x.shape[2:], dtype=int)))
    mean = groups.mean(axis=-1, keepdims=True)
    normalized = (groups - mean) / np.sqrt(np.square(groups - mean).mean(axis=-1, keepdims=True) + epsilon)
    if opset < 21:
        return (normalized * scale[:, None] + bias[:, None]).reshape(x.shape).astype(x.dtype)
    per_channel = (-1, *(1,) * (x.ndim - 2))  # (C, 1, ...) against (N, C, ...)
    return (normalized.reshape(x.shape) * scale.reshape(per_channel) + bias.reshape(per_channel)).astype(x.dtype)


def _rms_norm_formula(x, scale, *, axis=-1, epsilon=1e-5, stash_type=1, opset):
    """RMSNormalization: X over the root mean square of the axes from ``axis`` on (plus epsilon),
    computed in float32 (``stash_type`` 1) or float64 (11), times the scale."""
    stash = np.float64 if stash_type == 11 else np.float32
    wide = x.astype(stash)
    axes = tuple(range(axis % x.ndim, x.ndim))
    rms = np.sqrt(np.square(wide).mean(axis=axes, keepdims=True) + stash(epsilon))
    return (wide / rms).astype(x.dtype) * scale


def _no_steps_formula(
    x, w, r, b=None, sequence_lens=None, initial_h=None, initial_c=None, p=None, *, states=1, **attrs
):
    """RNN, GRU or LSTM (``states=2``: the cell's too) over an empty sequence: an empty Y and the
    initial states (zeros where not given) as the last ones; None for a sequence of steps,
    which the references run."""
    layout, hidden = attrs.get("layout", 0), attrs["hidden_size"]
    batch, steps = (x.shape[1], x.shape[0]) if layout == 0 else (x.shape[0], x.shape[1])
    if steps:
        return None
    dirs = w.shape[0]
    y = np.zeros((0, dirs, batch, hidden) if layout == 0 else (batch, 0, dirs, hidden), x.dtype)
    state = (dirs, batch, hidden) if layout == 0 else (batch, dirs, hidden)
    last = [np.zeros(state, x.dtype) if s is None else s for s in (initial_h, initial_c)]
    return [y, *last[:states]]


def _matmul_integer_to_float_formula(a, b, a_scale, b_scale, a_zero=None, b_zero=None, bias=None, *, opset):
    """com.microsoft MatMulIntegerToFloat: the integer product of the zero-point-shifted inputs,
    exact in int64, times both scales (per tensor, or per column of B), plus the bias."""
    a_shifted = a.astype(np.int64) - (0 if a_zero is None else a_zero.astype(np.int64))
    b_shifted = b.astype(np.int64) - (0 if b_zero is None else b_zero.astype(np.int64))
    y = (a_shifted @ b_shifted).astype(a_scale.dtype) * (a_scale * b_scale)
    return y if bias is None else y + bias


def _legacy_binary_formula(fn, a, b, *, opset, broadcast=0, axis=None, consumed_inputs=None):
    """A binary op before opset 7: B equal to A, or with ``broadcast`` one element or A's dims
    from ``axis`` on (by default its last). None from opset 7 on, or for shapes the version
    does not allow (an invalid model: :func:`_legacy_shapes_problem`)."""
    if opset >= 7 or _legacy_shapes_problem(a.shape, b.shape, broadcast, axis):
        return None
    if broadcast and b.size == 1:
        return fn(a, b.reshape(()))
    start = a.ndim - b.ndim if axis is None else axis
    return fn(a, b.reshape(b.shape + (1,) * (a.ndim - start - b.ndim)))


def _legacy_shapes_problem(a_shape, b_shape, broadcast, axis) -> str | None:
    """Why B's shape is not one a binary op before opset 7 takes beside A's, or None."""
    if not broadcast:
        return None if tuple(a_shape) == tuple(b_shape) else "without broadcast=1 the shapes must be equal"
    if math.prod(b_shape) == 1 and len(b_shape) <= len(a_shape):
        return None
    start = len(a_shape) - len(b_shape) if axis is None else axis
    if start < 0 or tuple(a_shape[start : start + len(b_shape)]) != tuple(b_shape):
        return f"B is not A's dims from axis {start} on"
    return None


def _truncating_divide(a, b):
    if a.dtype.kind in "iu":  # integer division rounds toward zero, as in C
        q = np.abs(a) // np.abs(b)
        return np.where((a < 0) != (b < 0), -q, q).astype(np.result_type(a, b))
    return np.divide(a, b)


def _old_gemm_formula(a, b, c=None, *, alpha=1.0, beta=1.0, transA=0, transB=0, broadcast=0, opset, **_):
    """Gemm before opset 7: ``alpha A'B' + beta C`` in float64, rounded once to the inputs' type
    (onnxruntime computes a float16 Gemm in float32 and rounds once; the ReferenceEvaluator
    rounds after each step), C broadcast to the output only with ``broadcast=1``; None for a
    C the form does not take or lacks (C is required before version 11: an invalid model)."""
    if opset >= 7 or c is None:
        return None
    a, b = (a.T if transA else a), (b.T if transB else b)
    y = alpha * (a.astype(np.float64) @ b.astype(np.float64))
    try:
        c = np.broadcast_to(c, y.shape) if broadcast else c
    except ValueError:
        return None
    if c.shape != y.shape:
        return None
    return (y + beta * c.astype(np.float64)).astype(a.dtype)


def _old_batchnorm_formula(x, scale, bias, mean, var, *, epsilon=1e-5, is_test=0, spatial=1, momentum=0.9, opset, **_):
    """BatchNormalization before opset 7: in inference (``is_test=1``) Y by the running
    statistics; in training Y by the batch's mean and population variance, then the running
    mean and variance updated as ``running * momentum + batch * (1 - momentum)`` (the rule of
    versions 14 on; outputs 3 and 4, which ONNX leaves open, are not given). Per channel, or per
    activation with ``spatial=0`` (parameters of shape (C, D1, ...)). Y in float64, rounded
    once to the input's type, as onnxruntime computes versions 7 on (the ReferenceEvaluator
    rounds after each step in float16, and runs neither training nor ``spatial=0``). In
    training that is exact where two values of a small batch nearly agree (1.4442 and 1.4487,
    per activation), which plain float32 statistics are not (1.6e-5 off in numpy's float32,
    and in jonnx until its batch mean was corrected: ops/normalization.py
    ``corrected_moments``; from 2026-12-05 to 12-07 this formula trained in float32 for it)."""
    if opset >= 7:
        return None
    shape = (1, -1) + (1,) * (x.ndim - 2) if spatial else (1, *x.shape[1:])
    wide = x.astype(np.float64)
    scale, bias, mean, var = (np.asarray(v, wide.dtype).reshape(shape) for v in (scale, bias, mean, var))
    if is_test:
        return ((wide - mean) / np.sqrt(var + epsilon) * scale + bias).astype(x.dtype)
    axes = (0, *range(2, x.ndim)) if spatial else (0,)
    batch_mean, batch_var = wide.mean(axes, keepdims=True), wide.var(axes, keepdims=True)
    y = (wide - batch_mean) / np.sqrt(batch_var + epsilon) * scale + bias
    # The running statistics in float32 for half types, rounded once: onnxruntime's rule, and
    # float64 moved float16 near ties (``var * 0.9``, with 0.9 a float32 attribute) the other way.
    wide, stats_shape = np.promote_types(x.dtype, np.float32), (-1,) if spatial else x.shape[1:]
    running = [
        np.reshape(old.astype(wide) * momentum + new.astype(wide) * (1 - momentum), stats_shape).astype(x.dtype)
        for old, new in ((mean, batch_mean), (var, batch_var))
    ]
    return [y.astype(x.dtype), *running]


# Forms of opsets before 7 that onnxruntime does not run and the ReferenceEvaluator runs by
# later rules (numpy broadcasting, with no ``axis``): checked by their formula first.
OLD_FORMS = {
    op: functools.partial(_legacy_binary_formula, fn)
    for op, fn in {
        "Add": np.add,
        "Sub": np.subtract,
        "Mul": np.multiply,
        "Div": _truncating_divide,
        "Pow": np.power,
        "And": np.logical_and,
        "Or": np.logical_or,
        "Xor": np.logical_xor,
        "Equal": np.equal,
        "Greater": np.greater,
        "Less": np.less,
    }.items()
} | {"Gemm": _old_gemm_formula, "BatchNormalization": _old_batchnorm_formula}


def _global_lp_pool_formula(x, *, p=2, opset):
    """GlobalLpPool: the p-norm of each channel's map (float64: onnxruntime runs float32 only,
    and the ReferenceEvaluator has none)."""
    norm = np.sum(np.abs(x.astype(np.float64)) ** p, axis=tuple(range(2, x.ndim)), keepdims=True) ** (1.0 / p)
    return norm.astype(x.dtype)


FORMULAS = {
    "GlobalLpPool": _global_lp_pool_formula,
    "LRN": _lrn_formula,
    "MeanVarianceNormalization": _mvn_formula,
    "GroupNormalization": _group_norm_formula,
    "RMSNormalization": _rms_norm_formula,
    "RNN": _no_steps_formula,
    "GRU": _no_steps_formula,
    "LSTM": functools.partial(_no_steps_formula, states=2),
    "MatMulIntegerToFloat": _matmul_integer_to_float_formula,
}


def _rounded_like(exact, got):
    """A float64 result of :func:`widened_outputs` rounded once to the type of jonnx's
    (float16, or float32 for ``_CENTRED``)."""
    if isinstance(exact, np.ndarray) and exact.dtype == np.float64 and isinstance(got, np.ndarray):
        return exact.astype(got.dtype) if got.dtype in (np.float16, np.float32) else exact
    return exact


# A float16 result one unit from the exact value rounded once, where the exact value lies
# within this fraction of a unit of the midpoint between the two: float32 arithmetic (jonnx's,
# onnxruntime's) cannot tell which way it rounds (the fraction is 64 float32 units). Long axes
# under --half put a few such values in most large outputs (2026-12-06: LpNormalization,
# GroupNormalization, RMSNormalization, BatchNormalization, 2e-5 to 1.4e-3 of a unit away).
NEAR_TIE = 4e-3


def settle_near_ties(got: list, exact: list) -> list:
    """``exact`` (:func:`widened_outputs`) rounded once to ``got``'s type (:func:`_rounded_like`),
    except where ``got`` is the neighbouring float16 value of a near tie (:data:`NEAR_TIE`):
    there ``got`` itself."""
    settled = []
    for g, e in zip(got, exact):
        rounded = _rounded_like(e, g)
        if isinstance(g, np.ndarray) and g.dtype == np.float16 and np.shape(rounded) == g.shape:
            rounded = np.asarray(rounded)
            if rounded.dtype == np.float16:
                neighbour = np.nextafter(rounded, g) == g
                midpoint = (g.astype(np.float64) + rounded.astype(np.float64)) / 2
                unit = np.abs(g.astype(np.float64) - rounded.astype(np.float64))
                tie = neighbour & (np.abs(np.asarray(e) - midpoint) <= NEAR_TIE * unit)
                rounded = np.where(tie, g, rounded)
        settled.append(rounded)
    return settled


def widened_outputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list | None:
    """The ReferenceEvaluator's outputs for the one node with its float16 inputs and
    initializers in float64, not rounded (its formula's in ``FORMULAS`` where the
    ReferenceEvaluator refuses float64); for the normalizations that centre rows
    (``_CENTRED``) float32 ones too, where onnxruntime's float32 results are far off on rows
    whose mean dwarfs their spread. None without such inputs, or for a node with a type
    attribute (Cast's ``to``), whose outputs would change."""
    node = model.graph.node[0]
    if len(model.graph.node) != 1 or any(a.name in ("to", "dtype", "output_dtype") for a in node.attribute):
        return None
    narrow = {np.dtype(np.float16)} | ({np.dtype(np.float32)} if node.op_type in _CENTRED else set())
    if not any(isinstance(v, np.ndarray) and v.dtype in narrow for v in feeds.values()):
        return None
    codes = {onnx.helper.np_dtype_to_tensor_dtype(t) for t in narrow}
    wide = onnx.ModelProto()
    wide.CopyFrom(model)
    for value in wide.graph.input:
        if value.type.tensor_type.elem_type in codes:
            value.type.tensor_type.elem_type = onnx.TensorProto.DOUBLE
    for k, t in enumerate(wide.graph.initializer):
        if t.data_type in codes:
            widened = onnx.numpy_helper.to_array(t).astype(np.float64)
            wide.graph.initializer[k].CopyFrom(onnx.numpy_helper.from_array(widened, t.name))
    wide_feeds = {
        k: v.astype(np.float64) if isinstance(v, np.ndarray) and v.dtype in narrow else v for k, v in feeds.items()
    }
    if node.op_type == "GroupNormalization":  # the ReferenceEvaluator's statistics are float32
        return formula_reference(wide, wide_feeds)
    try:
        return ReferenceEvaluator(wide).run(None, wide_feeds)
    except Exception:  # noqa: BLE001 -- a function body with float32 constants (MeanVarianceNormalization's)
        return formula_reference(wide, wide_feeds)


def formula_reference(
    model: onnx.ModelProto, feeds: dict[str, np.ndarray], formulas: Mapping[str, Callable] = FORMULAS
) -> list[np.ndarray] | None:
    """The one node's outputs by its formula in ``formulas`` (``FORMULAS``, ``OLD_FORMS``), or
    None (also where the default domain's opset does not define the op yet: the model is not
    valid, and jonnx refuses it)."""
    node = model.graph.node[0]
    formula = formulas.get(node.op_type)
    if formula is None:
        return None
    values = {**{t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}, **feeds}
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    opset = next(o.version for o in model.opset_import if o.domain in (node.domain, "ai.onnx"))
    if node.domain in ("", "ai.onnx"):
        try:
            onnx.defs.get_schema(node.op_type, opset, "")
        except onnx.defs.SchemaError:
            return None
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the mean of an empty batch
        y = formula(*(values.get(name) for name in node.input), **attrs, opset=opset)
    if y is None:
        return None
    return [np.asarray(v) for v in y][: len(node.output)] if isinstance(y, list) else [np.asarray(y)]


def difference(got: np.ndarray, want: np.ndarray) -> str | None:
    """Why ``got`` is not ``want`` (tensors, sequences of them, maps, or None for an empty
    optional), or None."""
    if got is None and want is None:
        return None
    if got is None or want is None:
        return "nothing against a value" if got is None else "a value against nothing"
    if isinstance(got, dict) or isinstance(want, dict):
        if not (isinstance(got, dict) and isinstance(want, dict)):
            return f"a {type(got).__name__} against a {type(want).__name__}"
        if set(got) != set(want):  # a map has no order (onnxruntime's come sorted by key)
            return f"keys {list(got)} against {list(want)}"
        return next(
            (f"key {k!r}: {why}" for k in got if (why := difference(np.asarray(got[k]), np.asarray(want[k])))), None
        )
    if isinstance(got, list) or isinstance(want, list):
        if not (isinstance(got, list) and isinstance(want, list)) or len(got) != len(want):
            return f"a sequence of {len(got) if isinstance(got, list) else 'no'} tensors against {len(want) if isinstance(want, list) else 'a tensor'}"
        return next((f"item {i}: {why}" for i, (g, w) in enumerate(zip(got, want)) if (why := difference(g, w))), None)
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return f"shape {got.shape} against {want.shape}"
    if got.dtype.kind in "OSU" and want.dtype.kind in "OSU":  # strings, as objects or numpy's
        return None if got.astype(str).tolist() == want.astype(str).tolist() else "strings differ"
    if got.dtype != want.dtype:
        return f"dtype {got.dtype} against {want.dtype}"
    if want.dtype.kind in "fc":
        if not np.allclose(got, want, rtol=1e-4, atol=1e-5, equal_nan=True):
            gap = np.abs(got.astype(float) - want.astype(float))  # NaN where either is NaN
            return f"values differ by up to {np.max(gap, initial=0.0, where=~np.isnan(gap)):.3g}"
    elif not np.array_equal(got, want):
        return "values differ"
    return None


def differences(got, want) -> list[str]:
    if len(got) != len(want):
        return [f"{len(got)} outputs against {len(want)}"]
    return [f"output {i}: {why}" for i, (g, w) in enumerate(zip(got, want)) if (why := difference(g, w))]


def onnxruntime_outputs(model: onnx.ModelProto, feeds: dict) -> list | None:
    """onnxruntime's outputs for ``model`` (through :func:`time_major_twin` where it refuses a
    batch-major recurrent node, :func:`later_twin` where it runs an old version's later form
    only), or None where it refuses the graph."""
    for candidate in (model, time_major_twin(model), later_twin(model, feeds)):
        if candidate is None:
            continue
        try:
            session = ort.InferenceSession(candidate.SerializeToString(), providers=["CPUExecutionProvider"])
            return session.run(None, feeds)
        except Exception:  # noqa: BLE001 -- onnxruntime refuses a draw it does not implement
            continue
    return None


def later_twin(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> onnx.ModelProto | None:
    """The one node of a version before its op's later form (:data:`LATER_FORMS`) as that
    later version, with the attributes it made inputs as initializers, or None. onnxruntime
    runs few versions before opset 7 (Upsample-1, AveragePool-1, LpPool-1, Pad-1, Clip-1,
    Concat-1, Split-1 none), and the ReferenceEvaluator runs them by later rules (AveragePool-1
    counting the pads, Concat-1 without its default axis)."""
    if len(model.graph.node) != 1 or model.graph.node[0].domain not in ("", "ai.onnx"):
        return None
    node = model.graph.node[0]
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    convert = LATER_FORMS.get(node.op_type)
    if convert is None or opset is None:
        return None
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute if a.name != "consumed_inputs"}
    attrs = {k: v.decode() if isinstance(v, bytes) else v for k, v in attrs.items()}
    values = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer} | feeds
    form = convert(opset, attrs, [values.get(name) for name in node.input])
    if form is None:
        return None
    version, inputs, later_attrs = form
    twin = onnx.ModelProto()
    twin.CopyFrom(model)
    names = []
    for k, spec in enumerate(inputs):
        if spec is None:
            names.append("")
        elif isinstance(spec, int):
            names.append(node.input[spec])
        else:
            names.append(f"later_input{k}")
            twin.graph.initializer.append(onnx.numpy_helper.from_array(np.asarray(spec), names[-1]))
    op_type = "Resize" if node.op_type == "Upsample" else node.op_type
    later = onnx.helper.make_node(op_type, names, list(node.output), **later_attrs)
    del twin.graph.node[:]
    twin.graph.node.append(later)
    for o in twin.opset_import:
        if o.domain in ("", "ai.onnx"):
            o.version = version
    return twin


def _later_upsample(opset, attrs, values):
    """Upsample-1 as Resize-13 with Upsample-7's asymmetric coordinates and nearest cell (the
    floor): onnxruntime's Upsample and Resize take no float64, the ReferenceEvaluator's Resize
    does (its Resize-10 reads the scales as the regions of interest; 11 requires them)."""
    if opset >= 7:
        return None
    mode = "linear" if attrs.get("mode", "nearest") == "bilinear" else attrs.get("mode", "nearest")
    scales = np.array([1.0, 1.0, attrs["height_scale"], attrs["width_scale"]], np.float32)
    modes = {"mode": mode, "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}
    return 13, [0, None, scales], modes


def _later_lp_pool(opset, attrs, values, version=11):
    """LpPool-1 (GlobalLpPool-1 with ``version=7``) as the later version: its float ``p``,
    where whole, as the int ``p`` of versions 2 on."""
    p = attrs.get("p", 2.0)
    if opset >= 2 or p != int(p):
        return None
    return version, [0], {**attrs, "p": int(p)}


def _later_pad(opset, attrs, values):
    if opset >= 11:
        return None
    pads = attrs.pop("paddings", None) or attrs.pop("pads")  # version 1's name, then 2's
    value = np.asarray(attrs.pop("value", 0.0), values[0].dtype)
    return 11, [0, np.array(pads, np.int64), value], attrs


def _later_slice(opset, attrs, values):
    if opset >= 10:
        return None
    bounds = [np.array(attrs[k], np.int64) for k in ("starts", "ends", "axes") if k in attrs]
    return 10, [0, *bounds], {}


def _later_split(opset, attrs, values):
    if opset >= 11:
        return None
    split = attrs.pop("split", None)
    if split is None and len(values) > 1 and values[1] is not None:  # version 1's optional input
        split = values[1]
    return 13, [0] + ([np.array(split, np.int64)] if split is not None else []), attrs


def _later_clip(opset, attrs, values):
    if opset >= 11:
        return None
    bounds = [np.asarray(attrs[k], values[0].dtype) if k in attrs else None for k in ("min", "max")]
    while bounds and bounds[-1] is None:
        bounds.pop()
    return 13, [0, *bounds], {}  # 13: onnxruntime's Clip takes float64 from 12 on


def _later_tile(opset, attrs, values):
    if opset >= 6 or len(values) != 3 or any(v is None for v in values):
        return None
    repeats = np.ones(values[0].ndim, np.int64)
    repeats[int(values[2])] = int(values[1])
    return 7, [0, repeats], {}


# Versions before an op's later form, as that form (:func:`later_twin`): each converter takes
# the opset, the node's attributes and its input values, and returns (version, inputs: an
# index of the node's own, a new constant or None for an omitted one, attributes), or None.
LATER_FORMS: dict[str, Callable] = {
    "Upsample": _later_upsample,
    "LpPool": _later_lp_pool,
    "GlobalLpPool": functools.partial(_later_lp_pool, version=7),
    "AveragePool": lambda opset, attrs, values: None if opset >= 7 else (7, [0], attrs),
    "Pad": _later_pad,
    "Slice": _later_slice,
    "Reshape": lambda opset, attrs, values: None if opset >= 5 else (13, [0, np.array(attrs["shape"], np.int64)], {}),
    "Split": _later_split,
    "Clip": _later_clip,
    "Concat": lambda opset, attrs, values: (
        None if opset >= 4 else (7, list(range(len(values))), {"axis": attrs.get("axis", 1)})
    ),
    "Tile": _later_tile,
}


def time_major_twin(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """``model`` with each batch-major RNN, GRU or LSTM (``layout=1``) as the same node in layout
    0 between Transposes (X and the initial states in, Y and the last states out), or None
    when it has none. onnxruntime refuses layout 1, and the ReferenceEvaluator, which runs it,
    ignores ``sequence_lens``, ``clip`` and ``activations`` (a graph fuzz finding of 2026-12-04 was
    the reference's)."""
    nodes, changed = [], False
    for k, node in enumerate(model.graph.node):
        layout = next((a.i for a in node.attribute if a.name == "layout"), 0)
        if node.op_type not in ("RNN", "GRU", "LSTM") or layout != 1:
            nodes.append(node)
            continue
        changed = True
        inputs = list(node.input)
        for i in (0, 5, 6):  # X (B, T, D) and the initial states (B, dirs, H): batch second
            if i < len(inputs) and inputs[i]:
                name = f"time_major{k}_in{i}"
                nodes.append(onnx.helper.make_node("Transpose", [inputs[i]], [name], perm=[1, 0, 2]))
                inputs[i] = name
        outputs, after = [], []
        for i, out in enumerate(node.output):
            name = f"time_major{k}_out{i}" if out else ""
            outputs.append(name)
            if out:  # Y (T, dirs, B, H) -> (B, T, dirs, H); the last states (dirs, B, H) -> (B, dirs, H)
                perm = [2, 0, 1, 3] if i == 0 else [1, 0, 2]
                after.append(onnx.helper.make_node("Transpose", [name], [out], perm=perm))
        twin = onnx.helper.make_node(node.op_type, inputs, outputs, name=node.name, domain=node.domain)
        twin.attribute.extend(a for a in node.attribute if a.name != "layout")
        nodes += [twin, *after]
    if not changed:
        return None
    twin_model = onnx.ModelProto()
    twin_model.CopyFrom(model)
    del twin_model.graph.node[:]
    twin_model.graph.node.extend(nodes)
    return twin_model


class StepByStep:
    """Loop and Scan for the ReferenceEvaluator (its ``new_ops``), run one iteration at a time
    through its evaluation of the body, which rounds after each node.

    They are the reference for half-precision Loop and Scan: onnxruntime computes a chain of
    float16 nodes in float32 and rounds once (it casts around its float16 nodes and drops the
    casts between them), so a body's result is off the types' per-node rounding, and the
    ReferenceEvaluator's own Loop stacks scan outputs with ``vstack`` (a scalar's as (N, 1)), its
    Scan takes no other axis or direction than 0, and its SequenceInsert fails on an empty
    sequence. A zero-trip loop with scan outputs raises (their shape is unknown), as do a Loop
    with neither a trip count nor a condition and Scan-8's batched form: the caller falls back.
    """

    class Loop(OpRun):
        def need_context(self) -> bool:
            return True  # the body may read the outer graph's values

        def _run(self, trip, cond, *state, context=None, body=None, attributes=None, bindings=None):
            if trip is None and cond is None:
                raise RuntimeError("a Loop with neither a trip count nor a condition never ends")
            names, n = self.body.input_names, len(state)
            keep, carried, steps, i = True if cond is None else bool(cond), list(state), [], 0
            while keep and (trip is None or i < int(trip)):
                feeds = {**(context or {}), names[0]: np.array(i, np.int64), names[1]: np.array(keep)}
                out = self._run_body({**feeds, **dict(zip(names[2:], carried))}, bindings=bindings)
                keep, carried = bool(out[0]), list(out[1 : 1 + n])
                steps.append(out[1 + n :])
                i += 1
            scans = len(self.body.output_names) - 1 - n
            if scans and not steps:
                raise RuntimeError("a zero-trip Loop's scan outputs have no known shape")
            return tuple(carried + [np.stack([step[k] for step in steps]) for k in range(scans)])

    class Scan(OpRun):
        def need_context(self) -> bool:
            return True

        def _run(self, *args, context=None, body=None, num_scan_inputs=None, scan_input_axes=None,
                 scan_input_directions=None, scan_output_axes=None, scan_output_directions=None,
                 attributes=None, bindings=None):  # fmt: skip
            if self.run_params["opsets"][""] < 9:
                raise RuntimeError("Scan-8 (a batch axis and sequence lengths) is not run step by step")
            n, names = len(args) - num_scan_inputs, self.body.input_names
            pick = lambda values, i: values[i] if values else 0  # noqa: E731
            xs = [np.moveaxis(x, pick(scan_input_axes, i), 0) for i, x in enumerate(args[n:])]
            xs = [x[::-1] if pick(scan_input_directions, i) else x for i, x in enumerate(xs)]
            carried, steps = list(args[:n]), []
            for t in range(xs[0].shape[0]):
                feeds = {**(context or {}), **dict(zip(names, carried + [x[t] for x in xs]))}
                out = self._run_body(feeds, bindings=bindings)
                carried = list(out[:n])
                steps.append(out[n:])
            scans = len(self.body.output_names) - n
            if scans and not steps:
                raise RuntimeError("an empty Scan's outputs have no known shape")
            outputs = []
            for k in range(scans):
                y = np.stack([step[k] for step in steps])
                y = y[::-1] if pick(scan_output_directions, k) else y
                outputs.append(np.moveaxis(y, 0, pick(scan_output_axes, k)))
            return tuple(carried + outputs)

    class SequenceInsert(OpRun):
        """The ReferenceEvaluator's takes a position modulo the length: an empty sequence's 0
        divides by zero."""

        def _run(self, sequence, tensor, position=None):
            n = len(sequence)
            at = n if position is None else int(position) + (n if int(position) < 0 else 0)
            return (list(sequence[:at]) + [tensor] + list(sequence[at:]),)


STEP_BY_STEP = [StepByStep.Loop, StepByStep.Scan, StepByStep.SequenceInsert]


def step_by_step_reference(model: onnx.ModelProto, feeds: dict) -> list | None:
    """The ReferenceEvaluator's outputs with :class:`StepByStep`'s Loop and Scan, for a model
    whose Loop or Scan reads a half-precision value, or None (not such a model, or it fails)."""
    node = next((n for n in model.graph.node if n.op_type in ("Loop", "Scan") and n.domain in ("", "ai.onnx")), None)
    values = [*feeds.values(), *(onnx.numpy_helper.to_array(t) for t in model.graph.initializer)]
    halves = (np.float16, ml_dtypes.bfloat16)
    if node is None or not any(isinstance(v, np.ndarray) and v.dtype in halves for v in values):
        return None
    try:
        return ReferenceEvaluator(model, new_ops=STEP_BY_STEP).run(None, feeds)
    except Exception:  # noqa: BLE001 -- the caller falls back to onnxruntime
        return None


def check(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> tuple[str, str | None]:
    """``(verdict, detail)``: ``ok``, ``references fail``, ``reference disagrees`` (jonnx equals the
    ReferenceEvaluator or the op's formula in ``FORMULAS``, not onnxruntime), ``near tie`` (a
    float16 result off only where the exact value is a near tie: :func:`settle_near_ties`), ``invalid model`` (jonnx refuses a model that
    ``onnx.checker`` refuses too: a run at an old ``--opset`` draws ops and attributes of later
    versions, which the ReferenceEvaluator runs anyway), ``runs an invalid model`` (no reference
    runs it, the checker refuses it, jonnx runs it: :func:`_unreferenced`), ``raises`` or
    ``differs``."""
    want, source = step_by_step_reference(model, feeds), "the ReferenceEvaluator with StepByStep's Loop and Scan"
    if want is None:
        want, source = onnxruntime_outputs(model, feeds), "onnxruntime"
    if want is None:
        want, source = formula_reference(model, feeds, OLD_FORMS), "the formula (OLD_FORMS)"
    if want is None:  # onnxruntime refuses what it does not implement
        try:  # an old version as its later form, which the ReferenceEvaluator runs as written
            twin = later_twin(model, feeds)
            want, source = ReferenceEvaluator(twin or model).run(None, feeds), "ReferenceEvaluator"
        except Exception:  # noqa: BLE001
            want, source = formula_reference(model, feeds), "the formula (FORMULAS)"
            if want is None:
                return _unreferenced(model, feeds)
    try:
        got = [
            y if y is None or isinstance(y, (list, dict)) else np.asarray(y) for y in jonnx.load(model)(*feeds.values())
        ]
    except Exception as e:  # noqa: BLE001 -- every error is a finding, unless the model is invalid
        if invalid_reason(model) is not None:
            return "invalid model", None
        return "raises", f"{type(e).__name__}: {str(e).splitlines()[0][:200]} ({source} runs it)"
    found = differences(got, want)
    if not found:
        return "ok", None
    if source in ("onnxruntime", "ReferenceEvaluator"):  # jonnx may equal another reference instead
        try:
            exact = widened_outputs(model, feeds)
        except Exception:  # noqa: BLE001 -- the ReferenceEvaluator refuses float64 here
            exact = None
        others = [
            lambda: formula_reference(model, feeds),
            lambda: exact and [_rounded_like(e, g) for e, g in zip(exact, got)],
        ]
        if source == "onnxruntime":
            others.insert(0, lambda: ReferenceEvaluator(model).run(None, feeds))
        for other in others:
            try:
                theirs = other()
            except Exception:  # noqa: BLE001
                continue
            if theirs is not None and not differences(got, theirs):
                return "reference disagrees", None
        if exact is not None and len(exact) == len(got) and not differences(got, settle_near_ties(got, exact)):
            return "near tie", None
    return "differs", f"{'; '.join(found)} (against {source})"


def _unreferenced(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> tuple[str, str | None]:
    """The verdict where no reference runs a model: ``references fail``, unless ``onnx.checker``
    refuses it (a later version's form at an old ``--opset``), where jonnx must refuse it too
    (``invalid model``); running it is the finding ``runs an invalid model``."""
    why = invalid_reason(model)
    if why is None:
        return "references fail", None
    try:
        jonnx.load(model)(*feeds.values())
    except Exception:  # noqa: BLE001 -- refusing it, whatever the error, is right
        return "invalid model", None
    return "runs an invalid model", f"onnx.checker refuses it: {why[:200]}"


def invalid_reason(model: onnx.ModelProto) -> str | None:
    """Why ``onnx.checker`` refuses the model's nodes at its opsets (an op its opset lacks, an
    attribute or input count of another version), or None. The nodes, not the model: the
    fuzzers' models leave their outputs untyped, which ``check_model`` refuses in every one."""
    ctx = onnx.checker.C.CheckerContext()
    ctx.ir_version = model.ir_version
    ctx.opset_imports = {o.domain: o.version for o in model.opset_import}
    for node in model.graph.node:
        try:
            onnx.checker.check_node(node, ctx)
        except onnx.checker.ValidationError as e:
            return str(e).splitlines()[0]
    return _legacy_broadcast_problem(model)


def _legacy_broadcast_problem(model: onnx.ModelProto) -> str | None:
    """Why the one node, a binary op or Gemm of a version with a ``broadcast`` attribute (before
    opset 7), cannot take its inputs' shapes (the checker does not look at shapes), or None."""
    node = model.graph.node[0]
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    binary = len(node.input) == 2 and node.op_type not in ("Gemm", "BatchNormalization")
    gemm = node.op_type == "Gemm" and len(node.input) == 3
    if node.op_type not in OLD_FORMS or opset is None or opset >= 7 or not (binary or gemm):
        return None
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in model.graph.input}
    shapes.update({t.name: list(t.dims) for t in model.graph.initializer})
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    given = [shapes.get(name) for name in node.input]
    if any(shape is None for shape in given):
        return None
    if gemm:
        problem = _legacy_gemm_problem(*given, attrs)
    else:
        problem = _legacy_shapes_problem(*given, attrs.get("broadcast", 0), attrs.get("axis"))
    shown = " and ".join(map(str, given))
    return None if problem is None else f"{node.op_type}-{opset} of shapes {shown}: {problem}"


def _legacy_gemm_problem(a, b, c, attrs) -> str | None:
    """Why C's shape is not one Gemm before opset 7 takes beside A's and B's, or None: the
    output's (M, N), or one that broadcasts to it with ``broadcast=1``."""
    out = (a[1 if attrs.get("transA") else 0], b[0 if attrs.get("transB") else 1])
    if not attrs.get("broadcast"):
        return None if tuple(c) == out else f"without broadcast=1 C must be the output's {out}"
    try:
        fits = np.broadcast_shapes(tuple(c), out) == out
    except ValueError:
        fits = False
    return None if fits else f"C does not broadcast to the output's {out}"


def _same_padded(case: Case) -> bool:
    return str(case.attrs.get("auto_pad", "")).startswith("SAME")


def _same_padded_and_dilated(case: Case) -> bool:
    return _same_padded(case) and any(d > 1 for d in case.attrs.get("dilations", ()))


def _window(case: Case) -> tuple[tuple[int, ...], list[int], list[int]] | None:
    """A convolution's or pooling's spatial input shape, kernel and dilations; None for an op
    without a kernel (the global pools)."""
    spatial = _first_input(case).shape[2:]
    if "kernel_shape" in case.attrs:
        kernel = case.attrs["kernel_shape"]
    elif "w" in case.inputs:
        kernel = np.asarray(case.inputs["w"]).shape[2:]
    else:
        return None
    return spatial, list(kernel), case.attrs.get("dilations") or [1] * len(spatial)


def _negative_same_padding(case: Case) -> bool:
    """Whether a SAME-padded case's padding, as the specification computes it, is negative
    along some axis (a window shorter than the stride): onnxruntime refuses such pooling with
    one output and the ReferenceEvaluator reads a window elsewhere."""
    window = _window(case) if _same_padded(case) else None
    if window is None:
        return False
    spatial, kernel, dilations = window
    return any(
        (-(-n // s) - 1) * s + (k - 1) * dil + 1 - n < 0
        for n, s, k, dil in zip(spatial, case.attrs["strides"], kernel, dilations)
    )


def _window_exceeds_input(case: Case) -> bool:
    """Whether a convolution's or pooling's (dilated) window is longer than its explicitly
    padded (or VALID) input along some axis: jonnx refuses it, the references differ."""
    window = None if _same_padded(case) else _window(case)
    if window is None:
        return False
    spatial, kernel, dilations = window
    pads = case.attrs.get("pads") or [0] * (2 * len(spatial))
    return any(
        (k - 1) * dil + 1 > n + pads[i] + pads[i + len(spatial)]
        for i, (n, k, dil) in enumerate(zip(spatial, kernel, dilations))
    )


def _resized_to_one(case: Case) -> bool:
    """Whether a Resize makes some axis of length one out of a longer one."""
    x = _first_input(case)
    sizes, scales = case.inputs.get("sizes"), case.inputs.get("scales")
    if sizes is not None:
        out = np.asarray(sizes).tolist()
    elif scales is not None:
        out = [int(np.floor(n * s)) for n, s in zip(x.shape, np.asarray(scales).tolist())]
    else:
        return False
    axes = case.attrs.get("axes") or range(len(out))
    return any(o == 1 and x.shape[a] > 1 for a, o in zip(axes, out))


def _first_input(case: Case) -> np.ndarray:
    return np.asarray(next(iter(case.inputs.values())))


def _all_equal(x: np.ndarray) -> bool:
    return x.size == 0 or bool(np.all(x == x.flat[0]))


# Where the references depart from the specification (the module docstring's list), as
# predicates on a case: a difference or an error there is counted as a "known departure"
# under its reason, not printed as a finding. Each is narrow enough that a real bug in the
# same op, on other cases, still shows.
DEPARTURES: list[tuple[str, Callable[[Case], bool]]] = [
    (
        "ConvTranspose, SAME and dilations: onnxruntime's output shape",
        lambda c: c.op == "ConvTranspose" and _same_padded_and_dilated(c),
    ),
    (
        "ConvTranspose, SAME with a window shorter than the stride: onnxruntime's output shape",
        lambda c: (
            c.op == "ConvTranspose"
            and _same_padded(c)
            and any(k < s for k, s in zip(np.asarray(c.inputs["w"]).shape[2:], c.attrs["strides"]))
        ),
    ),
    (
        "MaxPool, SAME and dilations: onnxruntime pads for the undilated window",
        lambda c: c.op == "MaxPool" and _same_padded_and_dilated(c),
    ),
    (
        "pooling, VALID with ceil_mode: onnxruntime's padded formula",
        lambda c: (
            c.op in ("MaxPool", "AveragePool") and c.attrs.get("auto_pad") == "VALID" and bool(c.attrs.get("ceil_mode"))
        ),
    ),
    (
        "a window longer than its padded input: jonnx refuses, the references differ",
        lambda c: c.op in ("Conv", "MaxPool", "AveragePool", "LpPool") and _window_exceeds_input(c),
    ),
    (
        "pooling, SAME padding that would be negative: onnxruntime refuses, the ReferenceEvaluator moves the window",
        lambda c: c.op in ("MaxPool", "AveragePool", "LpPool") and _negative_same_padding(c),
    ),
    (
        "DynamicQuantizeLinear of a constant or empty tensor: onnxruntime's scale 1",
        lambda c: c.op == "DynamicQuantizeLinear" and _all_equal(_first_input(c)),
    ),
    (
        "Resize, pytorch_half_pixel to a length of one: the ReferenceEvaluator samples at -0.5, the specification at 0",
        lambda c: (
            c.op == "Resize"
            and c.attrs.get("coordinate_transformation_mode") == "pytorch_half_pixel"
            and _resized_to_one(c)
        ),
    ),
    ("ReduceMean of an empty set: undefined", lambda c: c.op == "ReduceMean" and _first_input(c).size == 0),
    ("NonZero of a scalar: onnxruntime reads it as 1-D", lambda c: c.op == "NonZero" and _first_input(c).ndim == 0),
    (
        "a symmetric window of one point: the formula divides by zero (onnxruntime NaN, jonnx numpy's 1)",
        lambda c: c.op.endswith("Window") and not c.attrs.get("periodic", 1) and int(_first_input(c)) == 1,
    ),
    (
        "BRANCH_NEQ on a missing value: onnxruntime takes the true branch (NaN != threshold)",
        lambda c: (
            "BRANCH_NEQ" in c.attrs.get("nodes_modes", ())
            and bool(np.isnan(_first_input(c)).any())
            and not all(c.attrs.get("nodes_missing_value_tracks_true") or [0])
        ),
    ),
    (
        "SoftmaxCrossEntropyLoss in float16, weighted or reduced: onnxruntime rounds each log-probability to "
        "float16 before weighing and summing them (weighted, one unit in the last place off the exact loss for "
        "a quarter of the samples); jonnx computes in float32 and rounds once (--half)",
        lambda c: (
            c.op == "SoftmaxCrossEntropyLoss"
            and c.inputs["scores"].dtype == np.float16
            and (c.inputs.get("weights") is not None or c.attrs.get("reduction", "mean") != "none")
        ),
    ),
    (
        "Softmax in float16: jonnx rounds step by step, as the node suite's float16 Attention expanded into "
        "its function body expects; onnxruntime computes in float32 and rounds once (--half)",
        lambda c: c.op == "Softmax" and _first_input(c).dtype == np.float16,
    ),
    (
        "Pad before opset 19 in mode wrap, which came with version 19 (jonnx refuses it): onnxruntime runs it",
        lambda c: c.op == "Pad" and (c.opset or 19) < 19 and c.attrs.get("mode") == "wrap",
    ),
    (
        "Flatten before opset 11 with a negative axis: that version takes 0 to the rank only, as onnxruntime "
        "holds (jonnx refuses it too); the ReferenceEvaluator counts it from the end",
        lambda c: c.op == "Flatten" and (c.opset or 11) < 11 and c.attrs.get("axis", 1) < 0,
    ),
    (
        "Hardmax before opset 13 in float64: the ReferenceEvaluator, the only reference with a kernel, "
        "runs version 13's form (over the axis alone, not the dimensions from it on)",
        lambda c: c.op == "Hardmax" and (c.opset or 13) < 13 and np.asarray(_first_input(c)).dtype == np.float64,
    ),
    (
        "OneHot-9 with a negative index: the spec gives all off there (counting from the end came with "
        "OneHot-11); onnxruntime and the ReferenceEvaluator count from the end at opset 9 too",
        lambda c: c.op == "OneHot" and c.opset == 9 and bool((np.asarray(c.inputs["i"]) < 0).any()),
    ),
    (
        "CastMap SPARSE to strings with a key missing: onnxruntime writes '0.f' there (jonnx an empty string)",
        lambda c: (
            c.op == "CastMap"
            and c.attrs.get("map_form") == "SPARSE"
            and c.attrs.get("cast_to") == "TO_STRING"
            and len(c.inputs["x"].items) < c.attrs["max_map"]
        ),
    ),
    (
        "LabelEncoder-2 with a NaN key: onnxruntime never matches NaN (the specification compares bits)",
        lambda c: (
            c.op == "LabelEncoder"
            and c.opset == 2
            and any(np.isnan(k) for k in c.attrs.get("keys_floats") or ())
            and bool(np.isnan(_first_input(c)).any())
        ),
    ),
    (
        "StringSplit of an empty string by a delimiter: onnxruntime counts no substring, jonnx and the onnx "
        "reference one empty substring",
        lambda c: c.op == "StringSplit" and bool(c.attrs.get("delimiter")) and "" in _first_input(c).reshape(-1),
    ),
    (
        "StringSplit without a delimiter, of strings with tabs or other whitespace: onnxruntime splits at spaces only",
        lambda c: (
            c.op == "StringSplit"
            and not c.attrs.get("delimiter")
            and any(ch.isspace() and ch != " " for s in _first_input(c).reshape(-1) for ch in s)
        ),
    ),
    (
        "StringNormalizer, UPPER of a ß: onnxruntime maps characters one by one and keeps it, jonnx gives SS",
        lambda c: (
            c.op == "StringNormalizer"
            and c.attrs.get("case_change_action") == "UPPER"
            and any("ß" in s for s in _first_input(c).reshape(-1))
        ),
    ),
    (
        "Loop with its iteration number passed straight out as a scan output: onnxruntime stacks the last count",
        lambda c: c.op == "Loop" and c.attrs["body"].input[0].name in {o.name for o in c.attrs["body"].output},
    ),
]


def known_departure(case: Case) -> str | None:
    """The reason a difference on ``case`` is a documented departure of a reference, or None."""
    return next((reason for reason, applies in DEPARTURES if applies(case)), None)


# Ops whose outputs are integers, or piecewise constant in their float inputs, or whose
# derivative is a choice at ties the draws hit (equal values from rounded or integer draws),
# and quantized ops that compute in float32 whatever their scales' type.
NO_GRADIENT = {"Floor", "Ceil", "Round", "Sign", "IsNaN", "Hardmax", "ArgMax", "ArgMin", "TopK", "Mod", "Equal"}
NO_GRADIENT |= {"Less", "Greater", "Max", "Min", "ReduceMax", "ReduceMin", "MaxPool", "GlobalMaxPool", "Clip"}
NO_GRADIENT |= {"NonZero", "Unique", "Cast", "Range", "Shape", "Size", "ConstantOfShape", "OneHot", "Relu", "Abs"}
NO_GRADIENT |= {"HardSwish", "QuantizeLinear", "DynamicQuantizeLinear", "DynamicQuantizeMatMul", "QGemm"}
NO_GRADIENT |= {"MatMulIntegerToFloat", "Binarizer", "Imputer"}
# BitCast reinterprets bits (no derivative), and the check's float64 widening would change the
# width it casts from: a float16 -> uint16 case became an invalid float64 -> uint16 one.
NO_GRADIENT |= {"BitCast"}


def _sampled_at_kinks(case: Case, feeds: dict) -> bool:
    """Cases whose derivative finite differences cannot check, as they straddle a jump:
    GridSample with grid points exactly on a border or the centre; MaxRoiPool with its regions
    fed (they are rounded, and their first column is a batch index, so the derivative is zero
    between jumps that whole-number draws sit on); RoiAlign with fed regions of zero height or
    width, where with adaptive sample counts (``ceil`` of each bin's size) the count jumps from
    0, and in max mode a bin's samples coincide, so their maximum is a tie that any change of
    the region's size breaks one way or the other."""
    if case.op == "GridSample":
        return bool(np.isin(case.inputs["grid"], (-1.0, 0.0, 1.0)).any())
    if case.op == "MaxRoiPool":
        return "rois" in feeds
    adaptive_or_max = case.attrs.get("sampling_ratio") == 0 or case.attrs.get("mode") == "max"
    if case.op == "RoiAlign" and adaptive_or_max and "rois" in feeds:
        rois = np.asarray(feeds["rois"])
        return bool(((rois[:, 2] == rois[:, 0]) | (rois[:, 3] == rois[:, 1])).any())
    return False


def _tensors(outputs) -> list:
    """The outputs with each sequence output spread into its tensors (projected one by one)."""
    return [t for y in outputs for t in (y if isinstance(y, list) else [y])]


def check_gradient(case: Case, model: onnx.ModelProto, feeds: dict[str, np.ndarray], rng) -> tuple[str, str | None]:
    """jonnx's reverse-mode derivative of a random projection of the outputs, against central
    finite differences, in float64, with respect to every non-empty float graph input that
    jonnx does not need at trace time (Resize's scales, say); then its forward mode along a
    random direction, against that gradient's directional derivative."""
    if case.op in NO_GRADIENT or _sampled_at_kinks(case, feeds):
        return "not differentiable", None
    names = list(feeds)
    floats = [
        i
        for i, k in enumerate(names)
        if isinstance(feeds[k], np.ndarray) and feeds[k].dtype.kind == "f" and feeds[k].size
    ]
    xs = list(feeds.values())
    try:
        jmodel = jonnx.load(model)
        outputs = jmodel.apply_with_state(jmodel.params, *xs)[0]
    except Exception:  # noqa: BLE001 -- the value check reports what does not run
        return _not_run(model)
    wrt = tuple(
        i
        for i in floats
        if _traceable(lambda x, i=i: jmodel.apply_with_state(jmodel.params, *xs[:i], x, *xs[i + 1 :]), xs[i])
    )
    if not wrt or any(y is None or isinstance(y, dict) for y in outputs):  # not tensors: not projected
        return "not differentiable", None
    tensors = _tensors(outputs)
    projections = [rng.standard_normal(np.shape(t)) if np.asarray(t).dtype.kind == "f" else None for t in tensors]
    if case.op == "BatchNormalization":  # the running statistics carry no gradient, by design
        projections[1:] = [None] * len(projections[1:])
    if all(p is None for p in projections):
        return "not differentiable", None
    if any(np.asarray(t).dtype != np.float64 for t, p in zip(tensors, projections) if p is not None):
        return "float32 inside", None  # the quantized ops dequantize to float32: too coarse to check

    # Compiled, as a function of the differentiated inputs only (the others stay concrete):
    # eagerly, each of the ~30 evaluations below dispatched op by op.
    @jax.jit
    def loss(*diff):
        args = list(xs)
        for i, x in zip(wrt, diff):
            args[i] = x
        outputs = jmodel.apply_with_state(jmodel.params, *args)[0]
        return sum(jnp.vdot(t, p) for t, p in zip(_tensors(outputs), projections) if p is not None)

    diff = [jnp.asarray(xs[i]) for i in wrt]
    if not np.isfinite(float(loss(*diff))):
        return "not differentiable", None  # no finite value here (a mean over no samples, say)
    try:
        grads = jax.jit(jax.grad(loss, argnums=tuple(range(len(wrt)))))(*diff)
    except Exception as e:  # noqa: BLE001 -- every error is a finding
        return "raises", f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    eps, errors = 1e-6, []
    for k, grad in enumerate(grads):
        x = np.asarray(diff[k])
        for j in range(min(x.size, 16)):  # enough elements to see a wrong rule
            step = np.zeros_like(x)
            step.flat[j] = eps
            plus, minus = list(diff), list(diff)
            plus[k], minus[k] = jnp.asarray(x + step), jnp.asarray(x - step)
            up, down = float(loss(*plus)), float(loss(*minus))
            numeric = (up - down) / (2 * eps)
            # What rounding the loss alone leaves in the difference quotient: a loss of 1e6 (a
            # LayerNormalization's 1/sqrt(epsilon) output over one element) blurs it by ~1e-4.
            blur = 8 * np.finfo(np.float64).eps * max(abs(up), abs(down)) / (2 * eps)
            off = max(abs(numeric - float(np.asarray(grad).flat[j])) - blur, 0.0)
            errors.append(off / (1 + abs(numeric)))
    worst = max(errors, default=0.0) if np.all(np.isfinite(errors)) else np.nan  # max() skips a NaN
    if not worst <= 1e-4:
        return "differs", f"gradient off by {worst:.3g} (relative) from finite differences"
    # Forward mode along a random direction must give the gradient's directional derivative:
    # an op whose rule works one way only (a custom VJP, a primitive's transpose) departs here.
    direction = [rng.standard_normal(np.shape(d)) for d in diff]
    try:
        forward = float(jax.jit(lambda *d: jax.jvp(loss, d, tuple(map(jnp.asarray, direction)))[1])(*diff))
    except Exception as e:  # noqa: BLE001 -- every error is a finding
        return "raises", f"forward mode: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
    reverse = sum(float(jnp.vdot(g, v)) for g, v in zip(grads, direction))
    if not abs(forward - reverse) <= 1e-9 * (1 + abs(reverse)):
        return "differs", f"forward mode gives {forward:.12g}, the gradient along the same direction {reverse:.12g}"
    return "ok", None


def _widened(x):
    if isinstance(x, Seq):
        return Seq(np.float64, [_widened(t) for t in x.items]) if np.dtype(x.dtype).kind == "f" else x
    if isinstance(x, Opt):
        return x._replace(dtype=np.float64, value=_widened(x.value)) if np.dtype(x.dtype).kind == "f" else x
    if isinstance(x, Map):
        return x
    return np.asarray(x, np.float64) if x is not None and np.asarray(x).dtype.kind == "f" else x


def _not_run(model: onnx.ModelProto) -> tuple[str, None]:
    """The verdict of the gradient and vmap checks where jonnx does not run a model: ``invalid
    model`` where onnx.checker refuses it too (a later version's form at an old ``--opset``),
    else ``does not run`` (the value check reports why)."""
    return ("invalid model" if invalid_reason(model) is not None else "does not run"), None


def _traceable(fn: Callable, value) -> bool:
    """Whether ``fn`` (a model's run as a function of one of its values) takes ``value`` as a
    tracer: jonnx raises StaticValueError where it needs the value at trace time."""
    try:
        jax.eval_shape(fn, value)
    except jonnx.errors.StaticValueError:
        return False
    return True


def check_vmap(model: onnx.ModelProto, feeds: dict[str, np.ndarray], rng) -> tuple[str, str | None]:
    """``jax.jit(jax.vmap(Model.apply))`` over three rows of every numeric graph input and
    weight that jonnx can trace, each stacked on an axis of its own drawn at random, against
    each row run alone by ``jax.jit`` with the same values traced (an op may read a value it
    prefers static, as GroupQueryAttention's total length, differently when traced; the value
    check covers the untraced call). The rows are the drawn values and two permutations of
    them: each row keeps the values' range (indices in bounds, logarithms of positive numbers)
    while its results differ from the others'. Where jonnx needs a batched value on the host
    (an output shape that depends on it), a StaticValueError is the answer."""
    try:
        jmodel = jonnx.load(model)
    except Exception:  # noqa: BLE001 -- the value check reports what does not load
        return _not_run(model)
    xs, params = list(feeds.values()), dict(jmodel.params)
    slots = {f"input {i}": x for i, x in enumerate(xs)} | {f"weight {k}": v for k, v in params.items()}

    def call(values: dict):
        args = [values.get(f"input {i}", x) for i, x in enumerate(xs)]
        return jmodel.apply_with_state({k: values.get(f"weight {k}", v) for k, v in params.items()}, *args)[0]

    batched = {}
    for slot, value in slots.items():
        if not hasattr(value, "dtype") or np.dtype(value.dtype).kind not in "biuf":
            continue
        try:
            if not _traceable(lambda v, slot=slot: call({slot: v}), value):
                continue  # needed at trace time: a shape, an axis, a count
        except Exception:  # noqa: BLE001 -- the value check reports what does not run
            return "does not run", None
        batched[slot] = np.array(value)  # a copy: jax's arrays read as read-only
    if not batched:
        return "not batchable", None
    rows = [batched] + [{s: rng.permutation(v.ravel()).reshape(v.shape) for s, v in batched.items()} for _ in range(2)]
    one = jax.jit(call)
    try:
        want = [one(row) for row in rows]
    except Exception:  # noqa: BLE001 -- a permutation the op refuses (a runtime shape check)
        return "does not run", None
    if any(y is None or isinstance(y, (list, dict)) for ys in want for y in ys):
        return "not batchable", None  # sequences, maps, empty optionals: not stacked
    axes = {s: int(rng.integers(v.ndim + 1)) for s, v in batched.items()}
    stacked = {s: np.stack([row[s] for row in rows], axis=axes[s]) for s in batched}
    try:
        got = jax.jit(jax.vmap(call, in_axes=(axes,)))(stacked)
    except jonnx.errors.StaticValueError:
        return "needs host values", None
    except Exception as e:  # noqa: BLE001 -- every other error is a finding
        return "raises", f"{type(e).__name__}: {str(e).splitlines()[0][:200]} (batched on axes {axes})"
    found = [
        f"row {r} output {k}: {why}"
        for r, ys in enumerate(want)
        for k, y in enumerate(ys)
        if (why := difference(np.asarray(got[k])[r], one_unit_settled(np.asarray(got[k])[r], np.asarray(y))))
    ]
    return ("differs", f"{'; '.join(found[:3])} (batched on axes {axes})") if found else ("ok", None)


def one_unit_settled(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """``want``, with ``got``'s float16 values where they are its neighbours: a float16 op
    computes in float32 and rounds once, and under ``jax.vmap`` XLA may sum in another order,
    which rounds a near tie the other way (a MeanVarianceNormalization over 2,160 values, two
    of its rows 1.2e-4 apart, a unit there: seed 827 with --half --long --vmap)."""
    if got.dtype != np.float16 or want.dtype != np.float16 or got.shape != want.shape:
        return want
    return np.where(np.nextafter(want, got) == got, got, want)


# The key and value types of the maps the ``maps`` family draws.
_MAP_TYPES = {str: onnx.TensorProto.STRING, np.int64: onnx.TensorProto.INT64, np.float32: onnx.TensorProto.FLOAT}


def _build(graph: onnx.GraphProto, feeds: dict, name: str, value) -> None:
    """Make ``name`` hold ``value`` in ``graph``: a tensor or a :class:`Map` as a graph input
    fed from ``feeds``; a :class:`Seq` built by SequenceConstruct from one graph input per
    tensor (SequenceEmpty for none); an :class:`Opt` by an Optional node, around its value or
    typed and empty. Nodes go in front of the graph's, the ones they feed after them."""
    if isinstance(value, Map):
        tp = onnx.helper.make_map_type_proto(
            _MAP_TYPES[value.key], onnx.helper.make_tensor_type_proto(_MAP_TYPES[value.value], [])
        )
        graph.input.append(onnx.helper.make_value_info(name, tp))
        feeds[name] = value.items
        return
    if not isinstance(value, (Seq, Opt)):
        value = np.asarray(value)  # a 0-d draw may be a numpy scalar, which onnxruntime refuses
        graph.input.append(
            onnx.helper.make_tensor_value_info(name, onnx.helper.np_dtype_to_tensor_dtype(value.dtype), value.shape)
        )
        feeds[name] = value
        return
    elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(value.dtype))
    if isinstance(value, Opt):
        if value.value is None:  # empty: typed by the attribute
            tp = onnx.helper.make_tensor_type_proto(elem, None)
            tp = onnx.helper.make_sequence_type_proto(tp) if value.of_sequence else tp
            graph.node.insert(0, onnx.helper.make_node("Optional", [], [name], type=tp))
            return
        graph.node.insert(0, onnx.helper.make_node("Optional", [f"{name}_value"], [name]))
        _build(graph, feeds, f"{name}_value", value.value)
        return
    parts = [f"{name}{i}" for i in range(len(value.items))]
    graph.node.insert(
        0,
        onnx.helper.make_node("SequenceConstruct", parts, [name])
        if parts
        else onnx.helper.make_node("SequenceEmpty", [], [name], dtype=elem),
    )
    for part, tensor in zip(parts, value.items):
        _build(graph, feeds, part, tensor)


def _with_structures(model: onnx.ModelProto, feeds: dict, case: Case) -> tuple[onnx.ModelProto, dict]:
    """``model`` with each input that is not a tensor (:data:`STRUCTURES`) made by
    :func:`_build` in place of its tensor placeholder, and the feeds for it."""
    graph = model.graph
    for name, value in case.inputs.items():
        if isinstance(value, STRUCTURES):
            (placeholder,) = [v for v in graph.input if v.name == name]
            graph.input.remove(placeholder)
            _build(graph, feeds, name, value)
    return model, feeds


def describe(case: Case, initializers: set[str]) -> str:
    def shown(name, v):
        if isinstance(v, Seq):
            return f"{name} sequence of {[list(np.shape(t)) for t in v.items]}"
        if isinstance(v, Opt):
            what = shown("", v.value) if v.value is not None else f" no {'sequence' if v.of_sequence else 'tensor'}"
            return f"{name} optional of{what}"
        if isinstance(v, Map):
            return f"{name} map {v.items!r}"
        return f"{name}{'=const' if name in initializers else ''} {np.asarray(v).dtype.name}{list(np.shape(v))}"

    shapes = ", ".join(shown(name, v) for name, v in case.inputs.items() if v is not None)
    op = f"{case.domain}.{case.op}" if case.domain else case.op
    return f"{op} {case.attrs} ({shapes})"


def run(
    seed: int,
    cases: int,
    families: list[str],
    *,
    opset: int = 21,
    grad: bool = False,
    vmap: bool = False,
    trace: bool = False,
) -> tuple[collections.Counter, list[str]]:
    """Draw ``cases`` cases from ``families`` and check each; returns the count of each verdict
    (and of ``no reference for <op>``) and the findings, each printed as it comes. int64 and
    float64 are exact only with ``jax_enable_x64``, which the caller sets."""
    d = Draw(seed)
    verdicts: collections.Counter = collections.Counter()
    findings = []
    for number in range(cases):
        case = FAMILIES[d.pick(families)](d)
        if case is None:
            continue
        if grad:  # float64 throughout, initializers too, so finite differences are exact enough
            case = case._replace(inputs={k: _widened(v) for k, v in case.inputs.items()})
        # The opset the model gets (a case drawn without one takes --opset), which the
        # departures read too.
        case = case._replace(opset=case.opset or (1 if case.domain else opset))
        initializers = {name for name in case.constants if case.inputs.get(name) is not None and d.chance(0.7)}
        try:
            model = node_model(
                case.op,
                {k: np.zeros(0, np.float32) if isinstance(v, STRUCTURES) else v for k, v in case.inputs.items()},
                case.n_outputs,
                opset=case.opset,
                domain=case.domain,
                initializers=sorted(initializers),
                **{k: v for k, v in case.attrs.items() if k != "opset"},
            )
        except ValueError:  # an attribute onnx.helper cannot type (an empty list)
            continue
        if case.outer:  # node_model wires every input to the node; these only its subgraphs read
            node = model.graph.node[0]
            kept = [name for name in node.input if name not in case.outer]
            del node.input[:]
            node.input.extend(kept)
        if "opset" in case.attrs:  # QLinearSoftmax's attribute, which node_model's keyword would take
            model.graph.node[0].attribute.append(onnx.helper.make_attribute("opset", case.attrs["opset"]))
        feeds = {
            k: np.asarray(v)
            for k, v in case.inputs.items()
            if v is not None and k not in initializers and not isinstance(v, STRUCTURES)
        }
        model, feeds = _with_structures(model, feeds, case)
        if trace:
            print(f"#{number} {describe(case, initializers)}", flush=True)
        if grad:
            verdict, detail = check_gradient(case, model, feeds, d.rng)
        elif vmap:
            verdict, detail = check_vmap(model, feeds, d.rng)
        else:
            verdict, detail = check(model, feeds)
        if not (grad or vmap) and verdict in ("differs", "raises") and (reason := known_departure(case)):
            verdict, detail = "known departure", None
            verdicts[f"known departure: {reason}"] += 1
        verdicts[verdict] += 1
        if verdict == "references fail":
            verdicts[f"no reference for {case.op}"] += 1
        if verdict == "invalid model":  # drawn in a form the model's opset does not have
            verdicts[f"invalid model: {case.op}"] += 1
        if detail:
            findings.append(f"#{number} {verdict}: {describe(case, initializers)}\n    {detail}")
            print(findings[-1], flush=True)
    return verdicts, findings


def add_lowering_option(parser: argparse.ArgumentParser) -> None:
    """The fuzzers' ``--lowering`` option (see :func:`lower_as`)."""
    parser.add_argument(
        "--lowering",
        choices=("cpu", "elsewhere"),
        default="cpu",
        help="elsewhere: the ops lowered as for a GPU or TPU (XLA's convolutions and pooling, ReLU as a max), run here",
    )


def lower_as(lowering: str) -> None:
    """With ``"elsewhere"``, trace the ops as jonnx lowers them off the CPU: it asks
    ``jax.default_backend()`` while tracing (``jonnx.ops._util.lowers_for_cpu``), as the tests'
    ``lowering`` fixture does, and XLA still compiles for and runs on this CPU."""
    if lowering == "elsewhere":
        jax.default_backend = lambda: "gpu"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cases", type=int, default=500)
    parser.add_argument("--families", nargs="+", choices=sorted(FAMILIES), default=sorted(FAMILIES))
    parser.add_argument("--opset", type=int, default=21)
    parser.add_argument("--half", action="store_true", help="draw float16 wherever the families draw floats")
    parser.add_argument("--trace", action="store_true", help="print each case before running it (to find a crash)")
    parser.add_argument(
        "--long", action="store_true", help="draw one axis of each shape and some drawn lengths long (up to 64 values)"
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--grad", action="store_true", help="check derivatives against finite differences instead")
    mode.add_argument("--vmap", action="store_true", help="check jax.vmap against each row run alone instead")
    add_lowering_option(parser)
    args = parser.parse_args()
    lower_as(args.lowering)
    global FLOATS, LONG_AXIS
    if args.half:
        FLOATS = (np.float16,)
    if args.long:
        LONG_AXIS = 64
    if args.opset > onnx.defs.onnx_opset_version():
        parser.error(f"onnx {onnx.__version__} knows opsets up to {onnx.defs.onnx_opset_version()}")
    jax.config.update("jax_enable_x64", True)  # int64 and float64 exact, as ONNX defines them
    warnings.filterwarnings("ignore")
    ort.set_default_logger_severity(4)
    verdicts, _ = run(
        args.seed, args.cases, args.families, opset=args.opset, grad=args.grad, vmap=args.vmap, trace=args.trace
    )
    unchecked = {k: n for k, n in verdicts.items() if k.startswith("no reference for ")}
    invalid = {k: n for k, n in verdicts.items() if k.startswith("invalid model: ")}
    departures = {k: n for k, n in verdicts.items() if k.startswith("known departure: ")}
    counts = {k: n for k, n in verdicts.items() if k not in {**unchecked, **invalid, **departures}}
    print(f"{sum(counts.values())} cases (seed {args.seed}, opset {args.opset}): {counts}")
    if unchecked:
        print(f"no reference ran: {unchecked}")
    if invalid:
        print(f"invalid models: {invalid}")
    if departures:
        print(f"known departures: {departures}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
