"""Tests for loopvae.py (LoopVAE, arXiv 2609.11516): the mathematics of the block, the core, the
interventions, the posterior, the metrics and the Stage-2 losses.

CPU only, tiny configurations. Run: python -m pytest -q test_loopvae.py
"""
import math
import re

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import loopvae as lv

TINY = dict(img_size=16, embed_dim=16, num_groups=8, latent_dim=4, num_heads=2, window_size=4)
STAGES = ["enc_f2", "enc_f4", "enc_f8", "dec_f8", "dec_f4", "dec_f2"]  # execution order


def tiny(perturb=False, **kw):
    torch.manual_seed(0)
    m = lv.LoopVAE(**{**TINY, **kw}).eval()
    if perturb:  # blocks that are not the identity: random modulations, open injection gates
        with torch.no_grad():
            for mod in m.modules():
                if isinstance(mod, lv.Modulation):
                    mod.proj.weight.normal_(0, 0.2)
                    mod.proj.bias.normal_(0, 0.2)
                elif isinstance(mod, lv.Injection):
                    mod.gate.fill_(0.5)
    return m


def images(b=2, size=16, seed=1):
    return torch.rand(b, 3, size, size, generator=torch.Generator().manual_seed(seed)) * 2 - 1


# ----------------------------------------------------------------------------- block and core
@pytest.mark.parametrize("operator", lv.OPERATORS)
def test_every_block_is_identity_at_init(operator):
    for share in lv.SHARES:
        m = tiny(operator=operator, share=share)
        u, c = torch.randn(1, 16, 8, 8), torch.randn(1, 16)
        for core in (m.encoder.core, m.decoder.core):
            for blk in core.blocks:
                for window in (None, 4):
                    assert torch.equal(blk(u, c, window), u)
            for s in range(3):  # the whole stage too: injection gate 0, identity blocks
                assert torch.equal(core(u, s, lv.Interventions()), u)
    blk = tiny(perturb=True, operator=operator).encoder.core.blocks[0]
    assert not torch.allclose(blk(u, c, 4), u)  # the check can fail: a trained block is not the identity


def test_sharing_scopes_store_4_12_28_blocks():
    p = sum(q.numel() for q in tiny().encoder.core.blocks[0].parameters())
    base = tiny().num_params()
    for share, n in zip(lv.SHARES, (4, 12, 28)):  # eq. 6: K p, S K p, K p sum(L)
        m = tiny(share=share)
        assert len(m.encoder.core.blocks) == len(m.decoder.core.blocks) == n
        assert m.num_params(core_only=True) == 2 * n * p
        assert m.num_params() == base + 2 * (n - 4) * p  # everything else is the same
        assert m.macs_per_image() == tiny().macs_per_image()  # and so is the execution graph


def test_scopes_map_passes_to_blocks():
    for share in lv.SHARES:
        core, K = tiny(share=share).encoder.core, 4
        ids = {(s, t): [id(core.block(s, t, j)) for j in range(K)] for s in range(3) for t in range(core.loops[s])}
        assert all(len(set(v)) == K for v in ids.values())  # K distinct blocks in every pass
        distinct = {tuple(v) for v in ids.values()}
        if share == "global":
            assert len(distinct) == 1
        elif share == "scale":  # the same set on every pass of a scale, another set per scale
            assert all(ids[s, t] == ids[s, 0] for s, t in ids) and len(distinct) == 3
        else:
            assert len(distinct) == 7 and len({i for v in ids.values() for i in v}) == 28


def test_stage_follows_eq_4_written_out():
    m, h0 = tiny(perturb=True), torch.randn(2, 16, 4, 4)
    core = m.encoder.core
    c = lambda t: core.scale_embed.weight[2:3] + core.loop_embed.weight[t:t + 1]  # eq. 3 at scale 8x
    inj = core.inject["2"].gate * core.inject["2"].proj(h0)  # I_s(h_{s,0}) = g_s P_s(h_{s,0})
    h = h0
    for t in range(4):  # h_{s,t+1} = F(h_{s,t} + 1[t>0] I_s(h_{s,0}), c_{s,t}), F = blocks 0..3
        u = h + inj if t > 0 else h
        for j in range(4):
            u = core.blocks[j](u, c(t))
        h = u
    torch.testing.assert_close(core(h0, 2, lv.Interventions()), h, rtol=0, atol=0)


def tie(src, dst):
    """Copy src (global) into dst: every stored block of dst gets src's block j = index mod K."""
    sd, new = src.state_dict(), {}
    for k in dst.state_dict():
        hit = re.match(r"(encoder|decoder)\.core\.blocks\.(\d+)\.(.*)", k)
        new[k] = sd[f"{hit[1]}.core.blocks.{int(hit[2]) % src.num_blocks}.{hit[3]}"] if hit else sd[k]
    dst.load_state_dict(new, strict=True)


@pytest.mark.parametrize("operator", lv.OPERATORS)
def test_tied_scopes_give_identical_outputs(operator):
    g, x = tiny(perturb=True, operator=operator), images()
    ref = g(x)[0]
    for share in ("scale", "none"):
        m = tiny(operator=operator, share=share)
        tie(g, m)
        assert torch.equal(m(x)[0], ref)
        with torch.no_grad():
            m.decoder.core.blocks[-1].mod.proj.bias.add_(0.1)  # untie one block: the output moves
        assert not torch.allclose(m(x)[0], ref)


# ----------------------------------------------------------------------------- interventions (sec. 4.4)
def test_schedule_is_traversal_order():
    assert tiny().schedule() == dict(zip(STAGES, [1, 2, 4, 1, 2, 4]))  # the decoder loops most at 2x


def test_truncation_to_full_schedule_is_plain_forward():
    m, x = tiny(perturb=True), images()
    ref = m(x)[0]
    for stage, passes in m.schedule().items():
        assert torch.equal(m(x, truncate={stage: passes})[0], ref)
    assert not torch.allclose(m(x, truncate={"dec_f2": 3})[0], ref)


def test_truncation_keeps_first_k_passes_and_runs_the_rest_in_full():
    m, x = tiny(perturb=True), images()
    full, cut = {}, {}
    m(x, states=full)
    m(x, truncate={"enc_f8": 2}, states=cut)
    assert len(cut["enc_f8"]) == 3 and all(torch.equal(a, b) for a, b in zip(cut["enc_f8"], full["enc_f8"]))
    assert all(len(cut[s]) == len(full[s]) for s in STAGES if s != "enc_f8")
    assert all(torch.equal(a, b) for s in STAGES[:2] for a, b in zip(cut[s], full[s]))


@pytest.mark.parametrize("stage,t", [("enc_f8", 1), ("dec_f4", 0), ("dec_f2", 2)])
def test_bypass_changes_only_what_follows(stage, t):
    m, x = tiny(perturb=True), images()
    full, byp = {}, {}
    m(x, states=full)
    m(x, bypass=(stage, t), states=byp)
    i = STAGES.index(stage)
    for s in STAGES[:i]:  # earlier stages: unchanged
        assert all(torch.equal(a, b) for a, b in zip(byp[s], full[s]))
    assert all(torch.equal(a, b) for a, b in zip(byp[stage][:t + 1], full[stage][:t + 1]))  # earlier passes
    assert torch.equal(byp[stage][t + 1], byp[stage][t])  # the pass's output is its input
    assert all(not torch.allclose(a, b) for a, b in zip(byp[stage][t + 1:], full[stage][t + 1:]))  # later ones
    for s in STAGES[i + 1:]:  # later stages: changed
        assert not torch.allclose(byp[s][-1], full[s][-1])


def test_relative_update_is_rms_ratio_of_pre_injection_states():
    m, x = tiny(perturb=True), images()
    trace, states = {}, {}
    m(x, trace=trace, states=states, bypass=("dec_f2", 1))
    rms = lambda t: t.pow(2).flatten(1).mean(1).sqrt()
    for s in STAGES:
        h = states[s]
        want = torch.stack([rms(h[k + 1] - h[k]) / rms(h[k]) for k in range(len(h) - 1)], dim=1)
        assert trace[s].shape == (2, m.schedule()[s])
        torch.testing.assert_close(trace[s], want)
    assert torch.equal(trace["dec_f2"][:, 1], torch.zeros(2))


def test_bad_interventions_raise_one_line_errors():
    m, x = tiny(), images()
    for kw in (dict(truncate={"enc_f16": 1}), dict(truncate={"enc_f8": 0}), dict(truncate={"enc_f8": 5}),
               dict(bypass=("dec_f8", 1)), dict(bypass=[("bogus", 0)])):
        with pytest.raises(ValueError):
            m(x, **kw)
    for kw in (dict(share="layer"), dict(operator="mlp"), dict(num_groups=5), dict(img_size=36)):
        with pytest.raises(ValueError):
            tiny(**kw)
    with pytest.raises(ValueError):
        m(images(size=20))
    # a bypass the truncation removes would change nothing: refused (issue 37's review of LoopVAE, issue 38)
    with pytest.raises(ValueError, match="removes it"):
        m(x, truncate={"dec_f2": 1}, bypass=("dec_f2", 1))


def test_a_bypass_pair_as_a_list_is_the_pair_not_its_characters():
    m, x = tiny(), images()
    m.eval()
    with torch.no_grad():
        assert torch.equal(m(x, bypass=["dec_f2", 1])[0], m(x, bypass=("dec_f2", 1))[0])


def test_attention_at_a_grid_its_windows_do_not_tile_is_a_value_error():
    attn = lv.WindowAttention(16, 2)
    with pytest.raises(ValueError, match="does not split into 8x8 windows"):
        attn(torch.randn(1, 12, 12, 16), 8)


# ----------------------------------------------------------------------------- attention
def test_rope_2d_dot_product_depends_on_the_offset_only():
    g = torch.Generator().manual_seed(0)
    q = lv.rope_2d(torch.randn(8, generator=g).expand(5, 6, 8))  # one vector at every position
    k = lv.rope_2d(torch.randn(8, generator=g).expand(5, 6, 8))
    dot = lambda a, b: (q[a] * k[b]).sum()
    torch.testing.assert_close(dot((1, 2), (3, 1)), dot((2, 4), (4, 3)))  # same offset (2, -1)
    torch.testing.assert_close(dot((0, 0), (0, 0)), dot((4, 5), (4, 5)))
    assert not torch.allclose(dot((1, 2), (3, 1)), dot((1, 2), (1, 3)))


def test_windows_do_not_see_each_other():
    torch.manual_seed(0)
    attn, x = lv.WindowAttention(16, 2), torch.randn(1, 16, 16, 16)  # (B, H, W, C)
    y = x.clone()
    y[:, :8, :8] += 1.0  # change window (0, 0) only
    a, b = attn(x, 8), attn(y, 8)
    assert torch.equal(a[:, 8:], b[:, 8:]) and torch.equal(a[:, :8, 8:], b[:, :8, 8:])
    assert not torch.allclose(a[:, :8, :8], b[:, :8, :8])
    assert not torch.allclose(attn(x, None)[:, 8:], attn(y, None)[:, 8:])  # global attention does


# ----------------------------------------------------------------------------- posterior, loss, metrics
def test_kl_matches_hand_computed_values():
    mean, logvar = torch.tensor([1.0, 0.0, -2.0]), torch.tensor([0.0, math.log(4.0), math.log(0.5)])
    want = torch.tensor([0.5, 0.5 * (4 - 1 - math.log(4)), 0.5 * (4 + 0.5 - 1 - math.log(0.5))])
    torch.testing.assert_close(lv.kl_divergence(mean, logvar), want)


def test_posterior_sample_noise_in_training_mode_at_evaluation():
    mean, logvar = torch.randn(4, 16, 32, 32), torch.full((4, 16, 32, 32), -30.0)
    assert lv.sample_posterior(mean, logvar, 0.05, training=False) is mean
    torch.manual_seed(0)
    std = (lv.sample_posterior(mean, logvar, 0.05, training=True) - mean).std()
    assert abs(std.item() - 0.05) < 0.001  # exp(-15) ~ 3e-7: the N(0, 0.05^2) perturbation alone
    m, x = tiny(), images()
    assert torch.equal(m(x)[0], m(x)[0])  # eval: the posterior mode
    m.train()
    assert not torch.equal(m(x)[0], m(x)[0])


def test_stage1_loss_is_l1_plus_weighted_kl_and_perceptual():
    m, x = tiny(perturb=True), images()
    x_hat, mean, logvar = m.reconstruct(x)
    l1, kl = (x_hat - x).abs().mean(), lv.kl_divergence(mean, logvar).mean()
    _, loss = m(x, torch.tensor([3, 7]))  # class labels: ignored, the target is x
    torch.testing.assert_close(loss, l1 + 1e-6 * kl)
    assert set(m.aux) == {"l1", "kl"} and not m.aux["l1"].requires_grad
    fake_lpips = nn.Conv2d(3, 1, 1)  # a module: must stay outside the model's parameters and state
    n, keys = m.num_params(), set(m.state_dict())
    m.set_perceptual(lambda a, b: fake_lpips(a - b).pow(2).mean())
    _, loss = m(x, 0)
    torch.testing.assert_close(loss, l1 + 1e-6 * kl + fake_lpips(x_hat - x).pow(2).mean())
    assert m.num_params() == n and set(m.state_dict()) == keys and "perceptual" in m.aux
    assert m(x)[1] is None


def test_psnr_matches_hand_computed_values():
    y = torch.full((2, 3, 4, 4), 0.5)
    torch.testing.assert_close(lv.psnr(y + 0.1, y), torch.tensor([20.0, 20.0]))  # MSE 0.01
    over, one = torch.full((1, 3, 4, 4), 1.5), torch.ones(1, 3, 4, 4)
    assert lv.psnr(over, one).item() == 120.0  # clipped: exact, capped at 120 dB
    torch.testing.assert_close(lv.psnr(over, one, clip=False), torch.tensor([-10 * math.log10(0.25)]))


def test_ssim_matches_hand_computed_values():
    c1, c2 = 0.01 ** 2, 0.03 ** 2
    a, b = torch.full((1, 1, 13, 13), 0.3), torch.full((1, 1, 13, 13), 0.7)
    torch.testing.assert_close(lv.ssim(a, b), torch.tensor([(2 * .3 * .7 + c1) / (.3 ** 2 + .7 ** 2 + c1)]))
    # one 11x11 window: the weighted statistics written out (Wang et al. 2004, sigma 1.5)
    g = torch.Generator().manual_seed(0)
    u, y = torch.rand(1, 1, 11, 11, generator=g), torch.rand(1, 1, 11, 11, generator=g)
    r = torch.arange(11.0) - 5
    w = torch.exp(-(r[:, None] ** 2 + r[None, :] ** 2) / (2 * 1.5 ** 2))
    w = w / w.sum()
    mu_u, mu_y = (w * u).sum(), (w * y).sum()
    vu, vy, cov = (w * (u - mu_u) ** 2).sum(), (w * (y - mu_y) ** 2).sum(), (w * (u - mu_u) * (y - mu_y)).sum()
    want = (2 * mu_u * mu_y + c1) * (2 * cov + c2) / ((mu_u ** 2 + mu_y ** 2 + c1) * (vu + vy + c2))
    torch.testing.assert_close(lv.ssim(u, y), want.view(1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lv.ssim(u.expand(2, 3, 11, 11), u.expand(2, 3, 11, 11)), torch.ones(2))
    with pytest.raises(ValueError):
        lv.ssim(u[..., :10, :10], y[..., :10, :10])


def test_out_of_range_counts_pixels_with_any_channel_outside():
    u = torch.full((1, 3, 2, 2), 0.5)
    u[0, 1, 0, 0], u[0, 2, 0, 0], u[0, 0, 1, 1] = 1.01, -0.2, -1e-4  # two pixels of four
    u[0, 0, 0, 1] = 1.0  # on the boundary: inside
    torch.testing.assert_close(lv.out_of_range(u), torch.tensor([0.5]))
    m, x = tiny(perturb=True), images()
    res = m.metrics(x)
    assert set(res) == {"l1", "psnr", "psnr_raw", "ssim", "kl", "out_of_range"}
    assert all(v.shape == (2,) for v in res.values())


# ----------------------------------------------------------------------------- training, counts
def test_thirty_steps_lower_the_l1():
    m = tiny(num_blocks=2, loops=(1, 2))  # two scales, f4: 4 x 4 x 4 latents of 16 px images
    g = torch.Generator().manual_seed(1)  # four smooth images, so a small latent can hold them
    x = F.interpolate(torch.rand(4, 3, 4, 4, generator=g) * 2 - 1, size=16, mode="bilinear", align_corners=False)
    l1 = lambda: m.eval().metrics(x)["l1"].mean().item()
    before = l1()
    opt = torch.optim.Adam(m.parameters(), lr=5e-3)
    for _ in range(30):
        loss = m.train()(x, 0)[1]
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert l1() < 0.6 * before


def test_grad_checkpointing_gives_the_same_gradients():
    m, x = tiny(perturb=True), images()
    m.train()
    grads = []
    for ckpt in (False, True):
        m.set_grad_checkpointing(ckpt).zero_grad()
        torch.manual_seed(0)
        m(x, 0)[1].backward()
        grads.append([p.grad.clone() for p in m.parameters()])  # every parameter has one: DDP needs no
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(*grads))  # find_unused_parameters
    for loops in ((1, 1, 1), (2, 1, 3)):  # also where some scales do not loop (no injection there)
        m = tiny(perturb=True, loops=loops).train()
        m(x, 0)[1].backward()
        assert all(p.grad is not None for p in m.parameters())


@pytest.mark.parametrize("operator", lv.OPERATORS)
def test_macs_match_a_count_by_hooks(operator):
    m, macs = tiny(operator=operator), [0]

    def count(mod, args, out):  # a conv or linear map: output elements per batch row x weight per output
        macs[0] += out.numel() // out.shape[0] * mod.weight[0].numel()

    def attention(mod, args, out):  # q k^T and attn v: 2 N n C
        (B, H, W, C), win = args[0].shape, args[1]
        n = H * W if win is None or win >= max(H, W) else win * win
        macs[0] += 2 * H * W * n * C

    for mod in m.modules():
        if isinstance(mod, (nn.Conv2d, nn.Linear)):
            mod.register_forward_hook(count)
        elif isinstance(mod, lv.WindowAttention):
            mod.register_forward_hook(attention)
    m(images(b=1))
    assert macs[0] == m.macs_per_image() and m.flops_per_image() == 2 * macs[0]


def test_paper_config_parameter_count_within_six_percent():
    with torch.device("meta"):
        cnn, vit = lv.loopvae_cnn_f8d16(), lv.loopvae_vit_f8d16()
    assert cnn.num_params() == 27_380_775  # the docstring's number
    assert abs(cnn.num_params() / 29.07e6 - 1) < 0.06  # paper: 29.07M (Table 5, App. A.1)
    assert cnn.num_params(core_only=True) == 8 * 2_235_648  # 4 blocks per branch, eq. 6
    assert abs(cnn.macs_per_image() / 700.92e9 - 1) < 0.02  # paper: 700.92 GMACs (Table 5)
    assert vit.num_params() == 30_775_335 and abs(vit.num_params() / 32.46e6 - 1) < 0.06
    # the paper's ViT - CNN difference is 8 block differences: same transitions and heads
    assert abs((vit.num_params() - cnn.num_params()) - (32.46e6 - 29.07e6)) < 0.01e6


# ----------------------------------------------------------------------------- Stage 2
def test_hinge_losses_on_known_logits():
    real, fake = torch.tensor([2.0, 0.5, -1.0]), torch.tensor([-2.0, 0.0, 1.0])
    torch.testing.assert_close(lv.hinge_d_loss(real, fake), torch.tensor(0.5 * (2.5 / 3 + 1.0)))
    torch.testing.assert_close(lv.hinge_g_loss(fake), torch.tensor(1.0 / 3))


def test_adaptive_weight_is_clipped_gradient_norm_ratio_after_activation():
    w = nn.Parameter(torch.ones(3))
    rec, adv = (2.0 * w).sum(), (-0.5 * w).sum()
    assert lv.adaptive_gan_weight(rec, adv, w, step=4999).item() == 0.0  # not yet active
    want = 0.5 * (2 * math.sqrt(3)) / (0.5 * math.sqrt(3) + 1e-4)
    torch.testing.assert_close(lv.adaptive_gan_weight(rec, adv, w, step=5000), torch.tensor(want))
    assert lv.adaptive_gan_weight(rec, 0 * w.sum(), w, step=5000).item() == 0.5 * 1e4  # clipped at 1e4
    m, x = tiny(perturb=True), images()  # the model's output layer takes part in both losses
    x_hat, loss = m.train()(x, 0)
    d = lv.PatchDiscriminator(width=8, depth=2)
    lam = lv.adaptive_gan_weight(loss, lv.hinge_g_loss(d(x_hat)), m.last_layer(), step=6000)
    assert 0 < lam.item() < 0.5 * 1e4 and not lam.requires_grad


def test_r1_is_the_squared_input_gradient_norm():
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(3, 2, 4, 4, generator=g), nn.Parameter(torch.randn(1, 2, 4, 4, generator=g))
    r1 = lv.r1_penalty(lambda t: (t * w).flatten(1).sum(1), x)  # grad_x = w for every image
    torch.testing.assert_close(r1, w.pow(2).sum())
    r1.backward()  # the graph is kept: d r1 / d w = 2 w
    torch.testing.assert_close(w.grad, 2 * w.detach())
    quad = lv.r1_penalty(lambda t: t.pow(2).flatten(1).sum(1), x)  # grad_x = 2 x
    torch.testing.assert_close(quad, 4 * x.pow(2).flatten(1).sum(1).mean())
    d = lambda t: (t * w).flatten(1).sum(1)
    assert lv.lazy_r1_loss(d, x, d_step=5) is None
    torch.testing.assert_close(lv.lazy_r1_loss(d, x, d_step=32), 0.5 * 10 * 16 * w.pow(2).sum())


def test_discriminator_steps_lower_the_hinge_loss_and_lazy_r1_the_penalty():
    fake = images(b=4, size=16, seed=2)  # white noise against smooth "real" images
    real = F.interpolate(images(b=4, size=4), size=16, mode="bilinear", align_corners=False)
    for r1_every in (None, 4):
        torch.manual_seed(0)
        d = lv.PatchDiscriminator(width=8, depth=2)
        assert d(real).shape == (4, 1, 4, 4)
        opt = torch.optim.Adam(d.parameters(), lr=1e-2)
        hinge, r1 = lambda: lv.hinge_d_loss(d(real), d(fake)).item(), lambda: lv.r1_penalty(d, real).item()
        before = hinge(), r1()
        for step in range(8):
            loss = lv.hinge_d_loss(d(lv.diff_augment(real)), d(lv.diff_augment(fake)))
            reg = lv.lazy_r1_loss(d, lv.diff_augment(real), step, every=r1_every) if r1_every else None
            opt.zero_grad()
            (loss if reg is None else loss + reg).backward()
            opt.step()
        if r1_every is None:
            assert hinge() < 0.9 * before[0]
        else:  # weight 10 x 4 at every 4th step: the penalty wins over the hinge term here
            assert r1() < 0.5 * before[1]


def test_diff_augment_translates_cuts_out_and_passes_gradients():
    torch.manual_seed(0)
    x = images(b=6, size=32) + 3.0  # no zeros in the input
    out = lv.diff_augment(x, policy=("translation",))
    for xi, oi in zip(x, out):  # each image: x shifted by some (dy, dx), |d| <= 4, zeros shifted in
        shifted = lambda dy, dx: F.pad(xi, (4, 4, 4, 4))[:, 4 - dy:36 - dy, 4 - dx:36 - dx]
        assert any(torch.equal(oi, shifted(dy, dx)) for dy in range(-4, 5) for dx in range(-4, 5))
    holes = lv.diff_augment(x, policy=("cutout",)) == 0
    assert (holes.sum((1, 2, 3)) == 3 * 6 * 6).all()  # one 6x6 square (0.2 x 32, rounded) per image
    x.requires_grad_(True)
    y = lv.diff_augment(x)
    y.sum().backward()
    assert y.shape == x.shape and torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
