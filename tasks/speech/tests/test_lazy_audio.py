"""The real-data readers read audio lazily: a LibriSpeech-layout folder of generated FLAC and WAV files yields the
same utterances as reading every file up front, and no waveform is read until it is used."""

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from torchaudio.datasets import LIBRISPEECH

from quest_speech import data as D
from quest_speech import experiment
from quest_speech.synth import SAMPLE_RATE, read_audio

# speaker -> chapter -> transcripts
CORPUS = {"19": {"198": ["HELLO WORLD", "IT'S A TEST"]}, "26": {"495": ["A B C", "ONE MORE", "THE END"]}}


def write_clip(path: Path, seconds: float, seed: int, rate: int = SAMPLE_RATE) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    noise = np.random.default_rng(seed).uniform(-0.5, 0.5, int(seconds * rate)).astype(np.float32)
    sf.write(str(path), noise, rate, subtype="PCM_16")


@pytest.fixture
def librispeech_root(tmp_path):
    """train-clean-100 in LibriSpeech's layout: 5 FLAC utterances of different lengths, one of them at 8 kHz."""
    seed = 0
    for speaker, chapters in CORPUS.items():
        for chapter, texts in chapters.items():
            folder = tmp_path / "LibriSpeech" / "train-clean-100" / speaker / chapter
            lines = []
            for n, text in enumerate(texts):
                utt = f"{speaker}-{chapter}-{n:04d}"
                write_clip(folder / f"{utt}.flac", 0.2 + 0.15 * seed, seed, rate=8_000 if seed == 3 else SAMPLE_RATE)
                lines.append(f"{utt} {text}")
                seed += 1
            (folder / f"{speaker}-{chapter}.trans.txt").write_text("\n".join(lines) + "\n")
    return tmp_path


def read_up_front(root: Path, url: str) -> D.Utterances:
    """The reader as it was: every waveform read while the split is loaded."""
    dataset = LIBRISPEECH(str(root), url=url, download=False)
    rows = [dataset.get_metadata(i) for i in range(len(dataset))]
    return D.Utterances([read_audio(Path(dataset._archive) / r[0]) for r in rows], [r[2].lower() for r in rows],
                        [str(r[3]) for r in rows])


@pytest.fixture
def reads(monkeypatch):
    """The paths that soundfile reads samples from (headers are not counted)."""
    seen = []
    real = sf.read

    def counting(path, *args, **kwargs):
        seen.append(Path(path).name)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(sf, "read", counting)
    return seen


def test_librispeech_yields_the_same_utterances_as_reading_everything(librispeech_root):
    eager, lazy = read_up_front(librispeech_root, "train-clean-100"), D.librispeech(librispeech_root, "train-clean-100")
    assert isinstance(lazy.audio, D.AudioFiles) and len(lazy) == len(eager) == 5
    assert lazy.targets == eager.targets and lazy.speakers == eager.speakers
    assert lazy.targets[1] == "it's a test" and lazy.speakers == ["19", "19", "26", "26", "26"]
    for i in range(len(eager)):
        torch.testing.assert_close(lazy.audio[i], eager.audio[i], rtol=0, atol=0)
    assert lazy.lengths() == eager.lengths()  # from the headers, the 8 kHz file resampled included
    assert [D.resampled_length(p) for p in lazy.audio.paths] == [len(a) for a in eager.audio]
    assert list(lazy.audio)[4].shape == eager.audio[4].shape  # iterable like the list it replaces
    assert D.librispeech(librispeech_root, "train-clean-100", limit=2).targets == eager.targets[:2]


def test_loading_a_split_reads_no_audio_and_indexing_reads_one_file(librispeech_root, reads):
    utts = D.librispeech(librispeech_root, "train-clean-100")
    assert reads == []
    held = utts.select([4, 0])
    train, val = utts.hold_out_voices(0.5)
    assert reads == [] and isinstance(held.audio, D.AudioFiles) and isinstance(val.audio, D.AudioFiles)
    assert held.targets == ["the end", "hello world"] and held.lengths() == [utts.lengths()[4], utts.lengths()[0]]
    assert sorted(train.speakers + val.speakers) == sorted(utts.speakers) and set(train.speakers) != set(val.speakers)
    held.audio[0]
    assert reads == ["26-495-0002.flac"]
    list(experiment._batches(utts, batch_size=2))  # batches by length: headers only
    assert reads == ["26-495-0002.flac"]
    with pytest.raises(TypeError, match="indexed by one integer"):
        utts.audio[0:2]


def test_evaluation_over_a_lazy_split_equals_the_same_split_in_memory(librispeech_root):
    lazy = D.librispeech(librispeech_root, "train-clean-100")
    eager = read_up_front(librispeech_root, "train-clean-100")
    torch.manual_seed(0)
    model = experiment.CtcModel(experiment.SpeechEncoder("quest", 16, 2, 32, 1, 3, 16, 0.0, 0, 0), 16, len(D.CHARS))
    assert experiment.transcribe(model, lazy, "cpu") == experiment.transcribe(model, eager, "cpu")


def test_speech_commands_is_read_lazily_too(tmp_path, reads):
    base = tmp_path / "SpeechCommands" / "speech_commands_v0.02"
    for i, name in enumerate(["yes/aa11_nohash_0.wav", "no/bb22_nohash_0.wav"]):
        write_clip(base / name, 0.5, seed=i)
    (base / "testing_list.txt").write_text("")
    (base / "validation_list.txt").write_text("")
    train = D.speech_commands(tmp_path, "training")
    assert reads == [] and train.lengths() == [SAMPLE_RATE // 2] * 2
    assert sorted(D.WORDS[t] for t in train.targets) == ["no", "yes"] and len(train.audio[1]) == SAMPLE_RATE // 2
    assert len(reads) == 1
