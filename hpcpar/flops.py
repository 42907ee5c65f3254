"""How much arithmetic a training step is (how fast this machine does it: gemm_speed.py).

Model FLOPs of one training step of a GPT (forward + backward, no recomputation; Narayanan et al.
2021, eq. 3, generalised to any feed-forward width F):

    per token and layer:  forward 2 (4 C^2 + 2 C F) for the GEMMs + 4 T C for attention (QK^T and PV)
    per token, head:      forward 2 C V
    training = 3 x forward (backward costs two forwards)

For F = 4C this is 72 B T L C^2 (1 + T/(6C) + V/(12 L C)), the formula in DESIGN.md section 7.
"""


def gpt_step_flops(cfg, tokens):
    C, F, L, V, T = cfg.d_model, cfg.d_ff, cfg.n_layer, cfg.vocab_size, cfg.seq_len
    per_token = L * (2 * (4 * C * C + 2 * C * F) + 4 * T * C) + 2 * C * V
    return 3 * per_token * tokens


def mlp_step_flops(cfg, samples):
    C, F = cfg.d_model, cfg.d_ff
    per_sample = 2 * (cfg.d_in * C + cfg.n_layer * 2 * C * F + C * cfg.d_out)
    return 3 * per_sample * samples
