"""lm-eval backends: `linearized` (a linearized model) and `golinear-hf` (full attention, same loader).

Both subclass lm-eval's HFLM the way lm_eval/models/mamba_lm.py does: HFLM is given a name and runs its own
set-up (device; under `accelerate launch` its processes split the requests), and the `_create_model` hook
builds the model with `models.load.load_model` (the embedded SmolLM2, hub ids and local folders work
for both); HFLM's batching and scoring are reused unchanged. Scoring pads on the right, which is causal-safe
for recurrent layers too. Generation (`generation=` model arg):
  - `batched` (linearized default; `golinear-hf` with it = full-static): HFLM's batches, left-padded, are
    unpadded and generated together by models.decoding.batch_generate on the static-cache decoder (right-padded
    prefill, per-row positions, per-row stop; CUDA graph on CUDA, eager on the CPU), see docs/generation.md;
    a model with retention slots (retain > 0) on models.retention.generate (the batch prefilled in one right-padded
    pass, the decode steps batched, CUDA graph on CUDA);
  - `hf` (golinear-hf's default off CUDA; on CUDA its default is `batched`): lm-eval's own batched HF generate
    (left padding is exact for softmax), the cross-check of full-static;
  - `sequential`: HF generate one sequence at a time without its padding (the old linearized path).
A prompt longer than max_length - max_gen_toks is an error naming both lengths (HFLM would cut it on the left).

    import golinear.bench.backends.lm_backend, lm_eval
    lm_eval.simple_evaluate(model="linearized", model_args="mechanism=gdn,window=64,sinks=4",
                            tasks=["golinear_piqa"], task_manager=tasks.standard.task_manager(), limit=8)

`python -m golinear.bench.backends.lm_backend run ...` is lm-eval's own CLI with these backends registered.
"""
from __future__ import annotations

import torch
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM
from lm_eval.models.utils import _add_special_kwargs, has_bos_prefix

from golinear.models.spec import LINEAR_KEYS as LINEAR_ARGS  # the spec's keys and values: models.spec, one schema
from golinear.models.spec import PRESS_KEYS, STRING_KEYS, ModelSpec

MODEL_ARGS = ("base", *LINEAR_ARGS, *PRESS_KEYS, "dtype", "device", "batch_size", "max_length", "seed", "generation")
GENERATION = {"golinear-hf": ("hf", "batched", "sequential"), "linearized": ("batched", "sequential"),
              "golinear-press": ("static", "dynamic")}
# HFLM options passed through to it (lm-eval's CLI passes some).
HFLM_ARGS = ("max_batch_size", "truncation", "logits_cache", "add_bos_token", "prefix_token_id",
             "softmax_dtype", "mixed_precision_dtype", "think_end_token",
             "enable_thinking", "chat_template_args", "trust_remote_code")
BACKENDS = ("linearized", "golinear-hf", "golinear-press")  # the last: bench.backends.press_backend
DEVICE_TYPES = ("cpu", "cuda", "mps")


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def check_device(device, here: bool = True) -> str:
    """A device string torch understands and (`here`; not for a dry run's plan) this machine has; else ValueError."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"unknown device {device!r}; allowed: cpu, cuda, cuda:N, mps") from None
    if dev.type not in DEVICE_TYPES:
        raise ValueError(f"unsupported device {device!r}; allowed: cpu, cuda, cuda:N, mps")
    if here and dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r} requested but CUDA is not available here; use device=cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"device {device!r}: only {torch.cuda.device_count()} CUDA device(s) here")
    if here and dev.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device {device!r} requested but MPS is not available here; use device=cpu")
    return str(dev)


def default_generation(backend: str, device: str) -> str:
    """Full attention (`golinear-hf`) generates on the static-cache decoder on CUDA (`batched`, = full-static: CUDA
    graph, split-K attention over each row's filled prefix; lm-eval's HF generate is the named cross-check,
    generation=hf), with HF generate elsewhere; every other backend with its first allowed form."""
    if backend == "golinear-hf":
        return "batched" if str(device).startswith("cuda") else "hf"
    return GENERATION[backend][0]


def check_model_args(backend: str, args: dict) -> dict:
    """Validate a backend's model args up front (names, dtype, device) and return them normalised."""
    return checked_model_args(backend, args)[0]


def checked_model_args(backend: str, args: dict) -> tuple[dict, ModelSpec]:
    """check_model_args, with the spec the backend builds from them (its later checks run on this one)."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown model backend {backend!r}; allowed: {list(BACKENDS)}")
    unknown = sorted(set(args) - set(MODEL_ARGS) - set(HFLM_ARGS))
    if unknown:
        raise ValueError(f"unknown model arg(s) {unknown} for {backend!r}; allowed: {list(MODEL_ARGS)} "
                         f"(and HFLM's {list(HFLM_ARGS)})")
    out = dict(args)
    out["device"] = check_device(out.get("device") or default_device())
    spec = ModelSpec.from_model_args(out)  # every value checked once, against one allowed set (models.spec)
    for k in STRING_KEYS:
        if k in out:
            v = getattr(spec, k)
            out[k] = list(v) if isinstance(v, tuple) else v
    out["dtype"] = spec.dtype
    linear = {k: v for k, v in spec.given().items() if k in LINEAR_ARGS}
    if backend in ("golinear-hf", "golinear-press") and linear:
        raise ValueError(f"{backend} is full attention; it takes no linearization args, got {sorted(linear)} "
                         f"(use model 'linearized')")
    if (backend == "golinear-press") != (spec.press is not None):
        raise ValueError(f"model '{backend}' takes no press=; KV-cache compression is model 'golinear-press'"
                         if spec.press else "model 'golinear-press' needs press=<name> and kv_budget=<entries>")
    allowed = GENERATION[backend]
    out["generation"] = out.get("generation") or default_generation(backend, out["device"])
    if out["generation"] not in allowed:
        raise ValueError(f"generation={out['generation']!r} for {backend!r}; allowed: {list(allowed)} (left-padded HF "
                         "generate would let padding into a linearized model's state)" if backend == "linearized"
                         else f"generation={out['generation']!r} for {backend!r}; allowed: {list(allowed)}")
    if backend == "linearized" and not (out.get("checkpoint") or out.get("mechanism")):
        raise ValueError("model 'linearized' needs checkpoint=<folder> or mechanism=<name> "
                         "(full attention is model 'golinear-hf')")
    spec.check_buildable()  # a press's budget, a checkpoint's cache options (models.spec)
    return out, spec


def padded_width(n: int) -> int:
    """The prefill width of a batch whose longest prompt has n tokens, on CUDA: n rounded up to a multiple of
    2^(bits(n-1) - 4) (at least 64), i.e. at most 12.5 % of padding. Each new width costs kernel and attention-plan
    builds (0.2-0.6 s on the H200), so a suite's batches of similar lengths (4K S-NIAH: 3,9xx tokens) share one."""
    g = max(64, 1 << max(0, (n - 1).bit_length() - 4))
    return -(-n // g) * g


def encode_ids(tokenizer, texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
    """tokenizer(texts)["input_ids"]; for a fast tokenizer without padding or truncation set, through its Rust
    encode_batch_fast (the same ids without the character offsets: ~25 % less time on 4K prompts). The parallel
    encode stays on: TOKENIZERS_PARALLELISM is set when `models` is imported (models/__init__.py says why)."""
    rust = getattr(tokenizer, "backend_tokenizer", None)
    if (rust is None or rust.padding or rust.truncation or not hasattr(rust, "encode_batch_fast")
            or rust.encode_special_tokens != bool(getattr(tokenizer, "split_special_tokens", False))):
        return tokenizer(texts, add_special_tokens=add_special_tokens)["input_ids"]
    return [e.ids for e in rust.encode_batch_fast(texts, add_special_tokens=add_special_tokens)]


def unpadded(context: torch.Tensor, mask: torch.Tensor | None) -> list[list[int]]:
    """Each row's real tokens (mask 1) from a padded batch, through one device-to-host copy of the batch (a boolean
    index and a copy per row cost a device sync per row on CUDA, and up to 0.34 s per 32 x 4K batch on a loaded
    2-core CPU with two torch threads)."""
    if mask is None:
        return context.tolist()
    lens, keep = mask.sum(1), mask.bool()
    cols = torch.arange(context.shape[1], device=context.device)
    ids, n = context.tolist(), lens.tolist()
    if torch.equal(keep, cols >= context.shape[1] - lens[:, None]):  # left padding (HFLM's)
        return [r[len(r) - k:] for r, k in zip(ids, n)]
    if torch.equal(keep, cols < lens[:, None]):
        return [r[:k] for r, k in zip(ids, n)]
    return [[t for t, k in zip(r, m) if k] for r, m in zip(ids, keep.tolist())]


def with_continuations(context: torch.Tensor, outs: list[list[int]], pad: int) -> torch.Tensor:
    """[B, W + longest new]: the padded context, then each row's new tokens padded on the right with `pad` (HFLM
    slices the continuation at the context's width W). One host-to-device copy and one concatenation."""
    from golinear.models.decoding.batch_generate import pad_rows
    new, _ = pad_rows(outs, pad)
    return torch.cat([context, new.to(device=context.device, dtype=context.dtype)], 1)


def _register(*names):
    """register_model, except when this file runs as the lm-eval CLI wrapper (`python -m`): the wrapper
    imports bench.backends.lm_backend itself, and lm-eval refuses a second class under the same name."""
    return (lambda cls: cls) if __name__ == "__main__" else register_model(*names)


@_register("golinear-hf")
class GolinearHF(HFLM):
    """Full attention on the golinear backbone loader (the baseline every linearized row is compared to)."""

    BACKEND = "golinear-hf"
    fill_batches: bool | None = None  # fill a short last batch to the batch size (_fill); None: on CUDA

    def __init__(self, base=None, dtype="float32", device=None, batch_size=1, max_length=None, seed=0, **kwargs):
        args = check_model_args(self.BACKEND, {"base": base, "dtype": dtype, "device": device, **kwargs})
        self.generation = args.pop("generation")
        self._decoders = {}  # batch size -> FastDecoder: one set of static buffers and one CUDA graph per shape
        spec = {k: args.pop(k) for k in ("base", *LINEAR_ARGS, "dtype", "device") if k in args}
        if spec.get("base") is None:
            spec.pop("base", None)  # load_model's default, or the checkpoint's own base
        self.golinear_spec, self._seed = spec, int(seed)
        hf_kwargs = {k: v for k, v in args.items() if k in HFLM_ARGS and k != "trust_remote_code"}
        # a name, not a module: HFLM then runs its own set-up (accelerate's processes, device) and calls the
        # _get_config / _create_tokenizer / _create_model hooks below, which build the golinear model
        super().__init__(pretrained=spec.get("checkpoint") or self._base(), backend="causal", dtype=spec["dtype"],
                         device=spec["device"], batch_size=batch_size, max_length=max_length, **hf_kwargs)
        acc = getattr(self, "accelerator", None)
        if acc is not None and acc.num_processes > 1 and self._world_size == 1:
            # HFLM assigns ranks only when it sees more than one GPU; CPU processes (gloo) split the work too
            self._rank, self._world_size = acc.process_index, acc.num_processes

    def _base(self) -> str:
        """The backbone: the spec's, else the checkpoint's own, else the embedded default."""
        from golinear.models.spec import ModelSpec
        return ModelSpec(base=self.golinear_spec.get("base"), checkpoint=self.golinear_spec.get("checkpoint")).base_name

    def _get_config(self, pretrained, **kwargs):
        """The backbone's config, read without weights (the golinear loader resolves the embedded GGUF)."""
        from golinear.models.spec.backbone_checks import backbone_config
        self._config = backbone_config(self._base())

    def _create_tokenizer(self, pretrained, tokenizer, **kwargs):
        """Nothing yet: the tokenizer comes with the model from the golinear loader (_create_model)."""

    def _create_model(self, pretrained, dtype="float32", **kwargs):
        """The golinear model on HFLM's device (under accelerate, this process's own), with its provenance.
        New (untrained) parameters are initialised from `seed` without touching the global RNG."""
        from golinear.models.load import load_model
        spec = {**self.golinear_spec, "dtype": dtype, "device": str(self._device)}
        model, tokenizer, info = load_model(**spec, **({"seed": self._seed} if spec.get("mechanism") else {}))
        self._model, self.tokenizer, self._config = model, tokenizer, model.config
        self._device = model.device  # "cuda" -> "cuda:0": the device the provenance has always recorded
        self.golinear_info = {**info, "init_seed": self._seed}

    def loglikelihood(self, requests, disable_tqdm: bool = False):
        """HFLM's, with every string tokenized up front in batches: lm-eval encodes one request at a time,
        which took minutes for 5-shot MMLU's 56k requests; the Rust tokenizer encodes a batch in parallel."""
        self._encoded = self._encode_batched([req.args for req in requests])
        try:
            return super().loglikelihood(requests, disable_tqdm=disable_tqdm)
        finally:
            self._encoded = {}

    def _encode_batched(self, pairs) -> dict:
        """{string: token ids, as tok_encode(string) gives them} for the strings HFLM's _encode_pair encodes."""
        strings = set()
        for context, continuation in pairs:
            if context:  # _encode_pair moves the context's trailing spaces to the continuation
                stripped = context.rstrip()
                strings.update((stripped, context + continuation))
        return self._encode_strings(strings)

    def _encode_kwargs(self, text: str, bos: str) -> dict:
        """tok_encode's rule for a string: the tokenizer's own special tokens, none if it starts with `bos` (the
        BOS text, decoded once by the caller, not once per string)."""
        kw = _add_special_kwargs(None, self.add_bos_token)
        if has_bos_prefix(text, bos):
            kw["add_special_tokens"] = False
        return kw

    def _encode_strings(self, strings, chunk: int = 2048) -> dict:
        """{string: tok_encode(string)}, encoded in batches (one tokenizer call per chunk of strings)."""
        by_kwargs, bos = {}, self.tokenizer.decode(self.prefix_token_id)
        for text in sorted(set(strings)):
            by_kwargs.setdefault(tuple(sorted(self._encode_kwargs(text, bos).items())), []).append(text)
        out = {}
        for kw, texts in by_kwargs.items():
            for i in range(0, len(texts), chunk):
                out.update(zip(texts[i:i + chunk], encode_ids(self.tokenizer, texts[i:i + chunk], **dict(kw))))
        return out

    def tok_encode(self, string, add_special_tokens=None, left_truncate_len=None, **kwargs):
        ids = getattr(self, "_encoded", {}).get(string) if add_special_tokens is None and not kwargs else None
        if ids is None:
            return super().tok_encode(string, add_special_tokens, left_truncate_len, **kwargs)
        return list(ids[-left_truncate_len:] if left_truncate_len else ids)

    def _model_call(self, inps, attn_mask=None, labels=None):
        # no KV cache while scoring: one forward pass over the whole (right-padded) batch
        with torch.no_grad(), torch.autocast(device_type=self.device.type, dtype=self.mixed_precision_dtype,
                                             enabled=self.mixed_precision_dtype is not None):
            return self.model(inps, use_cache=False).logits

    # ------------------------------------------------------------------ generation
    def generate_until(self, requests, disable_tqdm: bool = False):
        """HFLM's, with every context tokenized up front in batches: lm-eval encodes each prompt twice, one at a
        time (its sort key, then its batch), which was most of a batched 4K S-NIAH run's wall time on the H200."""
        self._encoded = self._encode_strings([req.args[0] for req in requests])
        try:
            return super().generate_until(requests, disable_tqdm=disable_tqdm)
        finally:
            self._encoded = {}

    def tok_batch_encode(self, strings, padding_side="left", left_truncate_len=None, truncation=False):
        """HFLM's (from the contexts encoded up front when the batch's special-token rule is each string's), except
        that a prompt longer than left_truncate_len (max_length - max_gen_toks) is an error instead of a silent
        left cut."""
        ids, mask = self._batch_from_cache(strings, padding_side) if not truncation else (None, None)
        if ids is None:
            ids, mask = super().tok_batch_encode(strings, padding_side=padding_side, truncation=truncation)
        if left_truncate_len and ids.shape[1] > left_truncate_len:
            n = int(mask.sum(1).max())
            raise ValueError(f"a prompt of {n} tokens is longer than the {left_truncate_len} this model allows "
                             f"(max_length {self.max_length} - {self.max_length - left_truncate_len} tokens to "
                             f"generate); shorten the prompt or raise max_length")
        return ids, mask

    def _batch_from_cache(self, strings, padding_side):
        """(ids, mask) padded as the tokenizer pads them, from the cached encodings; (None, None) if a string is
        not cached or HFLM's batch rule for special tokens (decided by the first string) differs from its own."""
        cache = getattr(self, "_encoded", {})
        if not cache or any(s not in cache for s in strings):
            return None, None
        batch_kw = {}
        if has_bos_prefix(strings[0], getattr(self.tokenizer, "bos_token", None)):
            batch_kw = {"add_special_tokens": False}
        elif self.add_bos_token is not None:
            batch_kw = {"add_special_tokens": self.add_bos_token}
        bos = self.tokenizer.decode(self.prefix_token_id)
        if any(self._encode_kwargs(s, bos) != batch_kw for s in strings):
            return None, None
        from golinear.models.decoding.batch_generate import pad_rows
        return pad_rows([cache[s] for s in strings], self.tokenizer.pad_token_id, padding_side)

    def _model_generate(self, context, max_length, stop, **generation_kwargs):
        """lm-eval's batched HF generate (`hf`), one sequence at a time (`sequential`), or the batched static-cache
        decoder (`batched`). Returns [B, width + new tokens]: each row's left-padded context, then its new tokens
        padded on the right (HFLM slices the continuation at the padded context width)."""
        if self.generation == "hf":
            return super()._model_generate(context, max_length, stop, **generation_kwargs)
        mask = generation_kwargs.pop("attention_mask", None)
        new_tokens = max_length - context.shape[1]
        if self.generation == "sequential":
            mask = torch.ones_like(context) if mask is None else mask
            prompts = [ids[keep.bool()] for ids, keep in zip(context, mask)]
            outs = [super(GolinearHF, self)._model_generate(
                p[None], max_length=len(p) + new_tokens, stop=stop, attention_mask=torch.ones_like(p[None]),
                **dict(generation_kwargs))[0, len(p):].tolist() for p in prompts]
        else:
            outs = self._generate_batched(unpadded(context, mask), new_tokens, stop, generation_kwargs)
        pad = self.tokenizer.pad_token_id
        return with_continuations(context, outs, self.eot_token_id if pad is None else pad)

    def _generate_batched(self, prompts, new_tokens: int, stop, generation_kwargs) -> list[list[int]]:
        from golinear.models.decoding.batch_generate import decoder_for, eos_ids, generate_batch
        if generation_kwargs.get("do_sample") or generation_kwargs.get("num_beams", 1) != 1:
            raise ValueError(f"generation=batched is greedy only; got do_sample={generation_kwargs.get('do_sample')}, "
                             f"num_beams={generation_kwargs.get('num_beams', 1)} (use generation=sequential)")
        n = len(prompts)
        prompts = prompts + [prompts[-1]] * self._fill(n)  # copies, dropped below
        decoder = self._decoders.get(len(prompts))
        if decoder is None:
            decoder = self._decoders[len(prompts)] = decoder_for(self.model)
        # full-attention layers get a KV buffer rounded up to 1024 slots: batches of similar widths share a shape
        # (and so one captured graph)
        width = padded_width(max(len(p) for p in prompts)) if self.device.type == "cuda" else max(map(len, prompts))
        pad_to = width
        decoder.max_len = -(-(width + new_tokens) // 1024) * 1024
        eos, stop = eos_ids(self.model, self.tokenizer), list(stop)
        least = generation_kwargs.get("min_new_tokens") or 0
        if least >= new_tokens:  # HF generate's min_new_tokens: no stop before it, so here no stop at all
            eos, stop = set(), []
        elif least:
            raise ValueError(f"generation=batched takes min_new_tokens only equal to the tokens to generate "
                             f"({new_tokens}: every row generates exactly that many), got {least}")
        try:
            return generate_batch(decoder, prompts, new_tokens, eos=eos, stop=stop,
                                  decode=lambda t: self.tokenizer.decode(t, skip_special_tokens=False),
                                  pad_to=pad_to)[:n]
        except torch.OutOfMemoryError:
            self._decoders.pop(len(prompts), None)
            raise ValueError(f"generation batch of {len(prompts)} prompts (longest {max(len(p) for p in prompts)} "
                             f"tokens + {new_tokens} new) does not fit in {self.device} memory; use a smaller "
                             f"batch_size or batch_size=auto") from None

    def _fill(self, n: int) -> int:
        """Copies of its last prompt that fill a batch of n to the batch size (on CUDA, `fill_batches`): a short last
        batch takes the others' shape, whose compile and CUDA graph serve it (a new shape compiles and captures again,
        for seconds); rows are independent, so a copy changes no other row's tokens."""
        size = self.batch_size if isinstance(self.batch_size, int) else 0
        fill = self.device.type == "cuda" if self.fill_batches is None else self.fill_batches
        return max(0, size - n) if fill else 0

    def get_model_info(self) -> dict:
        # HFLM's version asks the Hub for a model sha; ours is the golinear provenance instead
        return {"model_num_parameters": sum(p.numel() for p in self.model.parameters()),
                "model_dtype": str(self.model.dtype), "golinear_backend": self.BACKEND,
                "golinear_info": self.golinear_info}


@_register("linearized")
class LinearizedLM(GolinearHF):
    """A linearized model (checkpoint or explicit mechanism/options) evaluated like any HF model."""

    BACKEND = "linearized"

    def __init__(self, base=None, checkpoint=None, mechanism=None, window=0, sinks=0, short_conv=False,
                 lora=False, full_layers=None, keep_full=0.0, select="uniform", **kwargs):
        linear = dict(checkpoint=checkpoint, mechanism=mechanism, window=window, sinks=sinks,
                      short_conv=short_conv, lora=lora, full_layers=full_layers, keep_full=keep_full,
                      select=select)
        if checkpoint is not None:  # the checkpoint's config says how it was linearized
            linear = {k: v for k, v in linear.items() if k == "checkpoint" or v not in (None, 0, False, "uniform")}
        super().__init__(base=base, **linear, **kwargs)


def make_lm(backend: str, **model_args):
    """Build a backend by name (the runner's entry point); bad names/args fail before any loading."""
    check_model_args(backend, model_args)
    if backend == "golinear-press":  # its class extends these: built by bench.run.execute through lm-eval's registry
        raise ValueError("model 'golinear-press' is built by golinear.bench.backends.press_backend.PressLM (it extends this module)")
    return {"linearized": LinearizedLM, "golinear-hf": GolinearHF}[backend](**model_args)


if __name__ == "__main__":
    # lm-eval's own CLI with our backends registered (lm-eval has no plugin flag for models), e.g.
    # python -m golinear.bench.backends.lm_backend run --model linearized --model_args mechanism=gdn,window=56,sinks=8 \
    #     --include_path tasks/standard --tasks golinear_piqa --limit 8
    import golinear.bench.backends.lm_backend  # noqa: F401  registers 'linearized' and 'golinear-hf'
    from lm_eval.__main__ import cli_evaluate
    cli_evaluate()
