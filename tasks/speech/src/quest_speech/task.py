"""quest-bench tasks ``speech-commands`` (isolated-word recognition) and ``asr`` (CTC character recognition): a
torchaudio Conformer with a quest-core attention variant, trained on speech synthesized in many voices and tested
on held-out voices, on real recordings, and under noise, speed, pitch and reverberation (``quest_speech.perturb``)."""

from __future__ import annotations

from dataclasses import dataclass

from quest_sdk.config import TrainingConfig, param
from quest_sdk.task import Resources, Task, Throughput, transformer_train_flops


# Conformer-S per layer: two half-step FFNs (ratio 4 each) and the convolution module's 3 dim^2 pointwise weights,
# counted as one MLP of ratio 9.5 (the depthwise convolution and the front end not counted).
CONFORMER_MLP_RATIO = 2 * 4 + 1.5


def _resources(throughput: Throughput):
    return {"tiny": Resources(num_cpus=1), "small": Resources(num_cpus=2),
            "paper": Resources(num_cpus=8, num_gpus=1, workers=4, memory_gb=32,  # per worker: a quarter of the batch
                               throughput=throughput)}


@dataclass
class SpeechConfig(TrainingConfig):
    """What both speech tasks share: model, optimisation and evaluation sizes."""

    dim: int = param(96, ge=1)
    num_heads: int = param(4, ge=1)
    ffn_dim: int = param(192, ge=1)
    num_layers: int = param(2, ge=1)
    kernel_size: int = param(15, ge=1)  # depthwise convolution of the Conformer (odd)
    n_mels: int = param(40, ge=8)
    dropout: float = param(0.1, ge=0, lt=1)
    freq_mask: int = param(8, ge=0)  # SpecAugment (0 = off)
    time_mask: int = param(10, ge=0)
    epochs: int = param(20, ge=1)
    lr: float = 2e-3
    warmup_frac: float = param(0.05, ge=0, le=1)  # linear warm-up over this fraction of the run (at least 1 step)
    grad_clip: float = 5.0
    narrowband: float = param(0.0, ge=0, le=1)  # probability that a training clip is band-limited to 4 kHz
    # (resampled to 8 kHz and back)
    val_fraction: float = param(0.1, ge=0, lt=1)  # synthesized data: the training voices held out for validation
    # (what a -tuned suite selects on; the same for every run); real data use their official validation split
    perturb_samples: int = param(200, ge=0)  # test utterances per perturbation level (0 = skip)
    log_every: int = 20

    def __post_init__(self):
        super().__post_init__()
        if self.dim % self.num_heads:
            raise ValueError(f"dim ({self.dim}) must be a multiple of num_heads ({self.num_heads})")
        if self.kernel_size % 2 == 0:
            raise ValueError(f"kernel_size ({self.kernel_size}) must be odd (torchaudio's Conformer)")


@dataclass
class KeywordConfig(SpeechConfig):
    dataset: str = param("synth", choices=("synth", "speechcommands"))  # synth (espeak-ng, split by voice) |
    # speechcommands (Speech Commands v2 from --data-root)
    train_per_word: int = param(60, ge=1)  # synthesized training utterances per word
    test_per_word: int = param(10, ge=1)  # synthesized held-out-voice test utterances per word
    limit: int = param(0, ge=0)  # at most this many real utterances per split (0 = all)
    narrowband: float = param(0.5, ge=0, le=1)  # the real digits are 8 kHz telephone prompts; without this the
    # check reads 0/10


@dataclass
class AsrConfig(SpeechConfig):
    dataset: str = param("synth", choices=("synth", "librispeech"))  # synth (espeak-ng sentences, split by voice) |
    # librispeech (from --data-root)
    train_sentences: int = param(1000, ge=1)
    test_sentences: int = param(100, ge=1)
    train_split: str = "train-clean-100"  # LibriSpeech folders
    val_split: str = "dev-clean"
    test_split: str = "test-clean"
    limit: int = param(0, ge=0)
    num_layers: int = param(3, ge=1)
    epochs: int = param(8, ge=1)
    perturb_samples: int = param(50, ge=0)


class SpeechCommandsTask(Task):
    name = "speech-commands"
    version = "3"  # 3: 10% of the training voices held out for val_acc
    # (2: the shared engine: per-step shuffles and augmentation generators)
    primary_metric = "test_acc"
    higher_is_better = True
    validation_metric = "val_acc"
    leaderboard_metrics = {"corrupted_acc": True, "real_digits_acc": True}
    config_class = KeywordConfig
    entry_point = "quest_speech.experiment:run_speech_commands"
    presets = {
        "tiny": {},
        "small": {"train_per_word": 200, "test_per_word": 30, "dim": 144, "num_layers": 4, "ffn_dim": 576,
                  "epochs": 30, "perturb_samples": 500},
        "paper": {"dataset": "speechcommands", "dim": 144, "num_layers": 16, "num_heads": 4, "ffn_dim": 576,
                  "kernel_size": 31, "n_mels": 80, "epochs": 50, "batch_size": 256, "lr": 1e-3,
                  "weight_decay": 1e-3, "perturb_samples": 2000},  # Conformer-S (Gulati et al. 2020) size
    }
    resources = _resources(Throughput(
        50 * 84_843, transformer_train_flops(16, 144, 101 // 4, CONFORMER_MLP_RATIO),
        "50 epochs x Speech Commands v2's 84,843 training clips of 1 s (100 frames, 25 after the 4x subsampler)"))

    shipped_datasets = ("synth",)

    def data_layout(self, cfg: KeywordConfig) -> str:
        return ("SpeechCommands/speech_commands_v0.02/<word>/*.wav with validation_list.txt and testing_list.txt "
                "(speech_commands_v0.02.tar.gz unpacked into SpeechCommands/speech_commands_v0.02/)")

    def check_layout(self, cfg: KeywordConfig, root) -> None:
        folder = root / "SpeechCommands" / "speech_commands_v0.02"
        missing = [n for n in ("validation_list.txt", "testing_list.txt") if not (folder / n).is_file()]
        if missing:
            raise ValueError(f"speechcommands: no {', '.join(missing)} in {folder}; expected under {root}: "
                             f"{self.data_layout(cfg)}")


class AsrTask(Task):
    name = "asr"
    version = "3"  # 3: 10% of the training voices held out for val_cer
    # (2: the shared engine: per-step shuffles and augmentation generators)
    primary_metric = "test_cer"
    higher_is_better = False
    validation_metric = "val_cer"
    leaderboard_metrics = {"test_wer": False, "real_cer": False, "corrupted_char_acc": True}
    config_class = AsrConfig
    entry_point = "quest_speech.experiment:run_asr"
    presets = {
        "tiny": {},
        "small": {"train_sentences": 1900, "test_sentences": 170, "dim": 144, "num_layers": 4, "ffn_dim": 576,
                  "epochs": 20, "perturb_samples": 170},
        "paper": {"dataset": "librispeech", "dim": 144, "num_layers": 16, "num_heads": 4, "ffn_dim": 576,
                  "kernel_size": 31, "n_mels": 80, "epochs": 100, "batch_size": 64, "lr": 1e-3,
                  "weight_decay": 1e-3, "freq_mask": 27, "time_mask": 40, "perturb_samples": 1000},
    }
    resources = _resources(Throughput(
        100 * 28_539, transformer_train_flops(16, 144, 1270 // 4, CONFORMER_MLP_RATIO),
        "100 epochs x train-clean-100's 28,539 utterances, 12.7 s on average (1,270 frames, 317 after the 4x "
        "subsampler)"))

    shipped_datasets = ("synth",)

    def data_layout(self, cfg: AsrConfig) -> str:
        return (f"LibriSpeech/{{{cfg.train_split},{cfg.val_split},{cfg.test_split}}}/<speaker>/<chapter>/*.flac and "
                "*.trans.txt (the OpenSLR tarballs unpacked there)")

    def check_layout(self, cfg: AsrConfig, root) -> None:
        missing = [s for s in (cfg.train_split, cfg.val_split, cfg.test_split) if not (root / "LibriSpeech" / s).is_dir()]
        if missing:
            raise ValueError(f"librispeech: no split folder(s) {', '.join(missing)} in {root / 'LibriSpeech'}; "
                             f"expected under {root}: {self.data_layout(cfg)}")
