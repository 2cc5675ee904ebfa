"""Aggregation tasks (RULER HEAD): variable tracking (VT), common words (CWE), frequent words (FWE).

Ports of scripts/data/synthetic/{variable_tracking,common_words_extraction,freq_words_extraction}.py.
"""
from __future__ import annotations

import string

import numpy as np

from .base import Generator, binary_search, fit_sample
from .constants import NOISE, TEMPLATES
from .resources import cwe_words


class VariableTracking(Generator):
    family = 'variable_tracking'

    def __init__(self, tokenizer, max_seq_length, seed, data_dir, *, type_haystack='noise',
                 num_chains=1, num_hops=4):
        super().__init__(tokenizer, max_seq_length, seed, data_dir)
        if type_haystack != 'noise':
            raise ValueError(f"VT haystack {type_haystack!r} not supported; allowed: noise")
        self.num_chains, self.num_hops = num_chains, num_hops

    def generate_chains(self, is_icl: bool):
        k = 5 if not is_icl else 3
        num_hops = self.num_hops if not is_icl else min(10, self.num_hops)
        num_vars = (num_hops + 1) * self.num_chains
        vars_all = [''.join(self.rng.choices(string.ascii_uppercase, k=k)).upper() for _ in range(num_vars)]
        while len(set(vars_all)) < num_vars:
            vars_all.append(''.join(self.rng.choices(string.ascii_uppercase, k=k)).upper())
        vars_ret, chains_ret = [], []
        for i in range(0, len(vars_all), num_hops + 1):
            this_vars = vars_all[i:i + num_hops + 1]
            vars_ret.append(this_vars)
            if is_icl:
                chain = [f"VAR {this_vars[0]} = 12345"]
            else:
                chain = [f"VAR {this_vars[0]} = {str(self.np_rng.randint(10000, 99999))}"]
            for j in range(num_hops):
                chain.append(f"VAR {this_vars[j + 1]} = VAR {this_vars[j]} ")
            chains_ret.append(chain)
        return vars_ret, chains_ret

    def generate_input_output(self, num_noises: int, is_icl: bool = False):
        variables, chains = self.generate_chains(is_icl)
        value = chains[0][0].split("=")[-1].strip()
        sentences = [NOISE] * num_noises
        for chain in chains:
            positions = list(sorted(self.rng.sample(range(len(sentences)), len(chain))))
            for insert_pi, j in zip(positions, range(len(chain))):
                sentences.insert(insert_pi + j, chain[j])
        context = "\n".join(sentences).replace(". \n", ".\n")
        text = self.template.format(context=context, query=value, num_v=self.num_hops + 1)
        placed = [i for i, s in enumerate(sentences) if s != NOISE]
        info = dict(needles=[sentences[i] for i in placed], positions=placed,
                    depths=[round(100 * i / len(sentences), 2) for i in placed],
                    haystack_size=num_noises, num_units=len(sentences))
        return text, variables[0], info

    def randomize_icl(self, icl_example: str) -> str:
        for item in icl_example.strip().split()[-self.num_hops - 1:]:
            new_item = ''.join(self.rng.choices(string.ascii_uppercase, k=len(item))).upper()
            icl_example = icl_example.replace(item, new_item)
        return icl_example.replace("12345", str(self.np_rng.randint(10000, 99999)))

    def _search(self, incremental: int, is_icl: bool, budget: int, extra_tokens: int) -> int:
        sample_text = self.generate_input_output(incremental, is_icl)[0]
        tokens_per_haystack = self.count(sample_text) / incremental
        estimated_max = int((budget / tokens_per_haystack) * 3)
        best = binary_search(
            lambda n: self.count(self.generate_input_output(n, is_icl)[0]) + extra_tokens <= budget,
            incremental, max(estimated_max, incremental * 2))
        return best if best is not None else incremental

    def icl_example(self) -> str:
        """The one demonstration: a 500-token example with 3-letter names and value 12345 (no answer budget)."""
        num_noises = self._search(5, True, 500, 0)
        text, answer, _ = fit_sample(lambda n: self.generate_input_output(n, True), num_noises, 5,
                                     lambda s: self.count(s[0]) <= 500, "VT demonstration")
        return text + " " + ' '.join(answer) + '\n'

    def samples(self, num_samples: int) -> list[dict]:
        icl = self.icl_example()
        incremental = 10 if self.max_seq_length >= 4096 else 5
        example_tokens = self.count(icl)
        num_noises = self._search(incremental, False, self.max_seq_length,
                                  example_tokens + self.tokens_to_generate)
        template_start = TEMPLATES['variable_tracking']['template'][:20]

        def generate(n):
            text, answer, info = self.generate_input_output(n)
            cutoff = text.index(template_start)
            demo = self.randomize_icl(icl) + '\n'
            info = dict(info, demo_chars=len(demo))
            return text[:cutoff] + demo + text[cutoff:], answer, info

        rows = []
        for index in range(num_samples):
            text, answer, info = fit_sample(generate, num_noises, incremental, lambda s: self.fits(s[0]),
                                            f"VT at {self.max_seq_length}")
            rows.append(self.record(index, text, answer, info))
        return rows


class CommonWords(Generator):
    family = 'common_words_extraction'

    def __init__(self, tokenizer, max_seq_length, seed, data_dir, *, freq_cw=30, freq_ucw=3, num_cw=10,
                 num_fewshot=1):
        super().__init__(tokenizer, max_seq_length, seed, data_dir)
        self.freq_cw, self.freq_ucw, self.num_cw, self.num_fewshot = freq_cw, freq_ucw, num_cw, num_fewshot
        self.words = cwe_words(seed)

    def get_example(self, num_words, common_repeats=30, uncommon_repeats=3, common_nums=10):
        if num_words > len(self.words):
            raise ValueError(f"CWE needs {num_words} distinct words but the wonderwords pool has "
                             f"{len(self.words)} (RULER then uses english_words.json, not available here); "
                             "use a smaller max_seq_length")
        word_list_full = self.rng.sample(self.words, num_words)
        common, uncommon = word_list_full[:common_nums], word_list_full[common_nums:]
        word_list = common * int(common_repeats) + uncommon * int(uncommon_repeats)
        self.fresh_shuffle(word_list)
        return ' '.join([f"{i + 1}. {word}" for i, word in enumerate(word_list)]), common

    def generate_input_output(self, num_words: int):
        few_shots = []
        if self.max_seq_length < 4096:
            for _ in range(self.num_fewshot):
                few_shots.append(self.get_example(20, 3, 1, self.num_cw))
            context, answer = self.get_example(num_words, 6, 1, self.num_cw)
        else:
            for _ in range(self.num_fewshot):
                few_shots.append(self.get_example(40, 10, 3, self.num_cw))
            context, answer = self.get_example(num_words, self.freq_cw, self.freq_ucw, self.num_cw)
        shots = [self.template.format(num_cw=self.num_cw, context=c, query='') + ' '
                 + ' '.join([f"{i + 1}. {word}" for i, word in enumerate(a)]) for c, a in few_shots]
        text = self.template.format(num_cw=self.num_cw, context=context, query='')
        demo = "\n".join(shots) + "\n"
        return demo + text, answer, dict(haystack_size=num_words, demo_chars=len(demo))

    def samples(self, num_samples: int) -> list[dict]:
        incremental = 10
        sample_text = self.generate_input_output(4096)[0]
        tokens_per_word = self.count(sample_text) / 4096
        estimated_max = int(self.max_seq_length // tokens_per_word) * 2
        num_words = binary_search(lambda n: self.fits(self.generate_input_output(n)[0]),
                                  incremental, max(estimated_max, incremental * 2))
        num_words = num_words if num_words is not None else incremental
        rows = []
        for index in range(num_samples):
            text, answer, info = fit_sample(self.generate_input_output, num_words, incremental,
                                            lambda s: self.fits(s[0]), f"CWE at {self.max_seq_length}")
            rows.append(self.record(index, text, answer, info))
        return rows


class FrequentWords(Generator):
    family = 'freq_words_extraction'

    def __init__(self, tokenizer, max_seq_length, seed, data_dir, *, alpha=2.0, coded_wordlen=6,
                 vocab_size=-1):
        super().__init__(tokenizer, max_seq_length, seed, data_dir)
        self.alpha, self.coded_wordlen, self.vocab_size = alpha, coded_wordlen, vocab_size

    def generate_input_output(self, max_len, num_words=-1, vocab_size=2000, incremental=10):
        from scipy.special import zeta
        vocab = [''.join(self.rng.choices(string.ascii_lowercase, k=self.coded_wordlen))
                 for _ in range(vocab_size)]
        while len(set(vocab)) < vocab_size:
            vocab.append(''.join(self.rng.choices(string.ascii_lowercase, k=self.coded_wordlen)))
        vocab = sorted(list(set(vocab)))
        self.fresh_shuffle(vocab)
        vocab[0] = '...'  # treat the top ranked as noise

        def gen_text(num_words):
            k = np.arange(1, len(vocab) + 1)
            sampled_cnt = num_words * (k ** -self.alpha) / zeta(self.alpha)
            sampled_words = [[w] * zi for w, zi in zip(vocab, sampled_cnt.astype(int))]
            sampled_words = [x for wlst in sampled_words for x in wlst]
            self.fresh_shuffle(sampled_words)
            return self.template.format(context=' '.join(sampled_words), query=''), vocab[1:4]

        if num_words > 0:
            text, answer = gen_text(num_words)
            while self.count(text) > max_len:
                num_words -= incremental
                if num_words <= 0:
                    raise ValueError(f"FWE: no coded text fits in {max_len} prompt tokens")
                text, answer = gen_text(num_words)
        else:
            num_words = max_len // self.coded_wordlen
            text, answer = gen_text(num_words)
            while self.count(text) < max_len:
                num_words += incremental
                text, answer = gen_text(num_words)
            num_words -= incremental
        text, answer = gen_text(num_words)
        return text, answer, num_words

    def samples(self, num_samples: int) -> list[dict]:
        budget = self.max_seq_length - self.tokens_to_generate  # HEAD (9f1c84d): the answer budget counts
        vocab_size = budget // 50 if self.vocab_size == -1 else self.vocab_size
        _, _, num_words = self.generate_input_output(budget, vocab_size=vocab_size, incremental=budget // 32)
        rows = []
        for index in range(num_samples):
            text, answer, used = self.generate_input_output(budget, num_words=num_words, vocab_size=vocab_size,
                                                            incremental=budget // 32)
            rows.append(self.record(index, text, answer, dict(haystack_size=used)))
        return rows
