"""Helpers of the cells and mixture tests: a real HF tokenizer directory and real Levanter caches.

The caches are written with Levanter's own `SerialCacheWriter` (one `train/` and one `validation/`
cache per component, documents framed as BOS + ids + EOS), so the mixture tests depend on nothing but
Levanter and `tokenizers`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

EOS = "<|endoftext|>"


def write_hf_tokenizer(folder: Path, texts: Sequence[str], vocab_size: int = 400) -> str:
    """Train a byte-level BPE on `texts` and save it as an HF tokenizer directory Levanter loads offline."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    tokenizer.train_from_iterator(texts, trainer=trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {"bos_token": EOS, "eos_token": EOS, "model_max_length": 1 << 20}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return str(folder)


def write_levanter_cache(cache_dir: str, tokenizer_path: str, texts: Sequence[str]) -> int:
    """Tokenize `texts` into a Levanter cache at `cache_dir` (BOS + ids + EOS per document); returns its tokens."""
    from levanter.store.cache import SerialCacheWriter

    tokenizer = Tokenizer.from_file(f"{tokenizer_path}/tokenizer.json")
    eos = tokenizer.token_to_id(EOS)
    rows = [np.array([eos, *encoding.ids, eos], dtype=np.int32)
            for encoding in tokenizer.encode_batch_fast(list(texts), add_special_tokens=False)]  # fmt: skip
    with SerialCacheWriter(cache_dir, {"input_ids": np.zeros(0, dtype=np.int32)}) as writer:
        writer.write_batch([{"input_ids": row} for row in rows])
    return sum(len(row) for row in rows)
