"""Four-bit weights: NF4 (QLoRA, arXiv 2305.14314) and GGUF's Q4_0 / Q4_1 / Q4_K blocks.

A `Packed4` stands for a params layer matrix W [..., I, O] (y = x @ W) and stores it
output-major, as GGUF and torch do: `codes` uint8 [..., O, I / 2] (two 4-bit codes a
byte) and scales per block of inputs. Within each run of 2 * half inputs, byte j holds
input j in its low nibble and input j + half in its high one (GGUF's order: half 16 for
Q4_0 / Q4_1, 32 for Q4_K; NF4 uses half its block).

Formats (`fmt`) and their `scales` (arrays [..., O, I / block] unless said):
  "nf4"    absmax float32 (block 64; `quantize_layers` takes 32 where the inputs are
           not a multiple of 64, as in the tiny test models): w = NF4[code] * absmax
  "nf4_dq" absmax double-quantised: q int8 [..., O, I / 64]; per DQ_GROUP consecutive
           scales of the flattened [O * I / 64], scale2 float32 [..., n2]; a float32
           mean [...]: absmax = q * scale2 + mean (the paper's second level, with int8
           codes in place of its 8-bit floats)
  "q4_0"   d float16 (block 32): w = (code - 8) * d
  "q4_1"   d, m float16 (block 32): w = code * d + m
  "q4_k"   d, dmin float16 (block 256); sc, m uint8, 6 bits (block 32):
           w = code * (d * sc) - dmin * m
Every format is evaluated as code * scale + shift (NF4: NF4[code] * absmax) with
float32 scale and shift per input; for the GGUF formats code * scale and the scale are
exact in float32, so only the final add rounds, as in `gguf.quants.dequantize`: the
values agree bit for bit (tests/test_quant4.py).

`dense4` never interleaves the nibbles back: it splits the activations by nibble
position instead and runs two dots over [O, I / 2] halves, each dequantised by one
elementwise fusion (XLA:CPU emits the dot as a library call, so each half is written
to a buffer before its dot reads it: `dense4`'s docstring); its backward pass (LoRA over
a frozen 4-bit base, QLoRA) dequantises again rather than keep those halves.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from rlpost.models import quant

# NF4's 16 levels: arXiv 2305.14314 Appendix E (bitsandbytes' table), float32.
NF4_LEVELS = np.array(
  [
    -1.0,
    -0.6961928009986877,
    -0.5250730514526367,
    -0.39491748809814453,
    -0.28444138169288635,
    -0.18477343022823334,
    -0.09105003625154495,
    0.0,
    0.07958029955625534,
    0.16093020141124725,
    0.24611230194568634,
    0.33791524171829224,
    0.44070982933044434,
    0.5626170039176941,
    0.7229568362236023,
    1.0,
  ],
  np.float32,
)
NF4_BLOCK = 64
DQ_GROUP = 256  # first-level scales per second-level scale
FORMATS = ("nf4", "nf4_dq", "q4_0", "q4_1", "q4_k")
_STATIC = {"static": True}


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Packed4:
  """W [..., I, O] as codes uint8 [..., O, I / 2] and `scales` (module docstring) in
  format `fmt` (static)."""

  codes: jax.Array
  scales: dict
  fmt: str = dataclasses.field(default="nf4", metadata=_STATIC)

  def __post_init__(self):
    if self.fmt not in FORMATS:
      raise ValueError(f"Packed4.fmt={self.fmt!r}: use one of {FORMATS}")

  @property
  def shape(self) -> tuple[int, ...]:
    """The shape of the params leaf it stands for, [..., I, O]."""
    *lead, O, half_I = self.codes.shape
    return (*lead, 2 * half_I, O)

  @property
  def nbytes(self) -> int:
    """Bytes of codes and scales together."""
    return sum(int(a.size) * a.dtype.itemsize for a in jax.tree.leaves(self))


def half(w: Packed4) -> int:
  """Inputs per nibble run (module docstring): half an NF4 / Q4_0 / Q4_1 block, 32 for
  Q4_K."""
  if w.fmt == "q4_k":
    return 32
  first = w.scales["q" if w.fmt == "nf4_dq" else "absmax" if w.fmt == "nf4" else "d"]
  return w.codes.shape[-1] // first.shape[-1]


def pack_codes(codes: jax.Array, half: int) -> jax.Array:
  """Codes [..., I] (values 0..15) -> bytes [..., I / 2] in the nibble order above."""
  *lead, I = codes.shape
  c = codes.astype(jnp.uint8).reshape(*lead, I // (2 * half), 2, half)
  return (c[..., 0, :] | (c[..., 1, :] << 4)).reshape(*lead, I // 2)


def split_inputs(x: jax.Array, half: int) -> tuple[jax.Array, jax.Array]:
  """x [..., I] -> (the inputs under low nibbles, those under high ones), each [..., I / 2]."""
  *lead, I = x.shape
  runs = x.reshape(*lead, I // (2 * half), 2, half)
  return runs[..., 0, :].reshape(*lead, I // 2), runs[..., 1, :].reshape(*lead, I // 2)


def quantize_nf4(w_IxO: jax.Array, double: bool = False, block: int = NF4_BLOCK) -> Packed4:
  """NF4 codes of W [..., I, O] (I a multiple of `block`), one absmax per block of inputs
  and output; the nearest level wins (ties to the lower). `double`: "nf4_dq"."""
  I = w_IxO.shape[-2]
  if I % block or block % 2:
    raise ValueError(f"quantize_nf4: input size {I} is not a multiple of the block {block}")
  w_OxI = jnp.swapaxes(w_IxO.astype(jnp.float32), -1, -2)
  blocks = w_OxI.reshape(*w_OxI.shape[:-1], I // block, block)
  absmax = jnp.max(jnp.abs(blocks), axis=-1)
  absmax = jnp.where(absmax > 0, absmax, 1.0)
  normed = (blocks / absmax[..., None])[..., None]
  mids = jnp.asarray((NF4_LEVELS[1:] + NF4_LEVELS[:-1]) / 2).reshape((1,) * blocks.ndim + (15,))
  codes = jnp.sum(normed > mids, axis=-1)
  packed = pack_codes(codes.reshape(w_OxI.shape), block // 2)
  if not double:
    return Packed4(packed, {"absmax": absmax}, "nf4")
  return Packed4(packed, double_quantize(absmax), "nf4_dq")


def _flat_groups(a_OxG: jax.Array) -> jax.Array:
  """[..., O, G] -> [..., n2, DQ_GROUP], the flattened scales zero-padded."""
  *lead, O, G = a_OxG.shape
  n2 = -(-(O * G) // DQ_GROUP)
  flat = jnp.pad(a_OxG.reshape(*lead, O * G), [(0, 0)] * len(lead) + [(0, n2 * DQ_GROUP - O * G)])
  return flat.reshape(*lead, n2, DQ_GROUP)


def _unflatten(groups: jax.Array, shape: tuple[int, ...]) -> jax.Array:
  *lead, O, G = shape
  return groups.reshape(*lead, -1)[..., : O * G].reshape(shape)


def double_quantize(absmax_OxG: jax.Array) -> dict:
  """The second level: absmax [..., O, G] -> {"q", "scale2", "mean"} (module docstring);
  each group's int8 scale is its centred absmax / 127."""
  mean = jnp.mean(absmax_OxG, axis=(-2, -1))
  groups = _flat_groups(absmax_OxG - mean[..., None, None])
  m = jnp.max(jnp.abs(groups), axis=-1)
  scale2 = jnp.where(m > 0, m / 127.0, 1.0)
  q = jnp.clip(jnp.round(groups / scale2[..., None]), -127, 127).astype(jnp.int8)
  return {"q": _unflatten(q, absmax_OxG.shape), "scale2": scale2, "mean": mean}


def absmax(w: Packed4) -> jax.Array:
  """An NF4 matrix's first-level scales [..., O, I / 64] float32."""
  if w.fmt == "nf4":
    return w.scales["absmax"]
  q = w.scales["q"]
  groups = _flat_groups(q).astype(jnp.float32) * w.scales["scale2"][..., None]
  return _unflatten(groups, q.shape) + w.scales["mean"][..., None, None]


def undouble(w: Packed4) -> Packed4:
  """An "nf4_dq" matrix as "nf4" (float32 absmax); other formats unchanged."""
  return Packed4(w.codes, {"absmax": absmax(w)}, "nf4") if w.fmt == "nf4_dq" else w


def _per_byte(a: jax.Array, bytes_per_block: int) -> jax.Array:
  """Per-block values [..., O, n] float32 -> per byte [..., O, n * bytes_per_block]."""
  return jnp.repeat(a.astype(jnp.float32), bytes_per_block, axis=-1)


def _nf4_value(code: jax.Array) -> jax.Array:
  """NF4_LEVELS[code] as a tree of selects on the code's bits (XLA:CPU runs a 16-entry
  gather per element several times slower)."""
  levels = [jnp.float32(v) for v in NF4_LEVELS]
  for bit in range(4):
    on = ((code >> bit) & 1) == 1
    levels = [jnp.where(on, levels[2 * j + 1], levels[2 * j]) for j in range(len(levels) // 2)]
  return levels[0]


def halves(w: Packed4) -> tuple[jax.Array, jax.Array]:
  """The float32 values under the low and under the high nibbles, each [..., O, I / 2]."""
  lo, hi = w.codes & 15, w.codes >> 4
  s = w.scales
  if w.fmt in ("nf4", "nf4_dq"):
    scale = _per_byte(absmax(w), half(w))
    return _nf4_value(lo) * scale, _nf4_value(hi) * scale
  if w.fmt == "q4_k":  # byte run r (32 bytes): low nibbles in sub-block 2r, high in 2r + 1
    d, dmin = _per_byte(s["d"], 128), _per_byte(s["dmin"], 128)
    sc, m = s["sc"], s["m"]
    pair = lambda a, k: _per_byte(a[..., k::2], 32)
    parts = [(d * pair(sc, k), -(dmin * pair(m, k))) for k in (0, 1)]
  else:
    d = _per_byte(s["d"], 16)
    shift = _per_byte(s["m"], 16) if w.fmt == "q4_1" else -8.0 * d
    parts = [(d, shift)] * 2
  return tuple(c.astype(jnp.float32) * scale + shift for c, (scale, shift) in zip((lo, hi), parts))


def dequantize(w: Packed4) -> jax.Array:
  """The float32 matrix W [..., I, O] that `w` stands for."""
  return jnp.swapaxes(merge_inputs(*halves(w), half(w)), -1, -2)


def concatenate_outputs(parts: list[Packed4]) -> Packed4:
  """Matrices with the same inputs side by side: [I, O1], [I, O2] -> [I, O1 + O2]
  (double-quantised scales are expanded first, `undouble`)."""
  parts = [undouble(p) for p in parts]
  fmts = sorted({p.fmt for p in parts})
  if len(fmts) != 1:
    raise ValueError(f"quant4.concatenate_outputs: formats differ ({fmts}); use one format")
  cat = lambda *a: jnp.concatenate(a, axis=-2)
  scales = jax.tree.map(cat, *[p.scales for p in parts])
  return Packed4(cat(*[p.codes for p in parts]), scales, fmts[0])


def merge_inputs(lo: jax.Array, hi: jax.Array, half: int) -> jax.Array:
  """Inverse of `split_inputs`: ([..., I / 2], [..., I / 2]) -> [..., I]."""
  *lead, n = lo.shape
  runs = jnp.stack([lo.reshape(*lead, n // half, half), hi.reshape(*lead, n // half, half)], -2)
  return runs.reshape(*lead, 2 * n)


def _dot_t(a_NxK: jax.Array, b_OxK: jax.Array) -> jax.Array:
  return jax.lax.dot_general(
    a_NxK, b_OxK, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32
  )


@jax.custom_vjp
def _dense4_rows(x_NxI: jax.Array, w: Packed4) -> jax.Array:
  x_lo, x_hi = split_inputs(x_NxI, half(w))
  w_lo, w_hi = halves(w)
  return _dot_t(x_lo, w_lo) + _dot_t(x_hi, w_hi)


def _dense4_fwd(x_NxI, w):
  return _dense4_rows(x_NxI, w), w


def _dense4_bwd(w, g_NxO):
  """dx = g @ W.T, its halves dequantised again from the codes: autodiff would keep the
  forward's float32 halves as residuals, a float copy of the frozen base for the backward
  pass. The weights get no gradient (a frozen base: zeros, float0 for the codes)."""
  w_lo, w_hi = halves(w)
  dot = lambda g, b: jnp.matmul(g, b, preferred_element_type=jnp.float32)
  dx = merge_inputs(dot(g_NxO, w_lo), dot(g_NxO, w_hi), half(w))
  zero = lambda a: (
    np.zeros(a.shape, jax.dtypes.float0)
    if jnp.issubdtype(a.dtype, jnp.integer)
    else jnp.zeros_like(a)
  )
  return dx, jax.tree.map(zero, w)


_dense4_rows.defvjp(_dense4_fwd, _dense4_bwd)


def dense4(x: jax.Array, w: Packed4) -> jax.Array:
  """x [..., I] @ W [I, O] -> [..., O] float32, for a Packed4 W (no leading axes).

  Two dots, x's low-nibble inputs against `halves(w)[0]` and its high-nibble inputs
  against `halves(w)[1]`, in float32. XLA:CPU fuses each half's dequantisation into one
  elementwise loop and materialises its [O, I / 2] float32 output for the dot (a library
  call that fuses no producer); written as a multiply-and-reduce instead, nothing is
  materialised but XLA:CPU's reduction ran ~30x slower (issue 70's notes). The backward
  pass (x only) dequantises again instead of keeping the halves (`_dense4_bwd`)."""
  lead, I = x.shape[:-1], x.shape[-1]
  y = _dense4_rows(x.reshape(-1, I).astype(jnp.float32), w)
  return y.reshape(*lead, w.codes.shape[-2])


def nf4_block(inputs: int) -> int:
  """NF4's block for a matrix with `inputs` rows: 64, or 32 where 64 does not divide them
  (the tiny test models); ValueError when 32 does not either."""
  if inputs % 32:
    raise ValueError(
      f"4-bit weights: {inputs} inputs are not a multiple of 32 (NF4 blocks of 64, or 32); "
      "use float32 or int8 weights for this model"
    )
  return NF4_BLOCK if inputs % NF4_BLOCK == 0 else 32


_quantize_stack = jax.jit(quantize_nf4, static_argnames=("double", "block"))


def requantized(w: Packed4, delta_IxO: jax.Array) -> Packed4:
  """NF4 of dequantize(w) + delta (e.g. LoRA's scale * A @ B), [..., I, O], in w's NF4
  block (a GGUF format gets `nf4_block`'s), one matrix at a time (`lax.map` over the
  leading axes): done on a whole stack [L, I, O] at once, its float32 values and
  `quantize_nf4`'s temporaries were live together (1.09 GiB merging Gemma 3 270M's
  adapters). Each matrix's result is the one the whole stack gets (its scales are its own)."""
  return _per_matrix(w, (delta_IxO,), lambda d: d)


def lora_requantized(w: Packed4, a_IxR: jax.Array, b_RxO: jax.Array, scale: float) -> Packed4:
  """`requantized(w, scale * a @ b)` with the product made inside the per-matrix loop:
  w [..., I, O] 4-bit, a [..., I, R], b [..., R, O] (any float dtype; the product in
  float32). Given whole, a stack's delta is one float32 [L, I, O] operand of the loop,
  live for the whole merge (Gemma 3 1B's gate, up and down: 0.77 GiB each); here it is
  one matrix's [I, O] at a time."""
  product = lambda a, b: scale * jnp.matmul(a.astype(jnp.float32), b.astype(jnp.float32))
  return _per_matrix(w, (a_IxR, b_RxO), product)


def _per_matrix(w: Packed4, operands: tuple, delta_of) -> Packed4:
  """NF4 of dequantize(w) + delta_of(*operands) [I, O] for each matrix of w's leading
  axes (`lax.map`; operands share them), in w's NF4 block (`requantized`)."""
  block = 2 * half(w) if w.fmt in ("nf4", "nf4_dq") else nf4_block(w.shape[-2])
  one = lambda t: quantize_nf4(dequantize(t[0]) + delta_of(*t[1:]), w.fmt == "nf4_dq", block)
  lead = w.codes.shape[:-2]
  if not lead:
    return one((w, *operands))
  flat = jax.tree.map(lambda a: a.reshape(-1, *a.shape[len(lead) :]), (w, *operands))
  return jax.tree.map(lambda a: a.reshape(*lead, *a.shape[1:]), jax.lax.map(one, flat))


def quantize_layers(params, double: bool = False):
  """`params` with every float layer matrix stack [L, I, O] as NF4 (`quantize_nf4`, block
  `nf4_block(I)`, one program per stack); a Packed4 already there (a GGUF's Q4 blocks) is
  kept. ValueError naming the matrix whose inputs 32 does not divide."""
  layers = dict(params["layers"])
  for name, w in layers.items():
    if isinstance(w, Packed4) or w.ndim != 3:
      continue
    try:
      block = nf4_block(w.shape[1])
    except ValueError as e:
      raise ValueError(f"layer matrix {name!r}: {e}") from None
    layers[name] = _quantize_stack(w, double=double, block=block)
  return {**params, "layers": layers}


def frozen_base(params, embed_dtype: str = "float32"):
  """QLoRA's frozen base (`model.base_bits=4`): the layer matrices NF4 (`quantize_layers`),
  the embedding (and an untied output projection) cast to `embed_dtype`.

  With the trainer's matmuls in bfloat16 the output projection reads the embedding's
  bfloat16 rounding anyway (`ops.logprobs`), so keeping it in "bfloat16" leaves that
  product unchanged, halves its bytes (Gemma 3 270M: [262144, 640], 0.625 -> 0.31 GiB)
  and changes only the input rows: mean |dlogprob| 0.004 nats per token on the shared
  Gemma 3 fixture prompts, against 0.46 between NF4 and the float32 layers."""
  out = quantize_layers(params)
  for name in ("embed", "output"):
    if name in out:
      out[name] = out[name].astype(embed_dtype)
  return out


def sampling_parts(params, requantize: bool = True):
  """(unembed, {name: Packed4}): what `for_sampling` adds, alone, so a program making it
  outputs no copy of the weights it keeps (embedding, norms, float matrices)."""
  layers = quantize_layers(params)["layers"] if requantize else params["layers"]
  output = params["output"] if "output" in params else params["embed"]
  packed = {k: w for k, w in layers.items() if isinstance(w, Packed4)}
  return quant.quantize_rows(output), packed


def for_sampling(params, requantize: bool = True):
  """The sampler's 4-bit copy: layer matrices NF4 (`quantize_layers`; with
  `requantize=False` only the Packed4 already there are 4-bit, the rest stays as given)
  and the output projection as `quant.quantize_rows`'s int8 copy under "unembed" (in
  float32 it would be most of a small model's bytes per token: Gemma 3 270M's [262144,
  640])."""
  unembed, packed = sampling_parts(params, requantize)
  return {**params, "unembed": unembed, "layers": {**params["layers"], **packed}}


def dequantized(params):
  """`params` with every Packed4 as its float32 matrix (and no "unembed")."""
  layers = {k: dequantize(w) if isinstance(w, Packed4) else w for k, w in params["layers"].items()}
  return {k: v for k, v in params.items() if k != "unembed"} | {"layers": layers}
