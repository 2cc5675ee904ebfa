"""lm-eval backend `golinear-press`: the full-attention model with its KV cache compressed by a kvpress press.

It extends `golinear-hf` (same loader, same tokenization) and replaces only generation: each prompt is split
at its question (tasks.ruler.split, from the task's own template), its context compressed under the press to the
cache budget, then decoded greedily. `generation=static` (the default) decodes a batch of prompts on the static-cache
decoder full-static uses (models.kv_compression.static_decode: each row its own kept entries, CUDA graph on CUDA);
`generation=dynamic` one prompt at a time on Hugging Face's DynamicCache (models.kv_compression.generate, the
definition; the same tokens, tests/test_kv_compression.py). Scoring requests (loglikelihood) are
refused: a press compresses after the prompt is read, so scoring inside the prompt would be full attention under
another name.
"""
from __future__ import annotations

from lm_eval.api.registry import register_model
from tqdm import tqdm

from golinear.bench.backends.lm_backend import GolinearHF
from golinear.models.spec import ModelSpec


@register_model("golinear-press")
class PressLM(GolinearHF):
    """Full attention with a compressed KV cache: press=<name>, kv_budget=<entries>, question_aware=<bool>,
    prefill_chunk=<tokens> (0: the whole context, then compress)."""

    BACKEND = "golinear-press"

    def __init__(self, press=None, kv_budget=0, question_aware=False, prefill_chunk=0, **kwargs):
        spec = ModelSpec(press=press, kv_budget=kv_budget, question_aware=question_aware,
                         prefill_chunk=prefill_chunk)  # checked once
        self.press_spec = spec
        self._press_decoders = {}
        super().__init__(press=spec.press, kv_budget=spec.kv_budget, question_aware=spec.question_aware,
                         prefill_chunk=spec.prefill_chunk, **kwargs)
        self.golinear_info = {**self.golinear_info, "press": spec.press, "kv_budget": spec.kv_budget,
                              "question_aware": spec.question_aware, "prefill_chunk": spec.prefill_chunk}

    def loglikelihood(self, requests, disable_tqdm: bool = False):
        raise ValueError(f"press={self.press_spec.press}: KV-cache compression acts after the prompt is read, so a "
                         f"scoring task would be full attention; presses run on the long-context suites (sniah, ruler)")

    loglikelihood_rolling = loglikelihood

    def split_ids(self, task: str, prompt: str) -> tuple[list[int], int]:
        """The prompt's token ids (as tok_encode makes them) and how many of the last ones are the question: the
        tokens that end after the question's first character (a token across the boundary goes with the question)."""
        return self.split_all([(task, prompt)])[0]

    def split_all(self, prompts: list[tuple[str, str]]) -> list[tuple[list[int], int]]:
        """split_ids of many (task, prompt) pairs, tokenised in one call per special-token rule (the Rust tokenizer
        encodes a batch in parallel: one 4K prompt at a time with its offsets took 19 ms on a GPU host's CPU)."""
        from golinear.tasks.ruler.split import question_start
        bos, groups = self.tokenizer.decode(self.prefix_token_id), {}
        for i, (_, prompt) in enumerate(prompts):
            groups.setdefault(tuple(sorted(self._encode_kwargs(prompt, bos).items())), []).append(i)
        out = [None] * len(prompts)
        for kw, rows in groups.items():
            enc = self.tokenizer([prompts[i][1] for i in rows], return_offsets_mapping=True, **dict(kw))
            for i, ids, offsets in zip(rows, enc["input_ids"], enc["offset_mapping"]):
                at = question_start(*prompts[i])
                n_context = sum(1 for start, end in offsets if end <= at)
                out[i] = (list(ids), len(ids) - n_context)
        return out

    def generate_until(self, requests, disable_tqdm: bool = False):
        """Greedy, with HFLM's stop handling: the same gen_kwargs normalisation, stop strings (and EOS) and
        post-processing; a batch of prompts at a time on the static decoder (each compressed on its own: a press
        keeps different entries per prompt), or one at a time on the DynamicCache (generation=dynamic)."""
        from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs, postprocess_generated_text

        from golinear.models.decoding.batch_generate import eos_ids
        eos_text = self.tok_decode(self.eot_token_id, skip_special_tokens=False)
        eos, out = frozenset(eos_ids(self.model, self.tokenizer)), []
        size = self.batch_size if isinstance(self.batch_size, int) and self.generation == "static" else 1
        bar = tqdm(total=len(requests), disable=disable_tqdm or self.rank != 0, desc=f"press={self.press_spec.press}")
        for b0 in range(0, len(requests), size):
            batch, rows = requests[b0:b0 + size], []
            split = self.split_all([(req.task_name, req.args[0]) for req in batch])
            for req, ids_q in zip(batch, split):
                prompt, gen_kwargs = req.args
                kwargs = normalize_gen_kwargs(gen_kwargs, self.max_gen_toks)
                until = handle_stop_sequences(kwargs.pop("until", None), eos=eos_text)

                def stop(tokens, until=until):
                    return any(u in self.tok_decode(tokens, skip_special_tokens=False) for u in until)
                n = kwargs.pop("max_gen_toks")
                if kwargs.get("min_new_tokens", 0) >= n:  # stop rules off (exactly n tokens: equal work in a speed row)
                    stop, until = None, []
                rows.append((ids_q, n, stop, until))
            row_eos = [eos if stop is not None else frozenset() for _, _, stop, _ in rows]
            for req, tokens, (_, _, _, until) in zip(batch, self._generate(rows, row_eos), rows):
                text = postprocess_generated_text(generation=self.tok_decode(tokens), stop=until, think_end_token=None)
                self.cache_hook.add_partial("generate_until", req.args, text)
                out.append(text)
            bar.update(len(batch))
        bar.close()
        return out

    def _generate(self, rows, eos: list[frozenset]) -> list[list[int]]:
        """Each row's new tokens: rows of ((ids, question length), max new tokens, stop(tokens) -> bool or None, _),
        `eos` each row's end tokens (none with stop rules off)."""
        s = self.press_spec
        if self.generation == "dynamic":
            from golinear.models.kv_compression.generate import generate
            return [generate(self.model, ids, q, s.press, s.kv_budget, n, question_aware=s.question_aware, eos=e,
                             stop=stop, prefill_chunk=s.prefill_chunk) for ((ids, q), n, stop, _), e in zip(rows, eos)]
        from golinear.models.kv_compression.static_decode import PressDecoder, cut
        most = max(n for _, n, _, _ in rows)
        fill = self._fill(len(rows))  # copies of the last row (GolinearHF._fill), dropped by the zips below
        shape = (len(rows) + fill, s.kv_budget + most + 1)  # one decoder (static buffers, CUDA graph) per batch shape
        if shape not in self._press_decoders:
            self._press_decoders[shape] = PressDecoder(self.model, max_len=shape[1])
        decoder = self._press_decoders[shape]
        first = decoder.prefill([ids_q for ids_q, _, _, _ in rows], s.press, s.kv_budget, s.question_aware,
                                s.prefill_chunk, fill=fill)
        tokens = first.tolist()

        def ended(t, n, stop, e):
            return len(t) >= n or cut(t, e, stop)[1]
        while not all(ended(t, n, stop, e) for t, (_, n, stop, _), e in zip(tokens, rows, eos)):  # blocks of steps
            more = decoder.decode(min(16, most - len(tokens[0]))).tolist()
            tokens = [t + m for t, m in zip(tokens, more)]
        return [cut(t[:n], e, stop)[0] for t, (_, n, stop, _), e in zip(tokens, rows, eos)]
