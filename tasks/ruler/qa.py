"""Question answering over many documents (RULER scripts/data/synthetic/qa.py, HEAD): SQA, HQA."""
from __future__ import annotations

from .base import Generator, binary_search, fit_sample
from .constants import DOCUMENT_PROMPT
from .resources import hotpotqa, squad


class QA(Generator):
    family = 'qa'

    def __init__(self, tokenizer, max_seq_length, seed, data_dir, *, dataset):
        super().__init__(tokenizer, max_seq_length, seed, data_dir)
        readers = {'squad': squad, 'hotpotqa': hotpotqa}
        if dataset not in readers:
            raise ValueError(f"QA dataset {dataset!r} not supported; allowed: {sorted(readers)}")
        self.dataset = dataset
        self.qas, self.docs = readers[dataset](data_dir)

    def generate_input_output(self, index: int, num_docs: int):
        qa = self.qas[index]
        curr_docs, curr_more = qa['context'], qa.get('more_context', [])
        if num_docs < len(self.docs):
            if (num_docs - len(curr_docs)) > len(curr_more):
                taken = set(curr_docs + curr_more)
                addition_docs = [i for i in range(len(self.docs)) if i not in taken]
                all_docs = curr_docs + curr_more + self.rng.sample(
                    addition_docs, max(0, num_docs - len(curr_docs) - len(curr_more)))
            else:
                all_docs = curr_docs + self.rng.sample(curr_more, num_docs - len(curr_docs))
        else:  # HEAD: repeat the document pool as often as needed
            repeats = (num_docs + len(self.docs) - 1) // len(self.docs)
            all_docs = (list(range(len(self.docs))) * repeats)[:num_docs]
        self.fresh_shuffle(all_docs)
        gold = set(curr_docs)
        positions = [i for i, d in enumerate(all_docs) if d in gold]
        context = '\n\n'.join([DOCUMENT_PROMPT.format(i=i + 1, document=self.docs[d])
                               for i, d in enumerate(all_docs)])
        text = self.template.format(context=context, query=qa['query'])
        info = dict(needles=[DOCUMENT_PROMPT.format(i=i + 1, document=self.docs[all_docs[i]]) for i in positions],
                    positions=positions, depths=[round(100 * i / len(all_docs), 2) for i in positions],
                    haystack_size=num_docs, num_units=len(all_docs))
        return text, qa['outputs'], info

    def samples(self, num_samples: int) -> list[dict]:
        incremental = 10
        sample_text, _, _ = self.generate_input_output(0, incremental)
        tokens_per_doc = self.count(sample_text) / incremental
        estimated_max = int((self.max_seq_length / tokens_per_doc) * 3)
        num_docs = binary_search(lambda n: self.fits(self.generate_input_output(0, n)[0]),
                                 incremental, max(estimated_max, incremental * 2))
        num_docs = num_docs if num_docs is not None else incremental
        rows = []
        for index in range(min(num_samples, len(self.qas))):
            text, answer, info = fit_sample(lambda n: self.generate_input_output(index, n), num_docs,
                                            incremental, lambda s: self.fits(s[0]),
                                            f"QA ({self.dataset}) question {index} at {self.max_seq_length}")
            rows.append(self.record(index, text, answer, info))
        return rows
