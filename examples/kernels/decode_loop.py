"""Greedy decoding of a Llama-architecture model (SmolLM2-135M's shape, random weights) written
only with @strata.kernel kernels: embedding, RMSNorm, matrix-vector products (a warp per output,
the residual added in the same kernel), rotary embedding computed in the kernel and stored into
the KV cache, decode attention over the cache, SiLU-gated MLP and the argmax that writes the next
token id for the next step's embedding. The token ids never leave the kernels until the end.
Checked against the same model written with torch ops (float64).

    python examples/kernels/decode_loop.py      # the full 30 layers on the CPU, with timings
"""
import math
import time

import torch

import strata as st

TOL = 0.0                   # run() returns token ids: they must match exactly

SMOLLM2_135M = dict(hidden=576, heads=9, kv_heads=3, inter=1536, vocab=49152, layers=30,
                    eps=1e-5, theta=100000.0)
TINY = dict(hidden=64, heads=4, kv_heads=2, inter=96, vocab=97, layers=2, eps=1e-5, theta=10000.0)


@st.kernel
def embed(ids, table, out, step: int, H: st.constexpr):
    i = st.program_id(0) * 64 + st.thread_id(0)
    if i < H:
        out[i] = table[ids[step], i]


@st.kernel
def rmsnorm(x, w, out, eps: float, H: st.constexpr):
    lane = st.thread_id(0)
    ss = 0.0
    for c in range(lane, H, 32):
        ss += x[c] * x[c]
    scale = st.rsqrt(st.warp_sum(ss) / H + eps)
    for c in range(lane, H, 32):
        out[c] = x[c] * scale * w[c]


@st.kernel
def matvec(w, x, res, out, K: st.constexpr, RESIDUAL: st.constexpr):
    n = st.program_id(0)
    lane = st.thread_id(0)
    acc = 0.0
    for k in range(lane, K, 32):
        acc += w[n, k] * x[k]
    acc = st.warp_sum(acc)
    if lane == 0:
        out[n] = acc + res[n] if RESIDUAL else acc


@st.kernel
def rope_store(q, k, v, q_out, k_cache, v_cache, pos: int, theta: float, HEADS: st.constexpr,
               HALF: st.constexpr):
    h = st.program_id(0)
    i = st.thread_id(0)
    angle = pos * st.exp(-(2.0 * i / (2 * HALF)) * st.log(theta))
    c = st.cos(angle)
    s = st.sin(angle)
    if h < HEADS:
        a = q[h * 2 * HALF + i]
        b = q[h * 2 * HALF + i + HALF]
        q_out[h, i] = a * c - b * s
        q_out[h, i + HALF] = b * c + a * s
    else:
        g = h - HEADS
        a = k[g * 2 * HALF + i]
        b = k[g * 2 * HALF + i + HALF]
        k_cache[g, pos, i] = a * c - b * s
        k_cache[g, pos, i + HALF] = b * c + a * s
        v_cache[g, pos, i] = v[g * 2 * HALF + i]
        v_cache[g, pos, i + HALF] = v[g * 2 * HALF + i + HALF]


@st.kernel
def attention(q, k_cache, v_cache, out, pos: int, scale: float, D: st.constexpr,
              GROUP: st.constexpr, MAX_SEQ: st.constexpr, THREADS: st.constexpr):
    h = st.program_id(0)
    t = st.thread_id(0)
    kv = h // GROUP
    scores = st.shared((MAX_SEQ,), st.float32)
    red = st.shared((THREADS,), st.float32)
    best = -float("inf")
    for j in range(t, pos + 1, THREADS):
        s = 0.0
        for d in range(D):
            s += q[h, d] * k_cache[kv, j, d]
        scores[j] = s * scale
        best = max(best, s * scale)
    red[t] = best
    st.barrier()
    half = THREADS // 2
    while half > 0:
        if t < half:
            red[t] = max(red[t], red[t + half])
        st.barrier()
        half //= 2
    m = red[0]
    st.barrier()
    total = 0.0
    for j in range(t, pos + 1, THREADS):
        p = st.exp(scores[j] - m)
        scores[j] = p
        total += p
    red[t] = total
    st.barrier()
    half = THREADS // 2
    while half > 0:
        if t < half:
            red[t] = red[t] + red[t + half]
        st.barrier()
        half //= 2
    total = red[0]
    for d in range(t, D, THREADS):
        acc = 0.0
        for j in range(pos + 1):
            acc += scores[j] * v_cache[kv, j, d]
        out[h * D + d] = acc / total


@st.kernel
def silu_mul(gate, up, out, N: st.constexpr):
    i = st.program_id(0) * 64 + st.thread_id(0)
    if i < N:
        g = gate[i]
        out[i] = g / (1.0 + st.exp(-g)) * up[i]


@st.kernel
def argmax_next(logits, ids, step: int, N: st.constexpr, THREADS: st.constexpr):
    t = st.thread_id(0)
    best_v = st.shared((THREADS,), st.float32)
    best_i = st.shared((THREADS,), st.int32)
    bv = -float("inf")
    bi = 0
    for n in range(t, N, THREADS):
        if logits[n] > bv:
            bv = logits[n]
            bi = n
    best_v[t] = bv
    best_i[t] = bi
    st.barrier()
    half = THREADS // 2
    while half > 0:
        if t < half:
            ov = best_v[t + half]
            oi = best_i[t + half]
            if ov > best_v[t] or (ov == best_v[t] and oi < best_i[t]):
                best_v[t] = ov
                best_i[t] = oi
        st.barrier()
        half //= 2
    if t == 0:
        ids[step + 1] = best_i[0]


def random_weights(cfg: dict, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    h, kvd = cfg["hidden"], cfg["kv_heads"] * cfg["hidden"] // cfg["heads"]

    def w(*shape):
        return torch.randn(*shape, generator=g) * 0.02
    layers = [dict(attn_norm=1.0 + w(h), q=w(h, h), k=w(kvd, h), v=w(kvd, h), o=w(h, h),
                   mlp_norm=1.0 + w(h), gate=w(cfg["inter"], h), up=w(cfg["inter"], h),
                   down=w(h, cfg["inter"])) for _ in range(cfg["layers"])]
    return dict(embed=w(cfg["vocab"], h) * 50, layers=layers, norm=1.0 + w(h),
                lm_head=w(cfg["vocab"], h))


def generate(cfg: dict, weights: dict, prompt: list[int], new_tokens: int, device: str) -> list[int]:
    """Greedy decoding with the kernels above, one token per step (the prompt too)."""
    h, heads, kvh = cfg["hidden"], cfg["heads"], cfg["kv_heads"]
    d = h // heads
    total = len(prompt) + new_tokens
    ids = torch.zeros(total + 1, dtype=torch.int32)
    ids[:len(prompt)] = torch.tensor(prompt, dtype=torch.int32)
    x, x2, normed = torch.zeros(h), torch.zeros(h), torch.zeros(h)
    q, k, v = torch.zeros(h), torch.zeros(kvh * d), torch.zeros(kvh * d)
    q_rot, attn = torch.zeros(heads, d), torch.zeros(h)
    gate, up, act = (torch.zeros(cfg["inter"]) for _ in range(3))
    logits = torch.zeros(cfg["vocab"])
    caches = [(torch.zeros(kvh, total, d), torch.zeros(kvh, total, d)) for _ in weights["layers"]]
    threads = 64

    def mv(w, inp, out, res=None):
        matvec[w.shape[0], 32](w, inp, res if res is not None else out, out, K=w.shape[1],
                               RESIDUAL=res is not None, device=device)
    for step in range(total - 1):
        embed[(h + 63) // 64, 64](ids, weights["embed"], x, step, H=h, device=device)
        for lw, (kc, vc) in zip(weights["layers"], caches):
            rmsnorm[1, 32](x, lw["attn_norm"], normed, cfg["eps"], H=h, device=device)
            mv(lw["q"], normed, q)
            mv(lw["k"], normed, k)
            mv(lw["v"], normed, v)
            rope_store[heads + kvh, d // 2](q, k, v, q_rot, kc, vc, step, cfg["theta"],
                                            HEADS=heads, HALF=d // 2, device=device)
            attention[heads, threads](q_rot, kc, vc, attn, step, 1.0 / math.sqrt(d), D=d,
                                      GROUP=heads // kvh, MAX_SEQ=total, THREADS=threads,
                                      device=device)
            mv(lw["o"], attn, x2, res=x)
            rmsnorm[1, 32](x2, lw["mlp_norm"], normed, cfg["eps"], H=h, device=device)
            mv(lw["gate"], normed, gate)
            mv(lw["up"], normed, up)
            silu_mul[(cfg["inter"] + 63) // 64, 64](gate, up, act, N=cfg["inter"], device=device)
            mv(lw["down"], act, x, res=x2)
        rmsnorm[1, 32](x, weights["norm"], normed, cfg["eps"], H=h, device=device)
        mv(weights["lm_head"], normed, logits)
        if step + 1 >= len(prompt):
            argmax_next[1, 256](logits, ids, step, N=cfg["vocab"], THREADS=256, device=device)
    return ids[:total].tolist()


def reference(cfg: dict, weights: dict, prompt: list[int], new_tokens: int) -> list[int]:
    """The same model with torch ops, in float64, recomputing the whole sequence each step."""
    h, heads, kvh = cfg["hidden"], cfg["heads"], cfg["kv_heads"]
    d = h // heads
    W = {k: v.double() for k, v in weights.items() if k != "layers"}
    layers = [{k: v.double() for k, v in lw.items()} for lw in weights["layers"]]
    ids = list(prompt)

    def norm(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg["eps"]) * w

    def rope(x, n):                              # x: [heads, n, d]
        inv = torch.exp(-(2.0 * torch.arange(d // 2, dtype=torch.float64) / d) * math.log(cfg["theta"]))
        ang = torch.arange(n, dtype=torch.float64)[:, None] * inv
        c, s = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
        return x * c + torch.cat([-x[..., d // 2:], x[..., :d // 2]], -1) * s
    for _ in range(new_tokens):
        n = len(ids)
        x = W["embed"][torch.tensor(ids)]
        for lw in layers:
            a = norm(x, lw["attn_norm"])
            q = rope((a @ lw["q"].T).view(n, heads, d).transpose(0, 1), n)
            k = rope((a @ lw["k"].T).view(n, kvh, d).transpose(0, 1), n)
            v = (a @ lw["v"].T).view(n, kvh, d).transpose(0, 1)
            k, v = (t.repeat_interleave(heads // kvh, 0) for t in (k, v))
            o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + o.transpose(0, 1).reshape(n, h) @ lw["o"].T
            m = norm(x, lw["mlp_norm"])
            x = x + (torch.nn.functional.silu(m @ lw["gate"].T) * (m @ lw["up"].T)) @ lw["down"].T
        ids.append(int((norm(x[-1], W["norm"]) @ W["lm_head"].T).argmax()))
    return ids


def run(device: str, cfg: dict | None = None, new_tokens: int = 3):
    cfg = cfg or TINY
    weights = random_weights(cfg)
    prompt = [1, 5, 7]
    got = generate(cfg, weights, prompt, new_tokens, device)
    return torch.tensor(got), torch.tensor(reference(cfg, weights, prompt, new_tokens))


if __name__ == "__main__":
    weights = random_weights(SMOLLM2_135M)
    prompt, new = [1, 5, 7], 8
    generate(SMOLLM2_135M, weights, prompt, 1, "cpu")            # compile every kernel once
    start = time.perf_counter()
    ids = generate(SMOLLM2_135M, weights, prompt, new, "cpu")
    took = time.perf_counter() - start
    ref = reference(SMOLLM2_135M, weights, prompt, new)
    steps = len(prompt) + new - 1
    print(f"strata kernels (cpu): {ids}  ({steps / took:.1f} steps/s, {1e3 * took / steps:.0f} ms "
          f"per step of {SMOLLM2_135M['layers']} layers)")
    print(f"torch reference:      {ref}  {'(same)' if ids == ref else '(DIFFERENT)'}")
