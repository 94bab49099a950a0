"""Tests of the lm task: causality for every variant, the WikiText layout, tokenizers, evaluation, a run that learns."""

import math

import pytest
import torch

import quest_core
from quest_bench.runner import execute, resolve
from quest_bench.spec import RunSpec
from quest_lm.data import EOS, SHIPPED, UNK, BpeVocab, load_corpus, read_lines, split_path, unigram_perplexity
from quest_lm.model import GPT
from quest_lm.experiment import SpikeDetector, perplexity, run
from quest_lm.task import LmConfig

FIXTURE = {  # three splits in the real WikiText layout (leading/trailing spaces, headings, blank lines)
    "train": [" ", " = Valkyria Chronicles III = ", " ", " Senjō no Valkyria 3 is a tactical role @-@ playing game . ",
              " The game began development in 2010 , carrying over a large portion of the work . ", " ",
              " = = Gameplay = = ", " ", " The game 's battle system is the same as in the game . "],
    "valid": [" ", " = Tower Building = ", " ", " The building was completed in 2010 @,@ a year late . "],
    "test": [" ", " = Robert Boulter = ", " ", " Robert Boulter is an English film actor . "],
}


def write_fixture(folder):
    folder.mkdir(parents=True)
    for split, lines in FIXTURE.items():
        (folder / f"wiki.{split}.tokens").write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("adaptive", [(), (20, 40)], ids=["tied-softmax", "adaptive-softmax"])
@pytest.mark.parametrize("variant", quest_core.list_variants())
def test_a_future_token_never_changes_earlier_predictions(variant, adaptive):
    torch.manual_seed(0)
    model = GPT(60, variant, context=16, dim=32, depth=2, num_heads=4, dropout=0.0, adaptive_cutoffs=adaptive).eval()
    idx = torch.randint(0, 60, (2, 16))
    changed = idx.clone()
    changed[:, 9] = (idx[:, 9] + 7) % 60
    with torch.no_grad():
        before, after = model.logits(idx), model.logits(changed)
    torch.testing.assert_close(after[:, :9], before[:, :9], rtol=0, atol=1e-5)
    assert (after[:, 9:] - before[:, 9:]).abs().amax() > 1e-3  # the change is visible from position 9 on


def test_the_wikitext_loader_reads_the_real_layout(tmp_path):
    write_fixture(tmp_path / "wikitext-2")
    corpus = load_corpus(str(tmp_path), "wikitext-2")
    vocab = corpus.vocab
    assert vocab.words[0] == EOS  # every line ends with <eos>: the most frequent token
    assert len(corpus.words["train"]) == sum(len(line.split()) + 1 for line in FIXTURE["train"])
    assert vocab.decode(corpus.ids["train"][:7].tolist()) == [EOS, "=", "Valkyria", "Chronicles", "III", "=", EOS]
    test_words = vocab.decode(corpus.ids["test"].tolist())
    assert test_words.count(UNK) == sum(w not in vocab.index for line in FIXTURE["test"] for w in line.split())
    assert "is" in test_words and "Robert" not in test_words  # seen in train / never seen in train


def test_missing_wikitext_files_are_named_in_the_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="wiki.train.tokens"):
        load_corpus(str(tmp_path), "wikitext-103")
    with pytest.raises(ValueError, match="valid: wikitext-mini"):
        load_corpus(str(tmp_path), "penn")
    with pytest.raises(ValueError, match="--data-root"):
        load_corpus(None, "wikitext-2")
    with pytest.raises(FileNotFoundError, match="wiki.test.tokens"):
        split_path(tmp_path, "test")


def test_the_shipped_wikitext_mini_is_real_wikipedia_in_wikitext_format():
    lines = read_lines(SHIPPED / "wiki.valid.tokens.xz")
    titles = [line for line in lines if line.startswith(" = ") and not line.startswith(" = = ")]
    assert len(titles) >= 8 and all(line.endswith(" = ") for line in titles)
    assert all(line == " " or (line.startswith(" ") and line.endswith(" ")) for line in lines)
    text = " ".join(lines)
    assert " @-@ " in text and " @,@ " in text and f" {UNK} " in text
    corpus = load_corpus(None, "wikitext-mini")
    assert 10_000 < len(corpus.vocab) < 20_000 and len(corpus.words["train"]) > 400_000
    assert 400 < corpus.unigram_ppl("test") < 800
    assert corpus.unigram_ppl("valid", 0.1) != corpus.unigram_ppl("valid")  # the baseline follows the evaluated slice


def test_the_bpe_tokenizer_round_trips():
    lines = read_lines(SHIPPED / "wiki.train.tokens.xz")[:400]
    bpe = BpeVocab(lines, vocab_size=500)
    counts = torch.bincount(bpe.encode(lines), minlength=len(bpe))
    assert (counts[:-1] >= counts[1:]).all()  # ids ranked by training frequency, as adaptive softmax assumes
    for line in [*lines[:50], " The game 's battle system , 2 @,@ 000 years . "]:
        ids = bpe.encode([line]).tolist()
        assert ids[-1] == bpe.eos and len(ids) >= len(line.split()) + 1
        assert bpe.decode(ids[:-1]) == " ".join(line.split())


def test_perplexity_of_a_uniform_model_is_the_vocabulary_size(tmp_path):
    write_fixture(tmp_path / "wikitext-2")
    corpus = load_corpus(str(tmp_path), "wikitext-2")
    model = GPT(len(corpus.vocab), "quest", context=8, dim=16, depth=1, num_heads=2, dropout=0.0).eval()
    torch.nn.init.zeros_(model.norm.weight)  # hidden state 0 -> every logit 0 -> uniform prediction
    cfg = LmConfig(context=8)  # the splits are not multiples of 8: the last partial window counts too
    for split in ("valid", "test"):
        assert perplexity(model, corpus, split, cfg, torch.device("cpu")) == pytest.approx(len(corpus.vocab))
        noisy = perplexity(model, corpus, split, cfg, torch.device("cpu"), substitution=0.5, seed=3)
        assert noisy == pytest.approx(len(corpus.vocab))  # inputs corrupted, targets clean: still uniform


class TargetScorer(torch.nn.Module):
    """A stand-in model whose NLL of a target token is 0.01 * its id: perplexity then depends only on targets."""

    adaptive = None

    def token_nll(self, idx_bl, target_bl):
        return 0.01 * target_bl.double()


def test_perplexity_scores_every_target_once_and_substitution_leaves_targets_clean(tmp_path):
    write_fixture(tmp_path / "wikitext-2")
    corpus = load_corpus(str(tmp_path), "wikitext-2")
    cfg = LmConfig(context=5)  # windows of 5 and a partial last one
    targets = corpus.ids["test"][1:].double()
    expected = math.exp(float(0.01 * targets.sum()) / len(targets))
    for rate in (0.0, 0.3, 0.9):
        got = perplexity(TargetScorer(), corpus, "test", cfg, torch.device("cpu"), substitution=rate, seed=1)
        assert got == pytest.approx(expected, rel=1e-12)
    half = LmConfig(context=5, eval_tokens=len(targets) // 2)
    first_half = targets[: len(targets) // 2]
    assert perplexity(TargetScorer(), corpus, "test", half, torch.device("cpu")) == pytest.approx(
        math.exp(float(0.01 * first_half.sum()) / len(first_half)), rel=1e-12)


def test_unigram_perplexity_matches_a_hand_computation():
    counts = torch.tensor([3.0, 1.0, 0.0], dtype=torch.float64)  # add-one: p = 4/7, 2/7, 1/7
    ids = torch.tensor([0, 1, 2, 0])
    expected = math.exp(-(2 * math.log(4 / 7) + math.log(2 / 7) + math.log(1 / 7)) / 4)
    assert unigram_perplexity(counts, ids) == pytest.approx(expected)


def test_spike_detector_counts_excursions_after_warmup():
    smooth = SpikeDetector(threshold=0.5, start_step=10)
    for step in range(200):
        smooth.update(step, 8.0 * math.exp(-step / 50) + 2.0)
    assert smooth.spikes == 0 and smooth.max_rise == 0.0
    spiky = SpikeDetector(threshold=0.5, start_step=10)
    for step in range(300):
        spiky.update(step, 5.0 if 100 <= step < 120 or 200 <= step < 220 else 2.0)
    assert spiky.spikes == 2 and spiky.max_rise == pytest.approx(3.0, abs=0.5)


def test_spike_detector_state_survives_a_checkpoint():
    detector = SpikeDetector(0.5, start_step=2)
    for step, loss in enumerate([1.0, 1.0, 1.0, 5.0, 5.0]):  # the smoothed loss rises 0.76 nats: one spike
        detector.update(step, loss)
    restored = SpikeDetector(0.5, start_step=2)
    restored.load_state_dict(detector.state_dict())
    for d in (detector, restored):
        d.update(5, 0.5)
    assert vars(restored) == vars(detector) and detector.spikes == 1


def test_an_interrupted_run_resumes_bitwise(tmp_path):
    from quest_sdk.testing import straight_and_resumed

    cfg = LmConfig(steps=10, warmup_steps=2, eval_tokens=1000, log_every=3, corruption_rates="0.1")
    straight, resumed, step = straight_and_resumed(run, cfg, tmp_path, checkpoint_every=4, crash_step=6)
    assert step == 4 and resumed == straight


def test_a_tiny_run_learns_and_reports_everything(tmp_path):
    spec = resolve(RunSpec("lm", "quest", "tiny", 0, {"steps": 150, "eval_tokens": 5000, "log_every": 25}))
    result = execute(spec, tmp_path / "run", progress=False)
    assert result.status == "ok", result.reason
    m = result.metrics
    assert m["valid_ppl"] < 0.8 * m["valid_unigram_ppl"] and m["test_ppl"] < 0.8 * m["test_unigram_ppl"]
    assert m["corrupted_ppl/sub0.2"] > m["corrupted_ppl/sub0.05"] > m["test_ppl"]
    assert m["stable"] == 1.0 and m["loss_spikes"] == 0.0
    assert {"final_max_logit", "final_entropy_mean"} <= set(m)
    events = (tmp_path / "run" / "events.jsonl").read_text().splitlines()
    assert len(events) >= 6 and '"blocks.0.attn/max_logit"' in events[-1]


def test_a_real_layout_run_with_bpe_and_adaptive_softmax(tmp_path):
    """The --data-root path end to end on a WikiText-2 fixture, with the BPE tokenizer and an adaptive softmax."""
    write_fixture(tmp_path / "data" / "wikitext-2")
    overrides = {"dataset": "wikitext-2", "tokenizer": "bpe", "bpe_vocab": 120, "adaptive_cutoffs": "20,60",
                 "context": 8, "steps": 5, "warmup_steps": 2, "batch_size": 2, "dim": 16, "num_heads": 2}
    spec = resolve(RunSpec("lm", "qknorm", "tiny", 0, overrides))
    result = execute(spec, tmp_path / "run", data_root=str(tmp_path / "data"), progress=False)
    assert result.status == "ok", result.reason
    assert result.data["name"] == "wikitext-2" and math.isfinite(result.metrics["test_ppl"])
    assert result.config["adaptive_cutoffs"] == "20,60"
