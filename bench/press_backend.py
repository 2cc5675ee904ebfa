"""lm-eval backend `golinear-press`: the full-attention model with its KV cache compressed by a kvpress press.

It extends `golinear-hf` (same loader, same tokenization) and replaces only generation: each prompt is split
at its question (tasks.ruler.split, from the task's own template), its context compressed under the press to the
cache budget, then decoded greedily (models.kv_compression.generate). Scoring requests (loglikelihood) are
refused: a press compresses after the prompt is read, so scoring inside the prompt would be full attention under
another name.
"""
from __future__ import annotations

from lm_eval.api.registry import register_model
from tqdm import tqdm

from golinear.bench.lm_backend import GolinearHF
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
        from golinear.tasks.ruler.split import question_start
        at = question_start(task, prompt)
        kw = self._encode_kwargs(prompt, self.tokenizer.decode(self.prefix_token_id))
        enc = self.tokenizer(prompt, return_offsets_mapping=True, **kw)
        n_context = sum(1 for start, end in enc["offset_mapping"] if end <= at)
        return list(enc["input_ids"]), len(enc["input_ids"]) - n_context

    def generate_until(self, requests, disable_tqdm: bool = False):
        """One prompt at a time (a press keeps a different set of entries per prompt), greedy, with HFLM's stop
        handling: the same gen_kwargs normalisation, stop strings (and EOS) and post-processing."""
        from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs, postprocess_generated_text

        from golinear.models.decoding.batch_generate import eos_ids
        from golinear.models.kv_compression.generate import generate
        eos_text = self.tok_decode(self.eot_token_id, skip_special_tokens=False)
        eos, out = frozenset(eos_ids(self.model, self.tokenizer)), []
        for req in tqdm(requests, disable=disable_tqdm or self.rank != 0, desc=f"press={self.press_spec.press}"):
            prompt, gen_kwargs = req.args
            kwargs = normalize_gen_kwargs(gen_kwargs, self.max_gen_toks)
            until = handle_stop_sequences(kwargs.pop("until", None), eos=eos_text)
            ids, question_len = self.split_ids(req.task_name, prompt)

            def stop(tokens, until=until):
                text = self.tok_decode(tokens, skip_special_tokens=False)
                return any(u in text for u in until)
            new = generate(self.model, ids, question_len, self.press_spec.press, self.press_spec.kv_budget,
                           kwargs.pop("max_gen_toks"), question_aware=self.press_spec.question_aware, eos=eos,
                           stop=stop, prefill_chunk=self.press_spec.prefill_chunk)
            text = postprocess_generated_text(generation=self.tok_decode(new), stop=until, think_end_token=None)
            self.cache_hook.add_partial("generate_until", (prompt, gen_kwargs), text)
            out.append(text)
        return out
