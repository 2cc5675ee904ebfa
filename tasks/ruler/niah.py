"""Needle-in-a-haystack (RULER scripts/data/synthetic/niah.py, HEAD): S-NIAH-1/2/3, MK, MV, MQ."""
from __future__ import annotations

import uuid

from .base import Generator, binary_search, fit_sample
from .constants import DEPTHS, NEEDLE, NOISE
from .resources import essay_words, niah_key_words, sent_tokenize


class NIAH(Generator):
    family = 'niah'

    def __init__(self, tokenizer, max_seq_length, seed, data_dir, *, type_haystack, type_needle_k,
                 type_needle_v, num_needle_k, num_needle_v, num_needle_q):
        super().__init__(tokenizer, max_seq_length, seed, data_dir)
        self.type_haystack = type_haystack
        self.type_needle_k, self.type_needle_v = type_needle_k, type_needle_v
        self.num_needle_k = max(num_needle_k, num_needle_q)
        self.num_needle_v, self.num_needle_q = num_needle_v, num_needle_q
        if type_haystack == 'essay':
            self.haystack = essay_words(data_dir)
        elif type_haystack == 'noise':
            self.haystack = NOISE
        else:
            raise ValueError(f"haystack {type_haystack!r} not supported; allowed: essay, noise")
        self.words = niah_key_words() if 'words' in (type_needle_k, type_needle_v) else None

    def generate_random(self, kind: str) -> str:
        if kind == 'numbers':
            return str(self.rng.randint(10 ** 6, 10 ** 7 - 1))
        if kind == 'words':
            return self.rng.choice(self.words)
        if kind == 'uuids':
            return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))
        raise ValueError(f"needle type {kind!r} not supported; allowed: numbers, words, uuids")

    def generate_input_output(self, num_haystack: int):
        keys, values, needles = [], [], []
        for _ in range(self.num_needle_k):
            keys.append(self.generate_random(self.type_needle_k))
            value = []
            for _ in range(self.num_needle_v):
                value.append(self.generate_random(self.type_needle_v))
                needles.append(NEEDLE.format(type_needle_v=self.type_needle_v, key=keys[-1], value=value[-1]))
            values.append(value)
        self.fresh_shuffle(needles)

        if self.type_haystack == 'essay':
            haystack = self.haystack
            if num_haystack > len(haystack):  # HEAD: repeat the essays as often as needed
                haystack = haystack * ((num_haystack + len(haystack) - 1) // len(haystack))
            document_sents = sent_tokenize(" ".join(haystack[:num_haystack]).strip())
            depths = sorted(self.rng.sample(DEPTHS, len(needles)))
            positions = [int(len(document_sents) * (depth / 100)) for depth in depths]
            insertion_positions = [0] + positions + [len(document_sents)]
            pieces = []
            for i in range(1, len(insertion_positions)):
                pieces.append(" ".join(document_sents[insertion_positions[i - 1]:insertion_positions[i]]))
                if i - 1 < len(needles):
                    pieces.append(needles[i - 1])
            context = " ".join(pieces)
            info = dict(needles=needles, depths=[float(d) for d in depths], positions=positions,
                        haystack_size=num_haystack, num_units=len(document_sents))
        else:
            sentences = [self.haystack] * num_haystack
            indexes = sorted(self.rng.sample(range(num_haystack), len(needles)), reverse=True)
            for index, element in zip(indexes, needles):
                sentences.insert(index, element)
            context = "\n".join(sentences)
            placed = [i for i, s in enumerate(sentences) if s != self.haystack]
            info = dict(needles=[sentences[i] for i in placed], positions=placed,
                        depths=[round(100 * i / len(sentences), 2) for i in placed],
                        haystack_size=num_haystack, num_units=len(sentences))

        indices = self.rng.sample(range(self.num_needle_k), self.num_needle_q)
        queries = [keys[i] for i in indices]
        answers = [a for i in indices for a in values[i]]
        query = ', '.join(queries[:-1]) + ', and ' + queries[-1] if len(queries) > 1 else queries[0]

        template, type_needle_v = self.template, self.type_needle_v
        if self.num_needle_q * self.num_needle_v == 1:
            template = template.replace('Some', 'A')
            template = template.replace('are all', 'is')
            template = template.replace('are', 'is')
            template = template.replace('answers', 'answer')
            type_needle_v = type_needle_v[:-1]  # remove "s"
        text = template.format(type_needle_v=type_needle_v, context=context, query=query)
        return text, answers, info

    def samples(self, num_samples: int) -> list[dict]:
        incremental = 500 if self.type_haystack == 'essay' else 25
        if self.type_haystack != 'essay' and self.max_seq_length < 4096:
            incremental = 5

        sample_text, _, _ = self.generate_input_output(incremental)
        tokens_per_haystack = self.count(sample_text) / incremental
        estimated_max = int((self.max_seq_length / tokens_per_haystack) * 3)
        num_haystack = binary_search(lambda n: self.fits(self.generate_input_output(n)[0]),
                                     incremental, max(estimated_max, incremental * 2))
        num_haystack = num_haystack if num_haystack is not None else incremental

        rows = []
        for index in range(num_samples):
            text, answers, info = fit_sample(self.generate_input_output, num_haystack, incremental,
                                             lambda s: self.fits(s[0]), f"NIAH at {self.max_seq_length}")
            info["answer_token_position"] = self.answer_token_position(text, answers[0])
            rows.append(self.record(index, text, answers, info))
        return rows
