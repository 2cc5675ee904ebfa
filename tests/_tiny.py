"""Tiny stand-ins for tests: a byte-level BPE tokenizer, a books corpus, a Llama folder; new parameters moved off
their neutral initialisation; whether torch.compile works here."""
from __future__ import annotations

import functools
import gzip
import json
import random
from pathlib import Path

import torch
import transformers

WORDS = ("the cat sat on a mat and the dog ran to the red house while birds sang over green hills "
         "under a blue sky where children played with kites near the old mill by the river").split()


def make_texts(n_docs: int = 12, words_per_doc: int = 600, seed: int = 0) -> list[str]:
    """Documents with strong local structure (a word follows its predecessor often), so loss can fall."""
    rng = random.Random(seed)
    docs = []
    for d in range(n_docs):
        i, out = rng.randrange(len(WORDS)), []
        for _ in range(words_per_doc):
            i = (i + 1) % len(WORDS) if rng.random() < 0.8 else rng.randrange(len(WORDS))
            out.append(WORDS[i])
        docs.append(f"Book {d}. " + " ".join(out) + ".")
    return docs


def write_books(data_dir: Path, n_docs: int = 12, words_per_doc: int = 600) -> Path:
    folder = Path(data_dir) / "corpus_classic_books"
    folder.mkdir(parents=True, exist_ok=True)
    texts = make_texts(n_docs, words_per_doc)
    half = len(texts) // 2
    for shard, chunk in enumerate((texts[:half], texts[half:])):
        with gzip.open(folder / f"books_{shard:03d}.jsonl.gz", "wt", encoding="utf-8") as f:
            for j, text in enumerate(chunk):
                f.write(json.dumps({"id": f"Author {shard}/Book {j}.md", "text": text}) + "\n")
    return Path(data_dir)


def tiny_tokenizer(vocab_size: int = 320):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(make_texts(4, 200, seed=1), trainer)
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>",
                                                bos_token="<|endoftext|>")


def tiny_llama(vocab_size: int, seed: int = 0, layers: int = 2):
    config = transformers.LlamaConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                                      head_dim=16, max_position_embeddings=1024, tie_word_embeddings=False,
                                      rope_theta=10000.0)
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(config).eval()


def write_tiny_backbone(folder: Path, layers: int = 2) -> Path:
    """A saved tiny Llama + tokenizer usable as `--base folder`."""
    tok = tiny_tokenizer()
    model = tiny_llama(len(tok), layers=layers)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return Path(folder)


def free_port() -> int:
    """A TCP port free right now, for `accelerate launch --main_process_port`: a fixed 29500 can still be held by
    the previous launch's processes when the next test starts (seen once as a setup error)."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def perturb_new_params(model, scale: float):
    """Move the trainable (new) parameters off their identity / neutral initialisation: p += scale * N(0, 1)
    (the global RNG), so a test compares paths that actually use them."""
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * scale)
    return model


@functools.cache
def inductor_works() -> bool:
    """Whether torch.compile (inductor) runs on this machine (a C++ compiler is there); tried once a session."""
    try:
        torch.compile(lambda t: t * 2 + 1)(torch.ones(3))
        return True
    except Exception:  # no C++ compiler / inductor unusable on this machine
        return False


def token_by_token_and_parallel(model, ids):
    """(logits decoded one token at a time through a LinearCache, logits of one parallel forward) for ids [B, T]:
    the decode-vs-forward parity every option is held to."""
    from golinear.models.cache.hf_cache import LinearCache
    cache = LinearCache.for_model(model)
    with torch.no_grad():
        steps = [model(ids[:, i:i + 1], past_key_values=cache, use_cache=True).logits for i in range(ids.shape[1])]
        return torch.cat(steps, 1), model(ids).logits
