"""Repeated augmentation (--repeated-aug N; data.ResumableSampler): DeiT's RASampler semantics
(github.com/facebookresearch/deit, samplers.py) on a simulated world of 1, 2 and 4 processes, its
determinism, its mid-epoch start, the N different augmentations of one image, the plain sampler
left as it was, and the flag's way to every training loader. CPU only, no training."""
import pytest
import torch
from torch.utils.data import DistributedSampler

import data
import train
from training.flags import get_parser, parse_args
from test_speed import indexed_images


class Items(torch.utils.data.Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n


def ranks(n, world, repeats=3, seed=3, epoch=2):
    """[(indices, keys)] of each rank's sampler at (seed, epoch), built independently as each process does."""
    out = []
    for r in range(world):
        s = data.ResumableSampler(Items(n), world, r, seed, repeats)
        s.set_epoch(epoch)
        out.append(tuple(t.tolist() for t in s.slots()))
    return out


@pytest.mark.parametrize("n", [1000, 100])
@pytest.mark.parametrize("world", [1, 2, 4])
def test_each_image_of_an_epoch_comes_three_times_its_copies_on_different_processes(n, world):
    got = ranks(n, world)
    per_rank = (n // 256 * 256 if n >= 256 else n) // world  # DeiT: floor(n // 256 * 256 / world)
    assert [len(i) for i, _ in got] == [per_rank] * world
    # DeiT's repeated list, by hand: one permutation (seed + epoch, as DistributedSampler draws it), each image
    # 3 times in a row, rank r taking every world-th entry from entry r
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(3 + 2))
    for r, (index, _) in enumerate(got):
        assert index == perm.repeat_interleave(3)[r::world][:per_rank].tolist(), r
    # the ranks' samples put back in slot order: runs of 3 copies of one image, every image once
    slots = [(r, got[r][0][j], got[r][1][j]) for j in range(per_rank) for r in range(world)]
    runs = [slots[k:k + 3] for k in range(0, len(slots), 3)]
    assert len({rn[0][1] for rn in runs}) == len(runs)  # one permutation: no image in two runs
    for rn in runs:
        assert len({i for _, i, _ in rn}) == 1  # the same permutation on every rank
        assert len({key for _, _, key in rn}) == len(rn) and all(key % n == i for _, i, key in rn)  # 3 copies
        if len(rn) == 3:  # (the last run may be cut by the epoch's end)
            assert len({r for r, _, _ in rn}) == min(world, 3)  # on 3 processes, or on both, or on the one
    keys = [key for _, _, key in slots]
    assert len(set(keys)) == len(keys)  # disjoint: no (image, copy) on two ranks or twice on one
    assert len({i for _, i, _ in slots}) == -(-len(slots) // 3)  # an epoch sees about n / 3 images, 3 times each


def test_the_order_is_a_function_of_seed_and_epoch():
    base = ranks(1000, 2)
    assert ranks(1000, 2) == base
    assert ranks(1000, 2, epoch=3) != base and ranks(1000, 2, seed=4) != base
    s = data.ResumableSampler(Items(1000), 2, 1, 3, 3)
    s.set_epoch(2)
    assert [i for i, _ in s] == base[1][0]  # the samples __iter__ yields are slots()'


@pytest.mark.parametrize("world", [1, 2])
def test_a_mid_epoch_start_yields_the_rest_of_the_uninterrupted_order(world):
    for r in range(world):
        s = data.ResumableSampler(Items(1000), world, r, 0, 3)
        s.set_epoch(5)
        full = list(s)
        for start in (1, 7, len(full) - 1):
            s.set_start(start)
            assert len(s) == len(full) - start and list(s) == full[start:]  # indices and augmentation seeds


@pytest.mark.parametrize("world", [1, 2, 3])
def test_without_repeats_the_sampler_is_torchs_distributed_sampler_as_before(world):
    """--repeated-aug 0: the order and augmentation seeds of every earlier run (index-keyed)."""
    for r in range(world):
        ours, torchs = data.ResumableSampler(Items(50), world, r, 7), DistributedSampler(
            Items(50), world, r, shuffle=True, seed=7, drop_last=True)
        ours.set_epoch(4), torchs.set_epoch(4)
        base = (7 * 1_000_003 + 4) * 100_003
        assert list(ours) == [(i, base + i) for i in torchs] and len(ours) == len(torchs)


def test_the_copies_of_an_image_are_augmented_differently_on_both_cpu_loaders():
    ds = indexed_images(60)
    ds.transform = data.build_transform(True, 32, data.CIFAR_MEAN, data.CIFAR_STD, "cifar100")  # crop + flip
    for loader in (data.build_loader(ds, 6, True, seed=1, workers=0, repeats=3),
                   data.DeviceCIFARLoader(ds, 6, True, seed=1, device="cpu", repeats=3)):
        loader.sampler.set_epoch(0)
        x, y = next(iter(loader))
        for k in (0, 3):  # one process: the 3 copies stand side by side in the batch
            assert y[k] == y[k + 1] == y[k + 2], type(loader)
            assert not torch.equal(x[k], x[k + 1]) and not torch.equal(x[k + 1], x[k + 2]), type(loader)


@pytest.mark.slow
def test_repeated_aug_reaches_every_training_loader(tmp_path):
    """build_loaders' three training paths (data.py's docstring) all sample with --repeated-aug."""
    p = get_parser()
    cifar = indexed_images(300)
    from test_presets import fake_imagenet
    folder = data.build_datasets("imagenet", fake_imagenet(tmp_path / "in"), 32)[0]
    for argv, ds, device, kind in ((["--workers", "0"], cifar, "cpu", data.DeviceCIFARLoader),
                                   (["--workers", "0", "--cpu-loader"], cifar, "cpu", torch.utils.data.DataLoader),
                                   (["--data", "imagenet", "--workers", "0"], folder, "cuda", data.DeviceDecodeLoader)):
        args = parse_args(p, argv + ["--repeated-aug", "3"])
        loader, _ = data.build_loaders(args, ds, ds, 4, 0, 1, torch.device(device))  # (nothing runs on cuda here)
        assert isinstance(loader, kind) and loader.sampler.repeats == 3, kind
        assert len(loader.sampler) == (256 if ds is cifar else len(ds))  # 300 images: 256 slots


@pytest.mark.slow
@pytest.mark.parametrize("value, says", [("1", "1 copy is no repetition"), ("-1", "must be >= 0"),
                                         ("two", "expected an integer")])
def test_a_bad_repeated_aug_is_one_line_exit_2(capsys, value, says):
    capsys.readouterr()
    assert train.cli(["--repeated-aug", value, "--print-config"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--repeated-aug" in err[0] and says in err[0], err
    assert parse_args(get_parser(), []).repeated_aug == 0  # off by default
