"""How fully does reViT use its expert bank? Effective ranks of the bank, the gates and the merged weights.

reViT (Bulat, Ouali, Tzimiropoulos, arXiv 2610.12448), section 5.2, Fig. 5 and 6, appendix D ("Effective-rank
protocol"): with P = d_ff d,
    W1_bank (E, P)   row e = vec(W1^e), the expert bank's first projections      (the directions available)
    G       (L, E)   G[t, e] = g_{t,e}, the gate at each of the L steps          (the mixtures selected)
    W1_traj (L, P)   = G W1_bank, row t = vec(merged W1 at step t)               (the weights the block uses)
    r_eff(M) = exp(-sum_i p_i log p_i),  p_i = sigma_i^2 / sum_j sigma_j^2      (Roy and Vetterli 2007)
and the same after removing the mean across depth, C = I_L - 11^T / L: G_c = C G, W1_traj,c = C W1_traj = G_c W1_bank
(rank at most E - 1, since every row of G sums to one). rank(W1_traj) <= min(rank G, rank W1_bank) <= E.
The paper's numbers at E=8: S/16 7.7 / 7.6 / 7.3 (bank / gate / merged), L/16 6.2 / 5.2 / 4.0. The ranks read
only the router and the expert weights: no images.
"""
import torch


def effective_rank(m):
    """Effective rank of a matrix m (R, C), any float dtype (computed in float64): exp of the Shannon entropy of
    its normalized squared singular values (reViT appendix D; Roy and Vetterli 2007). 1 when one direction holds
    everything, k for k equal nonzero singular values, between 1 and min(R, C) otherwise; 0.0 for a zero matrix
    (no direction at all, e.g. a depth-centered constant gate). Raises ValueError for a tensor that is not 2-D."""
    if m.dim() != 2:
        raise ValueError(f"effective_rank needs a matrix (R, C), got shape {tuple(m.shape)}")
    s2 = torch.linalg.svdvals(m.detach().to(torch.float64)) ** 2
    if s2.sum() == 0:
        return 0.0
    p = s2 / s2.sum()
    p = p[p > 0]  # 0 log 0 = 0
    return float(torch.exp(-(p * p.log()).sum()))


def depth_centered(m):
    """C m with C = I_L - 11^T / L: m (L, X) less its mean row, the component shared by every step removed."""
    return m - m.mean(0, keepdim=True)


def expert_ranks(model, depth=None):
    """The effective ranks of section 5.2 for a depth-routed reViT (revit.ReViT; any E, E=1 included) on the grid
    of `depth` steps (default: its trained depth): a dict of floats
        bank, gate, merged                       r_eff of W1_bank (E, P), G (L, E), W1_traj = G W1_bank (L, P)
        gate_centered, merged_centered           the same of G_c and G_c W1_bank (Fig. 6; at most E - 1)
    and the ints experts (E), depth (L), P. Raises ValueError for a model without reViT's depth-programmed merge
    (revit_moe.py's baselines: a gate that depends on the image, or layer-wise LoRA beside the bank)."""
    if not hasattr(model, "gates"):
        raise ValueError(f"a {type(model).__name__} has no expert bank programmed by depth; the ranks are reViT's "
                         "(--model revit)")
    if not getattr(model, "default", True):  # ReViTMoE.default: reViT itself
        raise ValueError(f"the ranks read reViT's depth-programmed merge (--routing depth, no --lora-rank); this "
                         f"model has --routing {getattr(model, 'routing', '-')}, --lora-rank {getattr(model, 'lora_rank', 0)}")
    w1 = model.blocks[0].mlp.fc1.weight.detach().to(torch.float64)  # (E, H, D)
    bank = w1.flatten(1)  # (E, P)
    g = model.gates(depth).to(torch.float64)  # (L, E), rows sum to 1
    g_c = depth_centered(g)
    return {"experts": bank.shape[0], "depth": g.shape[0], "P": bank.shape[1],
            "bank": effective_rank(bank), "gate": effective_rank(g), "merged": effective_rank(g @ bank),
            "gate_centered": effective_rank(g_c), "merged_centered": effective_rank(g_c @ bank)}
