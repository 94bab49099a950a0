"""WikiText data: the shipped WikiText-mini or real WikiText-2/103 from a folder, as token-id streams.

Both read the same layout, `wiki.{train,valid,test}.tokens` (the shipped copy is xz-compressed). Conventions follow
the usual WikiText language-modelling code (Merity et al. 2016; Dai et al. 2019, Transformer-XL): every line,
blank ones included, becomes its whitespace tokens plus `<eos>`; the word vocabulary is built from the training
split, most frequent first (the order adaptive softmax cut-offs assume); a valid/test word absent from it reads as
`<unk>` (WikiText-103 has none; the small WikiText-mini has a few).

Optionally, a byte-pair-encoding tokenizer (Hugging Face `tokenizers`) trained on the training split only.
"""

from __future__ import annotations

import collections
import hashlib
import lzma
from dataclasses import dataclass
from pathlib import Path

import torch

from quest_sdk.data import require_data_root

SHIPPED = Path(__file__).parent / "data"
SPLITS = ("train", "valid", "test")
EOS, UNK = "<eos>", "<unk>"


def split_path(folder: Path, split: str) -> Path:
    """`wiki.<split>.tokens` (or its .xz) in ``folder``, or a clear error naming what was expected."""
    for name in (f"wiki.{split}.tokens", f"wiki.{split}.tokens.xz"):
        if (folder / name).exists():
            return folder / name
    raise FileNotFoundError(
        f"no wiki.{split}.tokens in {folder}; expected the WikiText layout "
        "(wiki.train.tokens, wiki.valid.tokens, wiki.test.tokens), e.g. <data-root>/wikitext-103/"
    )


def read_lines(path: Path) -> list[str]:
    raw = lzma.decompress(path.read_bytes()) if path.suffix == ".xz" else path.read_bytes()
    return raw.decode("utf-8").split("\n")[:-1] if raw.endswith(b"\n") else raw.decode("utf-8").split("\n")


def find_wikitext(data_root: str | None, dataset: str) -> Path:
    """The folder of a dataset: the shipped WikiText-mini, or wikitext-2 / wikitext-103 under ``data_root``."""
    if dataset == "wikitext-mini":
        return SHIPPED
    if dataset not in ("wikitext-2", "wikitext-103"):
        raise ValueError(f"unknown dataset {dataset!r}; valid: wikitext-mini (shipped), wikitext-2, wikitext-103")
    root = require_data_root(data_root, dataset)
    for folder in (root / dataset, root):
        if any((folder / f"wiki.train.tokens{ext}").exists() for ext in ("", ".xz")):
            return folder
    raise FileNotFoundError(f"{dataset}: no wiki.train.tokens in {root / dataset} or {root}")


class WordVocab:
    """Word-level vocabulary, most frequent first; unknown words map to `<unk>`."""

    def __init__(self, train_lines: list[str]):
        counts = collections.Counter(t for line in train_lines for t in line.split())
        counts[EOS] += len(train_lines)
        counts.setdefault(UNK, 0)
        self.words = sorted(counts, key=lambda w: (-counts[w], w))
        self.counts = torch.tensor([counts[w] for w in self.words], dtype=torch.float64)
        self.index = {w: i for i, w in enumerate(self.words)}

    def __len__(self) -> int:
        return len(self.words)

    def encode(self, lines: list[str]) -> torch.Tensor:
        unk = self.index[UNK]
        return torch.tensor([self.index.get(t, unk) for line in lines for t in (*line.split(), EOS)], dtype=torch.long)

    def decode(self, ids) -> list[str]:
        return [self.words[i] for i in ids]


class BpeVocab:
    """Byte-pair encoding trained on the training split (Hugging Face `tokenizers`); `<eos>` ends every line.

    Words are split on whitespace first and their last piece carries the `</w>` suffix, so decoding restores the
    word boundaries: ``decode(encode([line]))`` is the line's words joined by single spaces, plus `<eos>`.
    """

    def __init__(self, train_lines: list[str], vocab_size: int):
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        # WikiText's own `<unk>` is an ordinary word here; [UNK] is for characters never seen in training
        self.tokenizer = Tokenizer(models.BPE(unk_token="[UNK]", end_of_word_suffix="</w>"))
        self.tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        self.tokenizer.decoder = decoders.BPEDecoder(suffix="</w>")
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS, "[UNK]"], end_of_word_suffix="</w>",
                                      show_progress=False)
        self.tokenizer.train_from_iterator(train_lines, trainer=trainer)
        # renumber the ids by training frequency (tokenizers numbers specials, alphabet, then merges), as the
        # word vocabulary is, so adaptive-softmax cut-offs mean the same for both
        raw = self._raw_ids(train_lines)
        counts = torch.bincount(raw, minlength=self.tokenizer.get_vocab_size())
        self.from_rank = counts.argsort(descending=True, stable=True)  # rank -> tokenizers id
        self.to_rank = torch.empty_like(self.from_rank)
        self.to_rank[self.from_rank] = torch.arange(len(self.from_rank))
        self.eos = int(self.to_rank[self.tokenizer.token_to_id(EOS)])

    def _raw_ids(self, lines: list[str]) -> torch.Tensor:
        eos = self.tokenizer.token_to_id(EOS)
        return torch.tensor([i for enc in self.tokenizer.encode_batch(lines) for i in (*enc.ids, eos)], dtype=torch.long)

    def __len__(self) -> int:
        return self.tokenizer.get_vocab_size()

    def encode(self, lines: list[str]) -> torch.Tensor:
        return self.to_rank[self._raw_ids(lines)]

    def decode(self, ids) -> str:
        return self.tokenizer.decode(self.from_rank[torch.as_tensor(list(ids), dtype=torch.long)].tolist(),
                                     skip_special_tokens=False)


@dataclass
class Corpus:
    """Token-id streams of the three splits, and what perplexity per word needs."""

    name: str
    vocab: WordVocab | BpeVocab
    ids: dict[str, torch.Tensor]  # split -> (N,) token ids
    words: dict[str, torch.Tensor]  # split -> (W,) word ids (whitespace tokens plus one <eos> per line)
    word_counts: torch.Tensor  # (V_words,) training counts of each word (the unigram baseline's model)
    digest: str  # sha256 of the three files

    def unigram_ppl(self, split: str, fraction: float = 1.0) -> float:
        """Perplexity per word of the add-one unigram model of the train split on the first ``fraction`` of a split
        (the same text an evaluation on the first part of the split's tokens covers)."""
        words = self.words[split]
        predicted = max(1, round(fraction * (len(words) - 1)))  # the first word is never a target
        return unigram_perplexity(self.word_counts, words[1: 1 + predicted])


def load_corpus(data_root: str | None, dataset: str, tokenizer: str = "word", bpe_vocab: int = 8000) -> Corpus:
    folder = find_wikitext(data_root, dataset)
    paths = {s: split_path(folder, s) for s in SPLITS}
    lines = {s: read_lines(p) for s, p in paths.items()}
    digest = hashlib.sha256(b"".join(paths[s].read_bytes() for s in SPLITS)).hexdigest()[:16]
    words = WordVocab(lines["train"])
    if tokenizer == "word":
        vocab = words
    elif tokenizer == "bpe":
        vocab = BpeVocab(lines["train"], bpe_vocab)
    else:
        raise ValueError(f"unknown tokenizer {tokenizer!r}; valid: word, bpe")
    word_ids = {s: words.encode(lines[s]) for s in SPLITS}
    return Corpus(
        name=dataset, vocab=vocab,
        ids={s: word_ids[s] if vocab is words else vocab.encode(lines[s]) for s in SPLITS},
        words=word_ids,
        word_counts=words.counts,
        digest=digest,
    )


def unigram_perplexity(train_counts: torch.Tensor, ids: torch.Tensor) -> float:
    """Perplexity of the add-one-smoothed unigram model of the training counts on ``ids`` (the baseline)."""
    log_p = (train_counts + 1).log() - (train_counts.sum() + len(train_counts)).log()
    return float(torch.exp(-log_p[ids].mean()))
