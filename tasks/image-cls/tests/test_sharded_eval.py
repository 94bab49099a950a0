"""Rank-aware evaluation: on 2 data-parallel CPU workers (gloo), each worker scores its shard of the evaluation set and
the counts are summed, so both report what one process scores over the whole set; tensors are only loaded for the
images an evaluation indexes."""

import torch
from torch import nn
from torch.utils.data import Subset

from quest_image_cls import data as D
from quest_image_cls.experiment import LazyImages, labels_of, loader_accuracy, materialise
from quest_image_cls.task import ImageClsTask
from quest_sdk.data import stratified_subset
from quest_sdk.engine import rank_shard
from quest_sdk.task import RunContext
from quest_sdk.testing import gloo_workers


def probe() -> nn.Module:
    """A fixed linear classifier whose predictions differ from image to image (an untrained ViT's are nearly
    constant, which would hide a shard scored twice or not at all)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, 10))


def evaluation_set():
    _, test_set, _ = D.load_digits()
    return Subset(test_set, list(range(0, len(test_set), 7)))  # 143 images: shards of 72 and 71


def sharded_accuracy(rank: int, tmp: str) -> float:
    ctx = RunContext(f"{tmp}/rank{rank}", "quest", progress=False, rank=rank, world_size=2)
    cfg = ImageClsTask().make_config("tiny", {})
    return loader_accuracy(probe(), evaluation_set(), cfg, "cpu", ctx=ctx)


def test_rank_shards_partition_the_items():
    for count in (0, 1, 7, 143):
        for world in (1, 2, 3, 8):
            shards = [rank_shard(count, r, world) for r in range(world)]
            assert [i for s in shards for i in s] == list(range(count))
            assert max(map(len, shards)) - min(map(len, shards)) <= 1


def test_sharded_evaluation_on_two_workers_equals_one_process(tmp_path):
    dataset, cfg = evaluation_set(), ImageClsTask().make_config("tiny", {})
    whole = loader_accuracy(probe(), dataset, cfg, "cpu")
    halves = [loader_accuracy(probe(), Subset(dataset, list(rank_shard(len(dataset), r, 2))), cfg, "cpu")
              for r in range(2)]
    assert halves[0] != halves[1]  # the shards score differently: a missing reduction would show
    assert gloo_workers(sharded_accuracy, 2, str(tmp_path)) == {0: whole, 1: whole}


def test_lazy_images_load_only_what_is_indexed_and_match_materialised_tensors():
    _, test_set, _ = D.load_digits()
    loaded = []

    class Counting(torch.utils.data.Dataset):
        def __len__(self):
            return len(test_set)

        def __getitem__(self, i):
            loaded.append(i)
            return test_set[i]

    keep = stratified_subset(labels_of(test_set), 50, seed=0)
    lazy = LazyImages(Counting(), keep)
    assert len(lazy) == 50 and loaded == []
    x, y = materialise(test_set, 50)
    assert torch.equal(lazy[[3, 1]], x[[3, 1]]) and loaded == [int(keep[3]), int(keep[1])]
    assert torch.equal(y, labels_of(test_set)[keep])
