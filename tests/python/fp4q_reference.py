"""An independent numpy transcription of docs/NUMERICS.md, used as the tests' oracle.

Written from the spec alone (no fp4q code): NVFP4 RTN and stochastic rounding (sections 1, 2,
4), 16x16 blocks, the 128x4 scale swizzle (3), dequantization, the f64 matmul reference (9),
error feedback (5) and the 16-point Hadamard transform with default signs (6). All arithmetic is
numpy float32 (IEEE round-to-nearest-even per operation), in the order docs/NUMERICS.md writes it.
"""

import json
import struct

import numpy as np

F32 = np.float32
FLT_MAX = F32(3.4028235e38)
C6 = np.array([0x3E2AAAAB], dtype=np.uint32).view(np.float32)[0]
E2M1_VALUES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=np.float32)
DEFAULT_RHT_SIGN_MASK = 0xD7E8


def bf16_to_f32(bits_u16):
    return (bits_u16.astype(np.uint32) << 16).view(np.float32)


# ---------------------------------------------------------------- E4M3 and E2M1

def e4m3_encode(u):
    """E4M3 byte of non-negative f32 values: RNE, saturating at 448, subnormals kept."""
    u = np.asarray(u, dtype=np.float64)
    out = np.zeros(u.shape, dtype=np.uint8)
    for idx, v in np.ndenumerate(u):
        if not v > 0:
            continue
        if v >= 448:
            out[idx] = 0x7E
            continue
        e = int(np.floor(np.log2(v)))
        if e < -6:  # subnormal: multiples of 2^-9
            m = int(np.round(v / 2.0**-9))  # np.round is half-to-even
            out[idx] = m if m < 8 else 0x08  # m == 8 is the smallest normal 2^-6
            continue
        m = np.round(v / 2.0**(e - 3))  # 8..16
        if m == 16:
            e, m = e + 1, 8
        if e > 8 or (e == 8 and m > 14):
            out[idx] = 0x7E
            continue
        out[idx] = ((e + 7) << 3) | (int(m) - 8)
    return out


def e4m3_decode(b):
    b = np.asarray(b, dtype=np.uint8)
    exp = (b >> 3) & 0xF
    man = (b & 7).astype(np.float64)
    val = np.where(exp == 0, man * 2.0**-9, (1 + man / 8) * np.exp2(exp.astype(np.float64) - 7))
    val = np.where((b & 0x7F) == 0x7F, np.nan, val)
    return np.where(b & 0x80, -val, val).astype(np.float32)


def e2m1_rtn(y):
    """Section 1 codes of f32 values."""
    a = np.abs(y)
    code = np.select(
        [a <= 0.25, a < 0.75, a <= 1.25, a < 1.75, a <= 2.5, a < 3.5, a <= 5],
        [0, 1, 2, 3, 4, 5, 6], default=7).astype(np.uint8)
    code = np.where(np.isnan(y), 7, code | np.where(np.signbit(y), 8, 0)).astype(np.uint8)
    return code


def e2m1_value(code):
    v = E2M1_VALUES[code & 7]
    return np.where(code & 8, -v, v).astype(np.float32)


def pack(codes):
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)


def unpack(packed):
    out = np.empty((packed.shape[0], packed.shape[1] * 2), dtype=np.uint8)
    out[:, 0::2] = packed & 0xF
    out[:, 1::2] = packed >> 4
    return out


# ---------------------------------------------------------------- Philox and SR

_M0, _M1, _W0, _W1 = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85
_MASK32 = np.uint64(0xFFFFFFFF)


def philox4x32_10(c0, c1, c2, c3, k0, k1):
    """Philox4x32-10 (Salmon et al. 2011) on uint64 arrays holding 32-bit words."""
    c = [np.asarray(x, dtype=np.uint64) & _MASK32 for x in (c0, c1, c2, c3)]
    k0, k1 = np.uint64(k0) & _MASK32, np.uint64(k1) & _MASK32
    for rnd in range(10):
        p0 = np.uint64(_M0) * c[0]
        p1 = np.uint64(_M1) * c[2]
        hi0, lo0 = p0 >> np.uint64(32), p0 & _MASK32
        hi1, lo1 = p1 >> np.uint64(32), p1 & _MASK32
        c = [hi1 ^ c[1] ^ k0, lo1, hi0 ^ c[3] ^ k1, lo0]
        if rnd < 9:
            k0 = (k0 + np.uint64(_W0)) & _MASK32
            k1 = (k1 + np.uint64(_W1)) & _MASK32
    return c


def sr_bits(n, seed, step):
    """The 16 random bits of elements 0..n-1 (section 4)."""
    i = np.arange(n, dtype=np.uint64)
    j = i // np.uint64(8)
    words = philox4x32_10(j & _MASK32, j >> np.uint64(32), np.uint64(step) & _MASK32,
                          np.uint64(step) >> np.uint64(32), seed & 0xFFFFFFFF, seed >> 32)
    w = np.stack(words, axis=-1)[np.arange(n), ((i % np.uint64(8)) // np.uint64(2)).astype(int)]
    return np.where(i % np.uint64(2) == 0, w & np.uint64(0xFFFF), w >> np.uint64(16))


def e2m1_sr(y, r):
    a = np.abs(y).astype(np.float32)
    grid = E2M1_VALUES
    lo_idx = np.clip(np.searchsorted(grid, a, side="right") - 1, 0, 7)
    hi_idx = np.clip(lo_idx + 1, 0, 7)
    lo, hi = grid[lo_idx], grid[hi_idx]
    with np.errstate(invalid="ignore", divide="ignore"):
        f = ((a - lo) / np.where(hi > lo, hi - lo, F32(1))).astype(np.float32)
    up = r.astype(np.float32) < f * F32(65536)
    code = np.where(a >= 6, 7, np.where(up & (hi > lo), hi_idx, lo_idx)).astype(np.uint8)
    return np.where(np.isnan(y), 7, code | np.where(np.signbit(y), 8, 0)).astype(np.uint8)


# ---------------------------------------------------------------- NVFP4

def global_scales(x, amax=None):
    if amax is None:
        a = np.abs(x)
        amax = F32(np.max(a[~np.isnan(a)])) if np.any(~np.isnan(a)) else F32(0)
    amax = F32(amax)
    with np.errstate(divide="ignore", over="ignore"):
        s_enc = min(F32(F32(2688) / amax), FLT_MAX)
    if amax == 0 or s_enc == 0 or np.isinf(amax):
        s_enc = F32(1)
    return amax, F32(s_enc), F32(F32(1) / F32(s_enc))


def quantize_nvfp4(x, block="1x16", sr=None, amax=None):
    """x: f32 [rows, cols]. sr: None for RTN, else (seed, step). Returns dict with codes
    (unpacked, [rows, cols]), packed, scales (plain bytes [rows, cols/16]), amax, s_enc, s_dec."""
    x = np.asarray(x, dtype=np.float32)
    rows, cols = x.shape
    amax, s_enc, s_dec = global_scales(x, amax)
    a = np.abs(x)
    a = np.where(np.isnan(a), F32(0), a)
    bamax = a.reshape(rows, cols // 16, 16).max(axis=2)
    if block == "16x16":
        tiles = bamax.reshape(rows // 16, 16, cols // 16).max(axis=1)
        bamax = np.repeat(tiles, 16, axis=0)
    t = F32(s_enc * C6)
    u = (bamax * t).astype(np.float32)
    sf_bytes = e4m3_encode(u)
    sf = e4m3_decode(sf_bytes)
    with np.errstate(divide="ignore"):
        inv = np.minimum((F32(1) / (sf * s_dec).astype(np.float32)).astype(np.float32), FLT_MAX)
    y = (x * np.repeat(inv, 16, axis=1)).astype(np.float32)
    if sr is None:
        codes = e2m1_rtn(y)
    else:
        seed, step = sr
        codes = e2m1_sr(y.reshape(-1), sr_bits(rows * cols, seed, step)).reshape(rows, cols)
    return {"codes": codes, "packed": pack(codes), "scales": sf_bytes, "amax": amax,
            "s_enc": s_enc, "s_dec": s_dec}


def dequantize_nvfp4(packed, scales, s_enc):
    codes = unpack(np.asarray(packed, dtype=np.uint8))
    sf = np.repeat(e4m3_decode(scales), 16, axis=1)
    s_dec = F32(F32(1) / F32(s_enc))
    return ((e2m1_value(codes) * sf).astype(np.float32) * s_dec).astype(np.float32)


def matmul_reference(qa, qb):
    """Section 9: exact products summed in f64, times S_dec_a then S_dec_b, rounded to f32."""
    va = e2m1_value(qa["codes"]).astype(np.float64) * np.repeat(
        e4m3_decode(qa["scales"]).astype(np.float64), 16, axis=1)
    vb = e2m1_value(qb["codes"]).astype(np.float64) * np.repeat(
        e4m3_decode(qb["scales"]).astype(np.float64), 16, axis=1)
    acc = va @ vb.T
    return (acc * np.float64(qa["s_dec"]) * np.float64(qb["s_dec"])).astype(np.float32)


def swizzle_scales(plain):
    """Section 3: plain [rows, C] scale bytes -> the 128x4 tiled byte order (1-D)."""
    rows, c = plain.shape
    rp, cp = -(-rows // 128) * 128, -(-c // 4) * 4
    out = np.zeros(rp * cp, dtype=np.uint8)
    r, k = np.meshgrid(np.arange(rows), np.arange(c), indexing="ij")
    pos = ((r // 128) * (cp // 4) + k // 4) * 512 + (r % 32) * 16 + ((r // 32) % 4) * 4 + k % 4
    out[pos.reshape(-1)] = plain.reshape(-1)
    return out


def hadamard16_rows(x, sign_mask=DEFAULT_RHT_SIGN_MASK):
    """Section 6 applied along the last axis of f32 x (groups of 16)."""
    x = np.asarray(x, dtype=np.float32)
    s = np.array([-1 if (sign_mask >> i) & 1 else 1 for i in range(16)], dtype=np.float32)
    v = (x.reshape(-1, 16) * s).astype(np.float32)
    w = 1
    while w < 16:
        v = v.copy()
        for i in range(16):
            if i & w == 0:
                a, b = v[:, i].copy(), v[:, i + w].copy()
                v[:, i], v[:, i + w] = a + b, a - b
        w *= 2
    return (v * F32(0.25)).astype(np.float32).reshape(x.shape)


# ---------------------------------------------------------------- golden vectors

def read_safetensors(path):
    """(metadata dict, {name: numpy array}) of a safetensors file (F32, BF16 as f32, U8)."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    meta = header.pop("__metadata__", {})
    tensors = {}
    for name, info in header.items():
        lo, hi = info["data_offsets"]
        raw = data[lo:hi]
        if info["dtype"] == "F32":
            arr = np.frombuffer(raw, dtype="<f4").astype(np.float32)
        elif info["dtype"] == "BF16":
            arr = bf16_to_f32(np.frombuffer(raw, dtype="<u2"))
        elif info["dtype"] == "U8":
            arr = np.frombuffer(raw, dtype=np.uint8).copy()
        else:
            raise ValueError("unsupported dtype %s" % info["dtype"])
        tensors[name] = arr.reshape(info["shape"])
    return meta, tensors
