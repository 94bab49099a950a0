"""The evaluation subsets and validation splits every task uses, on hand-checkable labels."""

import pytest
import torch

from quest_sdk.data import stratified_subset, validation_split


def test_stratified_subset_balances_classes_and_is_seeded():
    labels = torch.arange(4).repeat_interleave(25)  # class-sorted, as the shipped test splits are
    idx = stratified_subset(labels, 10, seed=1)
    counts = torch.bincount(labels[idx], minlength=4).tolist()
    assert sorted(counts) == [2, 2, 3, 3] and len(set(idx.tolist())) == 10  # 10 // 4 each, 2 classes get one more
    assert torch.equal(idx, stratified_subset(labels, 10, seed=1))
    assert not torch.equal(idx, stratified_subset(labels, 10, seed=2))
    assert torch.equal(stratified_subset(labels, 0, seed=1), torch.arange(100))  # 0 = everything
    assert torch.equal(stratified_subset(labels, 500, seed=1), torch.arange(100))


def test_a_small_class_gives_all_it_has_and_the_others_fill_up():
    labels = torch.tensor([0] * 2 + [1] * 50 + [2] * 50)
    idx = stratified_subset(labels, 30, seed=0)
    assert torch.bincount(labels[idx]).tolist() == [2, 14, 14]


def test_validation_split_is_disjoint_stratified_and_fixed():
    labels = torch.arange(5).repeat(40)  # interleaved classes
    train, val = validation_split(labels, 0.2)
    assert len(val) == 40 and len(train) == 160 and not set(train.tolist()) & set(val.tolist())
    assert torch.bincount(labels[val]).tolist() == [8] * 5
    skewed = torch.tensor([0] * 10 + [1] * 30)  # proportional, as a stratified split is
    assert torch.bincount(skewed[validation_split(skewed, 0.2)[1]]).tolist() == [2, 6]
    assert torch.equal(validation_split(labels, 0.2)[1], val)
    assert len(validation_split(labels, 0.0)[1]) == 0
    with pytest.raises(ValueError, match=r"validation fraction must be in \[0, 1\), got 1.0"):
        validation_split(labels, 1.0)
    with pytest.raises(ValueError, match="cannot hold out a stratified 0.5 of 3 training examples"):
        validation_split(torch.tensor([0, 1, 1]), 0.5)  # a class of one cannot be split
    tiny = torch.arange(3).repeat(4)  # 12 examples, 3 classes: 10% would be 1, fewer than the classes
    assert torch.bincount(tiny[validation_split(tiny, 0.1)[1]]).tolist() == [1, 1, 1]


def test_validation_split_shares_out_by_largest_remainder_and_takes_any_labels():
    labels = ["a"] * 5 + ["b"] * 3 + ["c"] * 2  # names, as the UEA files give them
    train, val = validation_split(labels, 0.4)  # 4 held out: quotas 2, 1.2, 0.8 -> 2, 1, 1
    held = [labels[i] for i in val.tolist()]
    assert sorted(held) == ["a", "a", "b", "c"] and sorted(train.tolist() + val.tolist()) == list(range(10))
    assert torch.equal(val, val.sort().values) and torch.equal(train, train.sort().values)
    one_class = validation_split([0.0] * 10, 0.3)[1]  # a plain random 30% (segmentation's image list)
    assert len(one_class) == 3 and not torch.equal(one_class, validation_split([0.0] * 10, 0.3, seed=1)[1])
    with pytest.raises(ValueError, match="2 examples would be left to train on, fewer than the 3 classes"):
        validation_split(torch.arange(3).repeat(2), 0.6)  # every class needs an example on each side


def test_validation_split_keeps_every_class_on_both_sides_and_the_sizes():
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        sizes = torch.randint(20, 60, (6,), generator=gen)  # quotas of at least 2: the one-per-class floor never binds
        labels = torch.arange(6).repeat_interleave(sizes)[torch.randperm(int(sizes.sum()), generator=gen)]
        fraction = float(torch.rand(1, generator=gen)) * 0.4 + 0.1
        train, val = validation_split(labels, fraction)
        classes = set(labels.tolist())
        assert set(labels[val].tolist()) == classes and set(labels[train].tolist()) == classes
        assert len(val) == max(round(fraction * len(labels)), len(classes))
        assert len(train) + len(val) == len(labels) and not set(train.tolist()) & set(val.tolist())
        quota = len(val) * sizes.double() / len(labels)
        assert ((torch.bincount(labels[val]) - quota).abs() < 1).all()  # proportional up to the rounding
