"""Triton kernels of ``quest_core.fused`` (private: use ``quest_core.fused.fused_attention``).

Flash-attention-2 forward (online softmax; saves O and the base-2 log-sum-exp per query row) and backward (P
recomputed from the q̂, k̂ tiles; dK, dV per key tile, dQ per query tile), with the (q, k) transform of the QUEST
family applied inside the tiles: a raw q or k tile is loaded, its row norms are reduced in float32, and the tile
is scaled (x̂ = g ⊙ x / max(‖x‖, eps)) before it enters the dot product. No normalised copy of q or k is ever
written to memory; the backward kernels recompute the per-row inverse norms from the raw tiles they load anyway.

This file is executed twice by ``quest_core.fused`` (once with Triton's interpreter switched on, once off), so
that CPU tensors can run it under ``TRITON_INTERPRET=1`` while CUDA tensors in the same process get compiled
kernels: keep it free of module state.

Layout: every tensor is addressed through its strides; programs run over (row tile, batch × head). Rows and head
dims are padded to the tile (head dims to a power of two) and masked. Scores are kept in base 2: the kernels get
``qk_scale = scale · log2(e)`` and use ``exp2``.
"""

import triton
import triton.language as tl


@triton.jit
def _add(a, b):
    return a + b


@triton.jit
def _maximum(a, b):
    return tl.maximum(a, b)


@triton.jit
def _transform_rows(x, gain, eps, NORMALIZE: tl.constexpr, HAS_GAIN: tl.constexpr):
    """A (rows, D) float32 tile → (x̂ = g ⊙ u, u, inv) with u = x · inv, inv = 1 / max(‖x‖, eps) per row when
    NORMALIZE (else u = x and inv = 1)."""
    if NORMALIZE:
        inv = 1.0 / tl.maximum(tl.sqrt(tl.reduce(x * x, 1, _add)), eps)
    else:
        inv = tl.full((x.shape[0],), 1.0, tl.float32)
    u = x * inv[:, None]
    if HAS_GAIN:
        x_hat = u * gain[None, :]
    else:
        x_hat = u
    return x_hat, u, inv


@triton.jit
def _transform_rows_grad(dx_hat, u, inv, gain, eps, NORMALIZE: tl.constexpr, HAS_GAIN: tl.constexpr):
    """The chain rule of ``_transform_rows``: dx from dx̂ (float32 tiles). With h = g ⊙ dx̂,
    dx = (h − u (h·u)) · inv where ‖x‖ > eps and h · inv where the clamp is active (x̂ is linear in x there)."""
    if HAS_GAIN:
        h = dx_hat * gain[None, :]
    else:
        h = dx_hat
    if NORMALIZE:
        dot = tl.reduce(h * u, 1, _add)
        dot = tl.where(inv < 1.0 / eps, dot, 0.0)
        dx = (h - u * dot[:, None]) * inv[:, None]
    else:
        dx = h
    return dx


@triton.jit
def _load_gain(G, row, D, offs_d, d_valid, HAS_GAIN: tl.constexpr):
    """Row ``row`` of a contiguous (heads, D) float32 gain table, or ones without a gain."""
    if HAS_GAIN:
        gain = tl.load(G + row * D + offs_d, mask=d_valid, other=0.0)
    else:
        gain = tl.full(offs_d.shape, 1.0, tl.float32)
    return gain


@triton.jit
def _load_rows(X, b, h, offs, valid, sb, sh, sl, sd, D, BLOCK_D: tl.constexpr):
    """The (len(offs), BLOCK_D) tile of rows ``offs`` of head (b, h) of X, zero outside ``valid`` and D."""
    offs_d = tl.arange(0, BLOCK_D)
    return tl.load(X + b * sb + h * sh + offs[:, None] * sl + offs_d[None, :] * sd,
                   mask=valid[:, None] & (offs_d < D)[None, :], other=0.0)


@triton.jit
def _load_transformed(X, G, b, h, start, sb, sh, sl, sd, L, D, eps,
                      NORMALIZE: tl.constexpr, HAS_GAIN: tl.constexpr, BLOCK: tl.constexpr, BLOCK_D: tl.constexpr):
    """Rows start .. start + BLOCK of head (b, h) of a q or k tensor, transformed in float32:
    (offs, valid, x̂ in X's dtype, u, inv, gain); see ``_transform_rows``."""
    offs = start + tl.arange(0, BLOCK)
    valid = offs < L
    offs_d = tl.arange(0, BLOCK_D)
    x = _load_rows(X, b, h, offs, valid, sb, sh, sl, sd, D, BLOCK_D)
    gain = _load_gain(G, h, D, offs_d, offs_d < D, HAS_GAIN)
    x_hat, u, inv = _transform_rows(x.to(tl.float32), gain, eps, NORMALIZE, HAS_GAIN)
    return offs, valid, x_hat.to(X.dtype.element_ty), u, inv, gain


@triton.jit
def _keep_mask(offs_m, offs_n, m_valid, n_valid, KPM, b, smb, smn, CAUSAL: tl.constexpr, HAS_KPM: tl.constexpr):
    """(BLOCK_M, BLOCK_N) True where query row i may attend key j: inside both lengths, the key not padded
    (key-padding mask, True = attend) and, when causal, j ≤ i (top-left aligned, as SDPA)."""
    keep_n = n_valid
    if HAS_KPM:
        keep_n = keep_n & (tl.load(KPM + b * smb + offs_n * smn, mask=n_valid, other=0) != 0)
    keep = m_valid[:, None] & keep_n[None, :]
    if CAUSAL:
        keep = keep & (offs_n[None, :] <= offs_m[:, None])
    return keep


@triton.jit
def _probs_and_grad(q_hat, k_hat, v, do, lse, delta, keep, qk_scale, PRECISION: tl.constexpr):
    """Backward's recomputation on one (query tile, key tile): P = exp2(qk_scale · q̂ k̂ᵀ − LSE) where kept, and
    dS = P ⊙ (dO Vᵀ − delta) (the gradient of the unscaled logits, up to the factor ``scale``)."""
    s = tl.dot(q_hat, tl.trans(k_hat), input_precision=PRECISION) * qk_scale
    p = tl.where(keep, tl.exp2(s - lse[:, None]), 0.0)
    dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
    return p, p * (dp - delta[:, None])


@triton.jit
def _key_end(LK, pid_m, BLOCK_M: tl.constexpr, CAUSAL: tl.constexpr):
    """One past the last key a query tile may attend: LK, or the tile's last row + 1 when causal."""
    hi = LK
    if CAUSAL:
        hi = tl.minimum(LK, (pid_m + 1) * BLOCK_M)
    return hi


@triton.jit
def _key_tile(K, V, KG, KPM, b, hk, start_n, offs_m, m_valid, skb, skh, skn, skd, svb, svh, svn, svd, smb, smn,
              LK, D, DV, eps, NORM_K: tl.constexpr, K_GAIN: tl.constexpr, CAUSAL: tl.constexpr,
              HAS_KPM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    """The key tile at start_n seen from a query tile: (k̂ in K's dtype, raw v, keep mask)."""
    offs_n, n_valid, k_hat, _, _, _ = _load_transformed(K, KG, b, hk, start_n, skb, skh, skn, skd, LK, D, eps,
                                                        NORM_K, K_GAIN, BLOCK_N, BLOCK_D)
    v = _load_rows(V, b, hk, offs_n, n_valid, svb, svh, svn, svd, DV, BLOCK_DV)
    keep = _keep_mask(offs_m, offs_n, m_valid, n_valid, KPM, b, smb, smn, CAUSAL, HAS_KPM)
    return k_hat, v, keep


@triton.jit
def fwd_kernel(
    Q, K, V, QG, KG, KPM, O, LSE,
    sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sob, soh, som, sod, smb, smn,
    H, GROUP, LQ, LK, D, DV, qk_scale, eps,
    NORM_Q: tl.constexpr, NORM_K: tl.constexpr, Q_GAIN: tl.constexpr, K_GAIN: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_KPM: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """One query tile of one (batch, head): O = softmax(scale · q̂ k̂ᵀ + mask) V and its base-2 LSE (+inf for a row
    with no key to attend, whose output is 0)."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    hk = h // GROUP
    offs_m, m_valid, q_hat, _, _, _ = _load_transformed(Q, QG, b, h, pid_m * BLOCK_M, sqb, sqh, sqm, sqd, LQ, D, eps,
                                                        NORM_Q, Q_GAIN, BLOCK_M, BLOCK_D)
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.full((BLOCK_M,), 0.0, tl.float32)
    acc = tl.full((BLOCK_M, BLOCK_DV), 0.0, tl.float32)
    for start_n in range(0, _key_end(LK, pid_m, BLOCK_M, CAUSAL), BLOCK_N):
        k_hat, v, keep = _key_tile(K, V, KG, KPM, b, hk, start_n, offs_m, m_valid, skb, skh, skn, skd, svb, svh, svn,
                                   svd, smb, smn, LK, D, DV, eps, NORM_K, K_GAIN, CAUSAL, HAS_KPM, BLOCK_N, BLOCK_D,
                                   BLOCK_DV)
        s = tl.dot(q_hat, tl.trans(k_hat), input_precision=PRECISION) * qk_scale
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.reduce(s, 1, _maximum))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing to attend yet stays at 0
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.reduce(p, 1, _add)
        acc = acc * alpha[:, None] + tl.dot(p.to(V.dtype.element_ty), v, input_precision=PRECISION)
        m_i = m_new

    empty = l_i == 0.0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("inf"), m_i + tl.log2(tl.where(empty, 1.0, l_i)))
    offs_dv = tl.arange(0, BLOCK_DV)
    tl.store(O + b * sob + h * soh + offs_m[:, None] * som + offs_dv[None, :] * sod, out.to(O.dtype.element_ty),
             mask=m_valid[:, None] & (offs_dv < DV)[None, :])
    tl.store(LSE + pid_bh * LQ + offs_m, lse, mask=m_valid)


@triton.jit
def bwd_preprocess_kernel(O, DO, DELTA, sob, soh, som, sod, sdb, sdh, sdm, sdd, H, LQ, DV,
                          BLOCK_M: tl.constexpr, BLOCK_DV: tl.constexpr):
    """delta_i = Σ_d dO_id · O_id (float32), the softmax backward's row term."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_valid = offs_m < LQ
    o = _load_rows(O, b, h, offs_m, m_valid, sob, soh, som, sod, DV, BLOCK_DV)
    do = _load_rows(DO, b, h, offs_m, m_valid, sdb, sdh, sdm, sdd, DV, BLOCK_DV)
    delta = tl.reduce(o.to(tl.float32) * do.to(tl.float32), 1, _add)
    tl.store(DELTA + pid_bh * LQ + offs_m, delta, mask=m_valid)


@triton.jit
def bwd_dkdv_kernel(
    Q, K, V, QG, KG, KPM, DO, LSE, DELTA, DK, DV_, DKG,
    sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sdb, sdh, sdm, sdd, smb, smn,
    H, HKV, GROUP, LQ, LK, D, DV, qk_scale, scale, eps, N_TILES,
    NORM_Q: tl.constexpr, NORM_K: tl.constexpr, Q_GAIN: tl.constexpr, K_GAIN: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_KPM: tl.constexpr, K_GAIN_GRAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """One key tile of one (batch, key/value head): dV = Σ Pᵀ dO and dk̂ = scale · Σ dSᵀ q̂ over every query head
    of its group and every query tile, then dK through the key transform's chain rule. DK and DV_ are contiguous
    (B, HKV, LK, ·); with K_GAIN_GRAD, Σ_rows dk̂ ⊙ u goes to DKG[(b·HKV + hk)·N_TILES + tile, :]."""
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // HKV
    hk = pid_bh % HKV
    offs_n, n_valid, k_hat, k_unit, k_inv, k_gain = _load_transformed(
        K, KG, b, hk, pid_n * BLOCK_N, skb, skh, skn, skd, LK, D, eps, NORM_K, K_GAIN, BLOCK_N, BLOCK_D)
    v = _load_rows(V, b, hk, offs_n, n_valid, svb, svh, svn, svd, DV, BLOCK_DV)

    dk_hat = tl.full((BLOCK_N, BLOCK_D), 0.0, tl.float32)
    dv = tl.full((BLOCK_N, BLOCK_DV), 0.0, tl.float32)
    lo = 0
    if CAUSAL:
        lo = (pid_n * BLOCK_N // BLOCK_M) * BLOCK_M  # query rows above the tile's first key see none of it
    for g in range(0, GROUP):
        h = hk * GROUP + g
        for start_m in range(lo, LQ, BLOCK_M):
            offs_m, m_valid, q_hat, _, _, _ = _load_transformed(Q, QG, b, h, start_m, sqb, sqh, sqm, sqd, LQ, D, eps,
                                                                NORM_Q, Q_GAIN, BLOCK_M, BLOCK_D)
            do = _load_rows(DO, b, h, offs_m, m_valid, sdb, sdh, sdm, sdd, DV, BLOCK_DV)
            lse = tl.load(LSE + (b * H + h) * LQ + offs_m, mask=m_valid, other=float("inf"))
            delta = tl.load(DELTA + (b * H + h) * LQ + offs_m, mask=m_valid, other=0.0)
            keep = _keep_mask(offs_m, offs_n, m_valid, n_valid, KPM, b, smb, smn, CAUSAL, HAS_KPM)
            p, ds = _probs_and_grad(q_hat, k_hat, v, do, lse, delta, keep, qk_scale, PRECISION)
            dv += tl.dot(tl.trans(p.to(DO.dtype.element_ty)), do, input_precision=PRECISION)
            dk_hat += tl.dot(tl.trans(ds.to(Q.dtype.element_ty)), q_hat, input_precision=PRECISION)
    dk_hat = dk_hat * scale

    dk = _transform_rows_grad(dk_hat, k_unit, k_inv, k_gain, eps, NORM_K, K_GAIN)
    row = pid_bh * LK + offs_n
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    tl.store(DK + row[:, None] * D + offs_d[None, :], dk.to(DK.dtype.element_ty),
             mask=n_valid[:, None] & (offs_d < D)[None, :])
    tl.store(DV_ + row[:, None] * DV + offs_dv[None, :], dv.to(DV_.dtype.element_ty),
             mask=n_valid[:, None] & (offs_dv < DV)[None, :])
    if K_GAIN_GRAD:
        tl.store(DKG + (pid_bh * N_TILES + pid_n) * BLOCK_D + offs_d, tl.reduce(dk_hat * k_unit, 0, _add))


@triton.jit
def bwd_dq_kernel(
    Q, K, V, QG, KG, KPM, DO, LSE, DELTA, DQ, DQG,
    sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sdb, sdh, sdm, sdd, smb, smn,
    H, GROUP, LQ, LK, D, DV, qk_scale, scale, eps, M_TILES,
    NORM_Q: tl.constexpr, NORM_K: tl.constexpr, Q_GAIN: tl.constexpr, K_GAIN: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_KPM: tl.constexpr, Q_GAIN_GRAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """One query tile of one (batch, head): dq̂ = scale · Σ dS k̂ over the key tiles, then dQ through the query
    transform's chain rule. DQ is contiguous (B, H, LQ, D); with Q_GAIN_GRAD, Σ_rows dq̂ ⊙ u goes to
    DQG[(b·H + h)·M_TILES + tile, :]."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    hk = h // GROUP
    offs_m, m_valid, q_hat, q_unit, q_inv, q_gain = _load_transformed(
        Q, QG, b, h, pid_m * BLOCK_M, sqb, sqh, sqm, sqd, LQ, D, eps, NORM_Q, Q_GAIN, BLOCK_M, BLOCK_D)
    do = _load_rows(DO, b, h, offs_m, m_valid, sdb, sdh, sdm, sdd, DV, BLOCK_DV)
    lse = tl.load(LSE + pid_bh * LQ + offs_m, mask=m_valid, other=float("inf"))
    delta = tl.load(DELTA + pid_bh * LQ + offs_m, mask=m_valid, other=0.0)

    dq_hat = tl.full((BLOCK_M, BLOCK_D), 0.0, tl.float32)
    for start_n in range(0, _key_end(LK, pid_m, BLOCK_M, CAUSAL), BLOCK_N):
        k_hat, v, keep = _key_tile(K, V, KG, KPM, b, hk, start_n, offs_m, m_valid, skb, skh, skn, skd, svb, svh, svn,
                                   svd, smb, smn, LK, D, DV, eps, NORM_K, K_GAIN, CAUSAL, HAS_KPM, BLOCK_N, BLOCK_D,
                                   BLOCK_DV)
        _, ds = _probs_and_grad(q_hat, k_hat, v, do, lse, delta, keep, qk_scale, PRECISION)
        dq_hat += tl.dot(ds.to(K.dtype.element_ty), k_hat, input_precision=PRECISION)
    dq_hat = dq_hat * scale

    dq = _transform_rows_grad(dq_hat, q_unit, q_inv, q_gain, eps, NORM_Q, Q_GAIN)
    offs_d = tl.arange(0, BLOCK_D)
    row = pid_bh * LQ + offs_m
    tl.store(DQ + row[:, None] * D + offs_d[None, :], dq.to(DQ.dtype.element_ty),
             mask=m_valid[:, None] & (offs_d < D)[None, :])
    if Q_GAIN_GRAD:
        tl.store(DQG + (pid_bh * M_TILES + pid_m) * BLOCK_D + offs_d, tl.reduce(dq_hat * q_unit, 0, _add))
