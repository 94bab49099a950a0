"""Tests of the speech tasks: the swapped torchaudio Conformer against the stock one (padding masks included), the
split by voice, the real-dataset readers on fixture trees, the perturbations, CTC decoding, and tiny runs that learn."""

import copy
import json
import math

import numpy as np
import pytest
import soundfile as sf
import torch
import torchaudio

import quest_core
from quest_speech import data as D
from quest_speech.model import Conv2dSubsampling, FrontEnd, greedy_ctc
from quest_speech.perturb import PERTURBATIONS, perturb
from quest_speech.synth import SAMPLE_RATE

LENGTHS = torch.tensor([23, 9, 17])


def conformer(seed=0, kernel_size=7):
    torch.manual_seed(seed)
    return torchaudio.models.Conformer(input_dim=32, num_heads=4, ffn_dim=64, num_layers=2,
                                       depthwise_conv_kernel_size=kernel_size, dropout=0.0).eval()


def test_softmax_swap_equals_the_stock_conformer_with_padding():
    stock = conformer()
    ours = copy.deepcopy(stock)
    report = quest_core.swap_attention(ours, "softmax")
    assert len(report.swapped) == 2 and not report.left, str(report)
    x = torch.randn(3, 23, 32)
    expected, lengths = stock(x, LENGTHS)
    got, got_lengths = ours(x, LENGTHS)
    assert (got_lengths == lengths).all()
    for b, n in enumerate(LENGTHS.tolist()):
        torch.testing.assert_close(got[b, :n], expected[b, :n], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("variant", ["quest", "qknorm"])
def test_padding_never_reaches_valid_frames(variant):
    # torchaudio's convolution module does not mask padded frames (a wider kernel mixes them in, stock model too),
    # so a pointwise kernel isolates what the key padding mask of the swapped attention must guarantee.
    model = conformer(kernel_size=1)
    quest_core.swap_attention(model, variant)
    x = torch.randn(3, 23, 32)
    noisy = x.clone()
    for b, n in enumerate(LENGTHS.tolist()):
        noisy[b, n:] = 100 * torch.randn(23 - n, 32)  # garbage in the padding
    a, _ = model(x, LENGTHS)
    c, _ = model(noisy, LENGTHS)
    for b, n in enumerate(LENGTHS.tolist()):
        torch.testing.assert_close(c[b, :n], a[b, :n], atol=1e-5, rtol=1e-4)
    stock, _ = conformer(kernel_size=1)(x, LENGTHS)
    assert (a - stock).abs().max() > 1e-3  # the variant computes something else than softmax


def test_front_end_and_subsampler_lengths_match_the_tensors():
    front, sub = FrontEnd(freq_mask=0, time_mask=0), Conv2dSubsampling(40, 16)
    for samples in (1600, 7999, 16000):
        feats, frames = front(torch.randn(1, samples), torch.tensor([samples]))
        assert feats.shape[-1] == frames.item()
        out, n = sub(feats, frames)
        assert out.shape[1] == n.item() == Conv2dSubsampling.out_lengths(frames).item()


def test_no_voice_is_in_both_train_and_test():
    train, test = D.voices("train"), D.voices("test")
    assert len(test) >= 10 and len(train) > 3 * len(test)
    assert not set(train) & set(test)
    assert not {D.voice_family(v) for v in train} & {D.voice_family(v) for v in test}  # klatt2 ~ klatt
    with pytest.raises(ValueError, match="'train' or 'test'"):
        D.voices("valid")


def test_synthesized_keyword_sets_keep_speakers_apart(tmp_path, monkeypatch):
    monkeypatch.setattr(D, "CACHE", tmp_path)
    train, test = D.keywords("train", 2, seed=3), D.keywords("test", 2, seed=3)
    assert len(train) == len(test) == 2 * len(D.WORDS)
    assert set(train.speakers) <= set(D.voices("train")) and set(test.speakers) <= set(D.voices("test"))
    assert all(0.1 * SAMPLE_RATE < len(a) < 2 * SAMPLE_RATE and a.abs().max() > 0.05 for a in train.audio)
    again = D.keywords("train", 2, seed=3)  # from the cache (int16): the same audio
    assert all(torch.equal(a, b) for a, b in zip(train.audio, again.audio))
    assert again.targets == train.targets and again.speakers == train.speakers


def write_wav(path, seconds=0.5, rate=SAMPLE_RATE, seed=0):
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(path, np.random.default_rng(seed).uniform(-0.3, 0.3, int(seconds * rate)).astype(np.float32), rate)


def test_speech_commands_reader_loads_a_fixture_tree(tmp_path):
    base = tmp_path / "SpeechCommands" / "speech_commands_v0.02"
    files = {"yes/aa11_nohash_0.wav", "yes/bb22_nohash_0.wav", "cat/aa11_nohash_1.wav", "learn/cc33_nohash_0.wav",
             "no/dd44_nohash_0.wav", "_background_noise_/white.wav"}
    for i, f in enumerate(sorted(files)):
        write_wav(base / f, seed=i)
    (base / "testing_list.txt").write_text("yes/bb22_nohash_0.wav\nno/dd44_nohash_0.wav\n")
    (base / "validation_list.txt").write_text("")
    test = D.speech_commands(tmp_path, "testing")
    assert sorted(D.WORDS[t] for t in test.targets) == ["no", "yes"] and sorted(test.speakers) == ["bb22", "dd44"]
    train = D.speech_commands(tmp_path, "training")  # "learn" is not one of our 30 words; noise is skipped
    assert sorted(D.WORDS[t] for t in train.targets) == ["cat", "yes"]
    assert all(len(a) == SAMPLE_RATE // 2 for a in train.audio)
    with pytest.raises(FileNotFoundError, match="Speech Commands"):
        D.speech_commands(tmp_path / "nowhere", "testing")


def test_librispeech_reader_loads_a_fixture_tree(tmp_path):
    chapter = tmp_path / "LibriSpeech" / "test-clean" / "19" / "198"
    for i in range(2):
        write_wav(chapter / f"19-198-000{i}.flac", seed=i)
    (chapter / "19-198.trans.txt").write_text("19-198-0000 HELLO WORLD\n19-198-0001 IT'S A TEST\n")
    utts = D.librispeech(tmp_path, "test-clean")
    assert utts.targets == ["hello world", "it's a test"] and utts.speakers == ["19", "19"]
    assert D.decode_ids(D.encode_text(utts.targets[1]).tolist()) == "it's a test"


def test_shipped_real_recordings_load():
    digits, sentences = D.asterisk_digits(), D.librivox()
    assert [D.WORDS[t] for t in digits.targets][:3] == ["zero", "one", "two"] and len(digits) == 10
    assert len(sentences) == 5 and sentences.targets[1] == "he was not an ill disposed young man"
    assert all(a.abs().max() > 0.05 for a in digits.audio + sentences.audio)


def test_perturbations_hit_their_levels_and_are_seeded():
    gen = torch.Generator().manual_seed(0)
    x = torch.sin(torch.arange(16000) * 0.05) * 0.5
    for snr in PERTURBATIONS["white"]:
        y = perturb(x, "white", snr, seed=1)
        measured = 10 * math.log10(x.pow(2).mean() / (y - x).pow(2).mean())
        assert measured == pytest.approx(snr, abs=0.2)
    others = [torch.randn(9000, generator=gen) for _ in range(4)]
    y = perturb(x, "babble", 5, seed=1, others=others)
    assert 10 * math.log10(x.pow(2).mean() / (y - x).pow(2).mean()) == pytest.approx(5, abs=0.1)
    assert torch.equal(perturb(x, "white", 10, seed=2), perturb(x, "white", 10, seed=2))
    assert len(perturb(x, "speed", 0.9, seed=0)) == pytest.approx(16000 / 0.9, abs=2)  # slower = longer
    up = perturb(x, "pitch", 9 / 8, seed=0)
    assert len(up) == 16000
    spectrum = torch.fft.rfft(up[2000:14000]).abs()  # the sine at 0.05 rad/sample moves up by 9/8
    peak = spectrum.argmax().item() * 2 * math.pi / 12000
    assert peak == pytest.approx(0.05 * 9 / 8, rel=0.02)
    wet = perturb(x, "reverb", 0.6, seed=0)
    assert len(wet) == 16000 and wet.pow(2).mean().item() == pytest.approx(x.pow(2).mean().item(), rel=1e-3)
    with pytest.raises(ValueError, match="valid: white"):
        perturb(x, "clipping", 1, seed=0)
    with pytest.raises(ValueError, match="other utterances"):
        perturb(x, "babble", 10, seed=0)


def test_greedy_ctc_merges_repeats_and_drops_blanks():
    ids = torch.tensor([[3, 3, 0, 3, 5, 5, 0, 0, 1, 2]])
    log_probs = torch.nn.functional.one_hot(ids, 8).float().log_softmax(-1)
    assert greedy_ctc(log_probs, torch.tensor([10])) == [[3, 3, 5, 1, 2]]
    assert greedy_ctc(log_probs, torch.tensor([4])) == [[3, 3]]


@pytest.mark.slow
def test_a_tiny_keyword_run_learns_on_held_out_voices(tmp_path):
    from quest_bench.runner import execute, resolve
    from quest_bench.spec import RunSpec

    overrides = {"train_per_word": 30, "test_per_word": 4, "epochs": 8, "perturb_samples": 30, "log_every": 5}
    result = execute(resolve(RunSpec("speech-commands", "quest", "tiny", 0, overrides)), tmp_path / "run",
                     progress=False)
    assert result.status == "ok", result.reason
    m = result.metrics
    assert m["test_acc"] > 0.2  # chance is 1/30
    assert {f"corruption_error/{p}" for p in PERTURBATIONS} <= set(m) and 0 < m["corrupted_acc"] < m["test_acc"]
    assert 0 <= m["real_digits_acc"] <= 1 and "final_max_logit" in m


@pytest.mark.slow
def test_a_tiny_asr_run_reports_error_rates(tmp_path):
    from quest_bench.runner import execute, resolve
    from quest_bench.spec import RunSpec

    overrides = {"train_sentences": 200, "test_sentences": 20, "epochs": 3, "perturb_samples": 6, "log_every": 5,
                 "num_layers": 2, "dim": 96, "ffn_dim": 192}
    result = execute(resolve(RunSpec("asr", "quest", "tiny", 0, overrides)), tmp_path / "run", progress=False)
    assert result.status == "ok", result.reason
    m = result.metrics
    assert 0 < m["test_cer"] <= 1.5 and 0 < m["real_cer"] and m["test_wer"] > 0
    assert "corrupted_char_acc" in m and "corruption_error/babble" in m
    losses = [json.loads(line)["loss"] for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    assert losses[-1] < 0.8 * losses[0]  # the CTC loss falls


def test_a_missing_synthesizer_is_reported_with_the_install_command(monkeypatch):
    from quest_speech import synth

    monkeypatch.setattr(synth.shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match="apt-get install espeak-ng"):
        synth.synthesize("yes", "en-us", "f3", 160, 50)


@pytest.mark.parametrize("task", ["speech-commands", "asr"])
def test_an_interrupted_run_resumes_bitwise(tmp_path, monkeypatch, task):
    from quest_sdk.testing import straight_and_resumed
    from quest_speech import experiment
    from quest_speech.task import AsrTask, SpeechCommandsTask

    monkeypatch.setattr(D, "CACHE", tmp_path / "cache")  # synthesized once by the first run, read by the others
    # one epoch of 5 batches of 12 (keywords: 2 per word) or 8 (40 sentences), a one-layer Conformer of width 16,
    # small evaluation sets: SpecAugment and dropout (the global generator, checkpointed) and the narrow-band
    # augmentation (the step's generator) on, so that they resume too
    small = {"epochs": 1, "dim": 16, "num_heads": 2, "ffn_dim": 32, "num_layers": 1, "kernel_size": 3, "n_mels": 16,
             "narrowband": 0.5, "perturb_samples": 3, "log_every": 1}
    if task == "asr":
        run, cfg = experiment.run_asr, AsrTask().make_config("tiny", {**small, "train_sentences": 40,
                                                                      "test_sentences": 4, "batch_size": 8})
    else:
        run, cfg = experiment.run_speech_commands, SpeechCommandsTask().make_config(
            "tiny", {**small, "train_per_word": 2, "test_per_word": 1, "batch_size": 12})
    straight, resumed, step = straight_and_resumed(run, cfg, tmp_path, checkpoint_every=2, crash_step=3)
    assert step == 2 and resumed == straight
    assert {"corrupted_acc" if task != "asr" else "corrupted_char_acc", "final_max_logit"} <= straight.keys()
    rows = [(tmp_path / run_dir / "events.jsonl").read_text() for run_dir in ("straight", "resumed")]
    assert rows[0] == rows[1]  # the row of step 3 logged again after the resume, not doubled


def test_validation_holds_out_whole_voices_the_same_way_every_run():
    import torch

    from quest_speech.data import Utterances

    speakers = [f"voice{v}" for v in range(20) for _ in range(3)]
    utts = Utterances([torch.zeros(4)] * 60, list(range(60)), speakers)
    train, val = utts.hold_out_voices(0.1)
    assert len(set(val.speakers)) == 2 and len(val) == 6 and len(train) == 54
    assert not set(train.speakers) & set(val.speakers)  # voice-disjoint, like the test split
    assert utts.hold_out_voices(0.1)[1].targets == val.targets
    assert utts.hold_out_voices(0.0) == (utts, None)
