"""analyze.py and the analyses it runs (issue 14; lab/analysis/steps.py, loops.py, alignment.py): linear CKA,
attention entropy and distance, the per-step analyses, LoopVAE's loop interventions and the teacher
alignment, on tiny checkpoints written by train.py. CPU only, tiny models, a few seconds each."""
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

import analyze
import bvit
import odevit
import srvit
import train
from analysis import alignment, loops, steps
from test_train import TINY, fake_cifar

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository


# ----------------------------------------------------------------------------- linear CKA
def test_cka_of_a_representation_with_itself_is_one():
    x = torch.randn(64, 16)
    assert steps.linear_cka(x, x) == pytest.approx(1.0, abs=1e-12)


def test_cka_is_invariant_to_orthogonal_maps_and_isotropic_scaling():
    g = torch.Generator().manual_seed(0)
    x, y = (torch.randn(100, d, generator=g, dtype=torch.float64) for d in (12, 20))
    q, _ = torch.linalg.qr(torch.randn(12, 12, generator=g, dtype=torch.float64))  # random orthogonal
    ref = steps.linear_cka(x, y)
    assert steps.linear_cka(x @ q, y) == pytest.approx(ref, abs=1e-12)
    assert steps.linear_cka(3.7 * x, y) == pytest.approx(ref, abs=1e-12)
    assert steps.linear_cka(x, 0.01 * x @ q) == pytest.approx(1.0, abs=1e-12)


def test_cka_is_not_invariant_to_a_general_invertible_linear_map():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(200, 10, generator=g, dtype=torch.float64)
    q1, _ = torch.linalg.qr(torch.randn(10, 10, generator=g, dtype=torch.float64))
    q2, _ = torch.linalg.qr(torch.randn(10, 10, generator=g, dtype=torch.float64))
    a = q1 @ torch.diag(torch.logspace(0, 2, 10, dtype=torch.float64)) @ q2  # invertible, condition 100
    assert torch.linalg.matrix_rank(a) == 10
    assert steps.linear_cka(x, x @ a) < 0.8  # CKA sees the anisotropic stretch


# ----------------------------------------------------------------------------- attention measures
def test_entropy_of_a_uniform_attention_is_log_n_and_of_a_one_hot_attention_zero():
    n = 17
    uniform = torch.full((2, 3, n, n), 1.0 / n)
    assert torch.allclose(steps.attention_entropy(uniform), torch.full((2, 3), math.log(n)))
    one_hot = torch.eye(n).expand(2, 3, n, n)
    assert torch.equal(steps.attention_entropy(one_hot), torch.zeros(2, 3))


def test_distance_of_an_attention_to_the_query_patch_itself_is_zero():
    grid = 4
    own = torch.eye(1 + grid * grid).expand(2, 3, -1, -1)  # every token (class token too) attends itself
    assert torch.equal(steps.attention_distance(own, grid, prefix=1), torch.zeros(2, 3))


def test_distance_of_a_uniform_attention_on_a_2x2_grid_is_the_mean_pairwise_distance():
    # from each patch: itself 0, two neighbours 1, the diagonal sqrt(2); the class token is ignored
    attn = torch.softmax(torch.randn(1, 1, 5, 5), -1)
    attn[..., 1:, 1:] = 0.1  # patch-to-patch weights equal (renormalized over the patch keys)
    assert steps.attention_distance(attn, 2, prefix=1).item() == pytest.approx((2 + math.sqrt(2)) / 4)


def test_distance_of_a_shift_by_one_patch_is_one():
    grid, n = 3, 9
    attn = torch.zeros(1, 1, n, n)
    for i in range(n):  # each patch attends to its right neighbour (the last column to its left one)
        r, c = divmod(i, grid)
        attn[0, 0, i, r * grid + (c + 1 if c + 1 < grid else c - 1)] = 1.0
    assert steps.attention_distance(attn, grid, prefix=0).item() == pytest.approx(1.0)


# ----------------------------------------------------------------------------- hooks
def images(n=12, size=16, classes=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(n, 3, size, size, generator=g), torch.randint(0, classes, (n,), generator=g))


TINY_MODEL = dict(img_size=16, patch_size=4, num_classes=10, embed_dim=32, num_heads=2)


@torch.no_grad()
def test_the_probe_does_not_change_the_logits_and_skipping_calls_the_step_the_identity():
    torch.manual_seed(0)
    model = bvit.BViT(depth=3, num_blocks=3, **TINY_MODEL).eval()  # untied: each step is its own block
    x = images()[:][0]
    ref = model(x)
    probe = steps.StepProbe(model, 1)
    probe.reset(record=True)
    assert torch.equal(model(x), ref)
    want = model.classify(model.blocks[2](model.blocks[0](model.embed(x))))  # block 1 left out
    probe.reset(skip=1)
    assert torch.equal(model(x), want)


@torch.no_grad()
def test_skipping_any_step_of_the_single_block_bvit_is_running_one_step_less():
    torch.manual_seed(0)
    model = bvit.BViT(depth=4, **TINY_MODEL).eval()
    x = images()[:][0]
    probe = steps.StepProbe(model, 1)
    for k in range(4):
        probe.reset(skip=k)
        assert torch.equal(model(x), model(x, depth=3))


@pytest.mark.parametrize("routing,lora_rank", [("smear", 0), ("lory", 0), ("depth", 4)])
@torch.no_grad()
def test_revit_moe_is_analysed_like_the_tied_block_it_reduces_to(routing, lora_rank):
    # one expert (smear, lory) or LoRA at init (B = 0) is the tied reViT E=1 (test_revit_moe),
    # so its analysis, run through the wrapped step method, must give the tied block's numbers
    import revit
    import revit_moe
    torch.manual_seed(0)
    ref = revit.ReViT(depth=3, experts=1, **TINY_MODEL).eval()
    m = revit_moe.ReViTMoE(routing=routing, lora_rank=lora_rank, depth=3, experts=1, **TINY_MODEL).eval()
    missing, unexpected = m.load_state_dict(ref.state_dict(), strict=False)
    assert not unexpected and all(k.startswith("blocks.0.lora") for k in missing)
    a, b = (steps.analyze(model, "revit", images(), 12, batch_size=5) for model in (ref, m))
    for key in ("cka", "act_norm", "attn_entropy", "attn_distance", "top1_skip", "top1"):
        np.testing.assert_allclose(a[key], b[key], atol=1e-5, err_msg=key)
    assert "_step_fn" not in vars(m) and "_attend" not in vars(m)  # the wrappers are removed
    assert ("lora_norms" in b) == bool(lora_rank)


@torch.no_grad()
def test_content_routed_gates_are_the_mean_gate_per_step():
    import revit_moe
    torch.manual_seed(0)
    m = revit_moe.ReViTMoE(routing="remoe", depth=3, experts=3, **TINY_MODEL).eval()
    torch.nn.init.normal_(m.router.weight, std=1.0)
    res = steps.analyze(m, "revit", images(), 12, batch_size=5)
    g = torch.tensor(res["gates"])  # (L, E): by hand, over the 12 images and their tokens
    x = images()[:][0]
    blk, z, want = m.blocks[0], m.embed(x), []
    for k in range(3):  # ReMoE's gates relu(W_r h), h the FFN input of each step
        want.append((blk.norm2(z + blk.attn(blk.norm1(z))) @ m.router.weight.T).relu().mean((0, 1)))
        z = m.step(z, k)
    assert g.shape == (3, 3) and torch.allclose(g, torch.stack(want), atol=1e-6)


@pytest.mark.parametrize("solver", ["euler", "heun", "rk4"])
@torch.no_grad()
def test_an_odevit_step_is_a_solver_step_and_its_state_the_solver_state(solver):
    torch.manual_seed(0)
    model = odevit.ODEViT(depth=3, solver=solver, **TINY_MODEL).eval()
    n, cps, solver_state = steps.step_structure(model, "odevit", None)
    assert (n, cps, solver_state) == (3, odevit.NFE_PER_STEP[solver], True)
    x = images()[:][0]
    probe = steps.StepProbe(model, cps)
    probe.reset(record=True)
    model(x)
    states = probe.states(n, solver_state)
    for k in range(1, n + 1):  # z(t_k) is what a k-step run (same h) hands to the final norm
        probe.reset(record=True)
        model(x, depth=k, extend="time")
        assert torch.allclose(states[k][0], probe.final[0], atol=1e-5)


@torch.no_grad()
def test_an_srvit_step_is_one_recursion_through_the_stack():
    torch.manual_seed(0)
    model = srvit.SRViT(depth=2, recursions=3, **TINY_MODEL).eval()
    res = steps.analyze(model, "srvit", images(), 12, batch_size=5)
    assert (res["depth"], res["calls_per_step"]) == (3, 2)
    assert len(res["cka"]) == 4 and len(res["top1_skip"]) == 3 and sum(res["mix_weights"]) == pytest.approx(1)


# ----------------------------------------------------------------------------- end to end
@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Tiny bvit and revit runs on a fake CIFAR-100 folder: {model: (ckpt path, data dir)}."""
    root = tmp_path_factory.mktemp("runs")
    cifar = fake_cifar(root / "data", n_train=32, n_test=40)
    out = {}
    for model, extra in (("bvit", ["--depth", "3"]), ("revit", ["--depth", "4", "--experts", "2"])):
        job = TINY + ["--data", "cifar100", "--data-dir", cifar, "--max-steps", "2", "--model", model,
                      "--out-dir", str(root / model)] + extra
        assert train.cli(job) == 0
        out[model] = (str(root / model / "ckpt.pt"), cifar)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name, depth", [("bvit", 3), ("revit", 4)])
def test_analyze_writes_cka_and_steps_of_a_checkpoint(checkpoints, tmp_path, name, depth):
    ckpt, cifar = checkpoints[name]
    assert analyze.cli(["--resume", ckpt, "--out-dir", str(tmp_path), "--num-images", "24",
                        "--batch-size", "10"]) == 0
    cka = json.load(open(tmp_path / "cka.json"))
    m = np.array(cka["cka"])
    assert m.shape == (depth + 1, depth + 1) and np.allclose(np.diag(m), 1) and np.allclose(m, m.T)
    assert cka["layers"] == ["embed"] + [f"step {k}" for k in range(1, depth + 1)]
    assert cka["num_images"] == 24 and cka["checkpoint"] == ckpt
    assert ("gates" in cka) == (name == "revit")
    if name == "revit":
        assert np.allclose(np.array(cka["gates"]).sum(1), 1, atol=1e-3) and len(cka["gates"]) == depth
    per_step = json.load(open(tmp_path / "steps.json"))
    assert [s["step"] for s in per_step["steps"]] == list(range(1, depth + 1))
    log_t = math.log(per_step["tokens"])
    for s in per_step["steps"]:
        assert len(s["attn_entropy"]) == len(s["attn_distance"]) == 2  # heads
        assert all(0 <= e <= log_t + 1e-6 for e in s["attn_entropy"])
        assert all(d >= 0 for d in s["attn_distance"]) and s["act_norm"] > 0 and 0 <= s["top1_skip"] <= 100
    # with no step skipped, the hooked pass gives the model's own top-1 on the same images
    model, val_set, _ = analyze.load(analyze.get_parser().parse_args(["--resume", ckpt, "--out-dir", "x"]))
    x, y = zip(*(val_set[i] for i in range(24)))
    with torch.no_grad():
        own = 100 * (model(torch.stack(x)).argmax(1) == torch.tensor(y)).double().mean().item()
    assert per_step["top1"] == pytest.approx(own)


@pytest.mark.slow
def test_analyze_at_another_depth(checkpoints, tmp_path):
    ckpt, _ = checkpoints["revit"]
    assert analyze.cli(["--resume", ckpt, "--out-dir", str(tmp_path), "--num-images", "8", "--depth", "6"]) == 0
    assert len(json.load(open(tmp_path / "cka.json"))["gates"]) == 6
    assert len(json.load(open(tmp_path / "steps.json"))["steps"]) == 6


# ----------------------------------------------------------------------------- bad input
def one_error_line(capsys, argv):
    rc = analyze.cli(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("analyze.py: error: "), (rc, err)
    return err[0]


@pytest.mark.slow
def test_bad_checkpoints_are_one_line_and_exit_2(tmp_path, capsys, checkpoints):
    out = ["--out-dir", str(tmp_path / "o")]
    assert "no such file" in one_error_line(capsys, ["--resume", str(tmp_path / "nope.pt")] + out)
    torch.save({"weight": torch.zeros(3)}, tmp_path / "sd.pt")
    assert "not an rvits checkpoint" in one_error_line(capsys, ["--resume", str(tmp_path / "sd.pt")] + out)
    ck = torch.load(checkpoints["bvit"][0], weights_only=True)
    ck["payload"] = np.random.RandomState(0)  # a pickled object outside the weights_only allow-list
    torch.save(ck, tmp_path / "evil.pt")
    assert "refused" in one_error_line(capsys, ["--resume", str(tmp_path / "evil.pt")] + out)
    ck = torch.load(checkpoints["bvit"][0], weights_only=True)
    ck["args"]["embed_dim"] = 64  # flags that do not describe the weights
    torch.save(ck, tmp_path / "mismatch.pt")
    assert "do not fit" in one_error_line(capsys, ["--resume", str(tmp_path / "mismatch.pt")] + out)
    assert "--num-images" in one_error_line(capsys, ["--resume", checkpoints["bvit"][0], "--num-images", "0"] + out)
    for extra in ([], ["--ranks"]):  # beyond 32x the trained depth (as --eval-depths): refused before any work
        ckpt = checkpoints["revit"][0]
        err = one_error_line(capsys, ["--resume", ckpt, "--depth", "129"] + extra + out)
        assert "--depth 129: at most 32x the trained depth 4 (128)" in err
    assert analyze.cli(["--resume", checkpoints["revit"][0], "--ranks", "--depth", "128", "--out-dir", str(tmp_path)]) == 0


@pytest.mark.slow
def test_the_script_exits_2_with_one_line(tmp_path):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "lab", "analyze.py"), "--resume", str(tmp_path / "no.pt"),
                        "--out-dir", str(tmp_path)], capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=120)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, r.stderr
    assert r.stderr.startswith("analyze.py: error: --resume") and "no such file" in r.stderr


# ----------------------------------------------------------------------------- LoopVAE's loop interventions
def test_loop_interventions_at_init_change_nothing_and_otherwise_match_a_hand_computed_bypass():
    """At initialization every LoopVAE pass is the identity (zero modulation gates, zero injection
    gate): truncating or bypassing a pass changes no pixel, every update is 0 and every image is
    monotone. With perturbed weights the full prefix is the full schedule, and a bypass's PSNR cost is
    the difference of the two reconstructions' PSNRs."""
    import loopvae
    torch.manual_seed(0)
    m = loopvae.LoopVAE(img_size=16, embed_dim=32, num_blocks=1, loops=(1, 2, 3), latent_dim=4, num_groups=8)
    x = torch.rand(6, 3, 16, 16) * 2 - 1
    r = loops.loop_interventions(m, x, batch_size=4)
    assert r["stages"] == {"enc_f4": 2, "enc_f8": 3, "dec_f4": 2, "dec_f2": 3}
    for name, n in r["stages"].items():
        assert r["prefix"][name] == [r["full"]["psnr"]] * n and r["monotone"][name] == 1.0
        assert r["bypass"][name] == [0.0] * n and r["update"][name] == [0.0] * n
    for p in m.parameters():  # away from the identity
        p.data.add_(0.05 * torch.randn_like(p))
    r = loops.loop_interventions(m, x, batch_size=4)
    full = m.metrics(x)["psnr"]
    assert r["prefix"]["dec_f2"][-1] == pytest.approx(float(full.mean()), abs=1e-5)
    lost = float((full - m.metrics(x, bypass=("dec_f2", 1))["psnr"]).mean())
    assert r["bypass"]["dec_f2"][1] == pytest.approx(lost, abs=1e-5) and lost != 0
    trace = {}
    m.metrics(x, trace=trace)
    assert r["update"]["enc_f8"] == pytest.approx(trace["enc_f8"].mean(0).tolist(), abs=1e-6)
    assert 0 <= min(r["monotone"].values()) and max(r["most_sensitive"].values()) <= 2


@pytest.mark.slow
def test_analyze_of_a_loopvae_checkpoint_writes_its_loop_interventions(tmp_path):
    import json
    import analyze
    import train_loopvae
    run = tmp_path / "run"
    assert train_loopvae.cli(["--model", "loopvae", "--data", "synthetic", "--embed-dim", "32", "--num-blocks", "1",
                      "--loops", "1,2", "--latent-dim", "4", "--batch-size", "4", "--max-steps", "2", "--val-subset",
                      "8", "--workers", "0", "--device", "cpu", "--out-dir", str(run)]) == 0
    assert analyze.cli(["--resume", str(run / "ckpt.pt"), "--out-dir", str(tmp_path / "a"), "--num-images", "4"]) == 0
    res = json.loads((tmp_path / "a" / "loops.json").read_text())
    assert set(res["prefix"]) == set(res["stages"]) and set(res["stages"]) == {"enc_f4", "dec_f2"} and len(res["prefix"]["dec_f2"]) == 2
    # every stage's bypasses (single-pass ones too: the paper's 14 per image), and per image, so that a
    # verdict can count images (issue 38): the per-image values average to the means
    assert set(res["stages"]) < set(res["bypass"]) and all(len(v) == 1 for k, v in res["bypass"].items()
                                                           if k not in res["stages"])
    per = res["per_image"]
    for s, lost in res["bypass"].items():
        assert [len(v) for v in per["bypass"][s]] == [4] * len(lost)
        assert all(abs(sum(v) / 4 - m) < 1e-3 for v, m in zip(per["bypass"][s], lost))
    assert [len(v) for v in per["prefix"]["dec_f2"]["psnr_raw"]] == [4, 4] and len(res["prefix_psnr_raw"]["dec_f2"]) == 2
    assert abs(sum(per["full"]["psnr"]) / 4 - res["full"]["psnr"]) < 1e-3 and len(per["update"]["dec_f2"]) == 2
    # --depth means nothing to a tokenizer's analysis: refused by name, not ignored (issue 37)
    assert analyze.cli(["--resume", str(run / "ckpt.pt"), "--out-dir", str(tmp_path / "b"), "--depth", "3"]) == 2
    assert not (tmp_path / "b").exists()


# ----------------------------------------------------------------------------- teacher alignment (issue 39)
def test_an_identity_alignment_has_rho_one_and_mad_zero_and_a_shuffled_one_does_not():
    eye = torch.eye(7) * 0.9 + 0.05  # student step k most like teacher layer k
    res = alignment.cka_path(eye.tolist())
    assert res["path"] == list(range(1, 7)) and res["rho"] == pytest.approx(1.0) and res["mad"] == 0
    assert alignment.teacher_cka(eye.tolist()) == pytest.approx(0.95)
    half = torch.zeros(4, 7)  # a 3-step student against a 6-layer teacher, on the proportional layers 2, 4, 6
    half[1, 2] = half[2, 4] = half[3, 6] = 1
    assert alignment.cka_path(half.tolist())["mad"] == 0 and alignment.teacher_cka(half.tolist()) == 1
    flip = torch.zeros(7, 7)  # the deepest student step most like the first teacher layer
    flip[1:, 1:] = torch.eye(6).flip(1)
    res = alignment.cka_path(flip.tolist())
    assert res["rho"] == pytest.approx(-1.0) and res["mad"] > 2
    assert alignment.spearman([1, 2, 2, 3], [0, 1, 2, 3]) == pytest.approx(0.9486833, abs=1e-6)  # ties: mean ranks


def test_a_student_equal_to_its_teacher_aligns_exactly_and_the_identity_permutation_changes_nothing():
    import revit
    torch.manual_seed(0)
    teacher = bvit.BViT(depth=3, num_blocks=3, **TINY_MODEL).eval()
    x = images(24)[:][0]
    res = alignment.alignment(teacher, teacher, lambda v: v, x)
    assert res["rho"] == pytest.approx(1.0) and res["mad"] == 0 and res["teacher_cka"] == pytest.approx(1.0)
    assert "deletions" not in res  # not a reViT with experts
    student = revit.ReViT(depth=3, experts=3, **TINY_MODEL).eval()
    with torch.no_grad():  # a router that gives the steps different gates
        for prm in student.router.parameters():
            prm.normal_(0, 1.0)
    logits = student(x)
    res = alignment.alignment(student, teacher, lambda v: v, x, draws=3)
    assert torch.equal(student(x), logits) and "ffn_weights" not in vars(student)  # restored after
    perms = res["permutations"]
    assert len(perms) == 6 and perms[0]["perm"] == [0, 1, 2]
    assert perms[0]["teacher_cka"] == pytest.approx(res["teacher_cka"], abs=1e-6)  # the identity: unchanged
    assert any(abs(p["teacher_cka"] - res["teacher_cka"]) > 1e-4 for p in perms[1:])  # others can differ
    g = torch.tensor(res["gates"])
    for d in res["deletions"]:
        kept = g.clone()
        kept[:, d["expert"]] = 0
        kept = kept / kept.sum(1, keepdim=True)
        assert d["displacement"] == pytest.approx(alignment.displacement(student, kept - g), rel=1e-6)
        assert len(d["random"]) == 3 and d["displacement"] > 0


@pytest.mark.slow
def test_analyze_teacher_writes_alignment_and_refuses_what_it_cannot_align(tmp_path, capsys):
    cifar = fake_cifar(tmp_path / "data")
    d = TINY + ["--data", "cifar100", "--data-dir", cifar, "--max-steps", "1"]
    assert train.cli(d + ["--model", "vit", "--out-dir", str(tmp_path / "t")]) == 0
    assert train.cli(d + ["--model", "revit", "--experts", "2", "--out-dir", str(tmp_path / "s")]) == 0
    assert train.cli(d + ["--model", "srvit", "--out-dir", str(tmp_path / "r")]) == 0
    capsys.readouterr()
    base = ["--teacher", str(tmp_path / "t" / "ckpt.pt"), "--num-images", "16", "--draws", "2"]
    assert analyze.cli(base + ["--resume", str(tmp_path / "s" / "ckpt.pt"), "--out-dir", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    assert "teacher: --model vit, patch 4, at the student's size" in out
    res = json.loads((tmp_path / "a" / "alignment.json").read_text())
    assert len(res["cross"]) == 3 and len(res["cross"][0]) == 3
    # the printed summary is what alignment.json holds, whatever the weights one step left (issue 62, item 16:
    # "gate permutations 1 of 1" not in the line was the outcome of one draw, and failed on torch 2.11)
    perms = res["permutations"]
    assert [p["perm"] for p in perms] == [[0, 1], [1, 0]]  # the identity first, then E = 2's one other
    assert perms[0]["teacher_cka"] == pytest.approx(res["teacher_cka"], abs=1e-5)  # the identity: the trained gates
    lower = sum(p["teacher_cka"] < res["teacher_cka"] for p in perms[1:])
    assert f"gate permutations {lower} of 1 lower (mean {perms[1]['teacher_cka']:.3f})" in out, out
    for argv, says in ((["--resume", str(tmp_path / "r" / "ckpt.pt")], "--model srvit"),
                       (["--resume", str(tmp_path / "s" / "ckpt.pt"), "--depth", "3"], "leave out --depth")):
        assert analyze.cli(base + argv + ["--out-dir", str(tmp_path / "b")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and says in err[0], err


# ----------------------------------------------------------------------------- reViT's effective ranks (sec. 5.2)
def test_effective_rank_is_exp_of_the_entropy_of_the_normalized_squared_singular_values():
    from analysis.ranks import effective_rank
    p = torch.tensor([9.0, 16.0], dtype=torch.float64) / 25  # diag(3, 4): sigma^2 = 9, 16
    assert effective_rank(torch.diag(torch.tensor([3.0, 4.0]))) == pytest.approx(math.exp(-(p * p.log()).sum()), abs=1e-12)
    g = torch.Generator().manual_seed(0)
    q, _ = torch.linalg.qr(torch.randn(50, 5, generator=g, dtype=torch.float64))  # 5 orthonormal columns
    assert effective_rank(q.T) == pytest.approx(5.0, abs=1e-9)  # E orthonormal rows -> E
    assert effective_rank(7.0 * q.T) == pytest.approx(5.0, abs=1e-9)  # scale-free
    rank1 = torch.outer(torch.randn(4, generator=g), torch.randn(300, generator=g))  # a rank-1 bank (E=4, P=300)
    assert effective_rank(rank1) == pytest.approx(1.0, abs=1e-6)
    assert effective_rank(torch.zeros(3, 4)) == 0.0
    with pytest.raises(ValueError, match="matrix"):
        effective_rank(torch.ones(3))


def test_a_uniform_gate_has_rank_one_and_nothing_left_after_removing_the_mean_across_depth():
    from analysis.ranks import depth_centered, effective_rank
    E, L = 4, 12
    uniform = torch.full((L, E), 1.0 / E)
    assert effective_rank(uniform) == pytest.approx(1.0, abs=1e-9) and effective_rank(depth_centered(uniform)) == 0.0
    # one expert per step (L = E, G = I): rank E; centered, C = I - 11^T / E, E - 1 equal directions (appendix D's
    # ceiling: every row of G sums to one)
    eye = torch.eye(E, dtype=torch.float64)
    assert effective_rank(eye) == pytest.approx(E) and effective_rank(depth_centered(eye)) == pytest.approx(E - 1)
    # two mixtures alternating over depth: rank 2 as trained, one direction (their difference) centered
    a, b = torch.tensor([0.7, 0.1, 0.1, 0.1]), torch.tensor([0.1, 0.2, 0.3, 0.4])
    alt = torch.stack([a if t % 2 else b for t in range(L)]).double()
    assert effective_rank(alt) > 1.05 and effective_rank(depth_centered(alt)) == pytest.approx(1.0, abs=1e-9)
    assert torch.allclose(depth_centered(alt), alt - alt.mean(0))  # C m, C = I - 11^T / L
    C = torch.eye(L, dtype=torch.float64) - torch.ones(L, L, dtype=torch.float64) / L
    assert torch.allclose(depth_centered(alt), C @ alt)


@torch.no_grad()
def test_expert_ranks_read_the_bank_the_gates_and_their_product_of_a_revit():
    import revit
    import revit_moe
    from analysis.ranks import effective_rank, expert_ranks
    torch.manual_seed(0)
    m = revit.ReViT(depth=6, experts=3, **TINY_MODEL).eval()
    torch.nn.init.normal_(m.router[2].weight, std=2.0)  # gates that change with depth
    res = expert_ranks(m)
    bank = m.blocks[0].mlp.fc1.weight.double().flatten(1)  # (E, P)
    g = m.gates().double()  # (L, E)
    assert (res["experts"], res["depth"], res["P"]) == (3, 6, bank.shape[1])
    assert res["bank"] == pytest.approx(effective_rank(bank)) and res["gate"] == pytest.approx(effective_rank(g))
    merged = torch.stack([m.ffn_weights(m.grid()[t:t + 1])[0][0].double().flatten() for t in range(6)])  # per step
    assert res["merged"] == pytest.approx(effective_rank(merged), rel=1e-6)  # G W1_bank = the merged W1 per step
    assert res["merged_centered"] == pytest.approx(effective_rank(merged - merged.mean(0)), rel=1e-6)
    assert 1 < res["gate"] <= 3 and 0 < res["gate_centered"] <= 2 + 1e-9 and res["merged"] <= 3 + 1e-9
    assert expert_ranks(m, depth=12)["depth"] == 12
    one = expert_ranks(revit.ReViT(depth=6, experts=1, **TINY_MODEL))  # the tied block: one direction, none varying
    assert (one["bank"], one["gate"], one["merged"], one["gate_centered"], one["merged_centered"]) == (1, 1, 1, 0, 0)
    with pytest.raises(ValueError, match="--routing smear"):
        expert_ranks(revit_moe.ReViTMoE(routing="smear", depth=3, experts=2, **TINY_MODEL))


def test_analyze_ranks_writes_beside_the_checkpoint_prints_a_table_and_refuses_other_models(checkpoints, capsys,
                                                                                              tmp_path):
    ckpt, _ = checkpoints["revit"]
    capsys.readouterr()
    assert analyze.cli(["--resume", ckpt, "--ranks"]) == 0  # no data needed, no --out-dir
    out = capsys.readouterr().out
    res = json.load(open(os.path.join(os.path.dirname(ckpt), "ranks.json")))
    assert (res["experts"], res["depth"]) == (2, 4) and "depth-centered" in out and "expert W1 bank" in out
    assert f"{res['merged']:.2f}" in out and res["checkpoint"] == ckpt
    assert analyze.cli(["--resume", ckpt, "--ranks", "--out-dir", str(tmp_path), "--depth", "8"]) == 0
    assert json.load(open(tmp_path / "ranks.json"))["depth"] == 8
    for argv, says in (([checkpoints["bvit"][0], "--ranks"], "--ranks"), ([ckpt], "--out-dir"),
                       ([ckpt, "--ranks", "--anytime"], "one analysis per command")):
        assert analyze.cli(["--resume", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and says in err[0], err
