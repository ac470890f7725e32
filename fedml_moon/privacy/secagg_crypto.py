"""The cryptographic primitives of SecAgg / SecAgg+ (Bonawitz et al., CCS 2017, Sec. 3 and Fig. 4;
Bell et al., CCS 2020): key agreement (X25519), authenticated encryption of the Shamir shares
(AES-GCM), the pseudorandom generator that expands a seed into a mask (AES-CTR) and the commitments
the server checks rebuilt secrets against.

Everything here is stateless; the protocol's rounds are in `fedml_moon.privacy.secagg`. Low-level
failures surface as `cryptography`'s own exceptions (`InvalidTag`, `ValueError`) and are turned into
`SecAggError`s naming the round and the parties by the callers.
"""

from __future__ import annotations

import hashlib
import os
import struct

import numpy as np
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

KEY_BYTES = 32  # X25519 public keys and SHA-256 commitments
SEED_BYTES = 16  # 126-bit seeds, written big-endian in 16 bytes
NONCE_BYTES = 12
_SHARE_LAYOUT = struct.Struct(">qqqQ")  # round, sender, receiver, x; then y(b_u) and y(s-seed)
SHARE_PLAINTEXT_BYTES = _SHARE_LAYOUT.size + 2 * SEED_BYTES
CIPHERTEXT_BYTES = NONCE_BYTES + SHARE_PLAINTEXT_BYTES + 16  # + the GCM tag
_ZERO_NONCE = bytes(16)


def _hkdf(material: bytes, info: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(material)


_PROBE = X25519PrivateKey.generate()


def usable_public(public: bytes) -> bool:
    """Whether 32 bytes are an X25519 public key that agreement can use: not a low-order point, whose
    shared secret would be all zeros (RFC 7748, Sec. 6.1), with which every exchange fails."""
    try:
        _PROBE.exchange(X25519PublicKey.from_public_bytes(public))
    except ValueError:
        return False
    return True


def seed_bytes(seed: int) -> bytes:
    """A seed < 2^127 as its 16 big-endian bytes."""
    return seed.to_bytes(SEED_BYTES, "big")


def public_bytes(key: X25519PrivateKey) -> bytes:
    """The 32 raw bytes of the public half of `key`."""
    return key.public_key().public_bytes_raw()


def s_key_from_seed(seed: int) -> X25519PrivateKey:
    """The masking key pair (s_u^SK, s_u^PK) derived from a 126-bit s-seed, so that the seed can be
    Shamir-shared and a rebuilt seed checked against the advertised s_u^PK (Bonawitz et al. 2017,
    Fig. 4, round 0 and round 4)."""
    return X25519PrivateKey.from_private_bytes(_hkdf(seed_bytes(seed), b"fedml_moon secagg s-key"))


def commit(seed: int) -> bytes:
    """b_commit: SHA-256 of the seed's 16 bytes."""
    return hashlib.sha256(seed_bytes(seed)).digest()


def _pair_info(label: bytes, round_idx: int, a: int, b: int) -> bytes:
    return label + struct.pack(">qqq", round_idx, min(a, b), max(a, b))


def share_key(own: X25519PrivateKey, peer_pk: bytes, round_idx: int, u: int, v: int) -> bytes:
    """KA.agree(c_u^SK, c_v^PK) through HKDF-SHA256: the AES-GCM key of the pair {u, v} this round
    (Bonawitz et al. 2017, Fig. 4, round 1). A malformed or low-order peer key raises ValueError."""
    shared = own.exchange(X25519PublicKey.from_public_bytes(peer_pk))
    return _hkdf(shared, _pair_info(b"fedml_moon secagg share key", round_idx, u, v))


def pair_seed(own: X25519PrivateKey, peer_pk: bytes, round_idx: int, u: int, v: int) -> bytes:
    """s_uv = KA.agree(s_u^SK, s_v^PK) through HKDF-SHA256, bound to the round and the pair
    (Bonawitz et al. 2017, Fig. 4, round 2): the same 32 bytes on both sides."""
    shared = own.exchange(X25519PublicKey.from_public_bytes(peer_pk))
    return _hkdf(shared, _pair_info(b"fedml_moon secagg pairwise mask", round_idx, u, v))


def self_seed(b: int, round_idx: int) -> bytes:
    """The PRG key of the self mask PRG(b_u) (Bonawitz et al. 2017, Fig. 4, round 2)."""
    return _hkdf(seed_bytes(b), b"fedml_moon secagg self mask" + struct.pack(">q", round_idx))


def _additional_data(round_idx: int, sender: int, receiver: int) -> bytes:
    return b"fedml_moon secagg share" + struct.pack(">qqq", round_idx, sender, receiver)


def seal_shares(key: bytes, round_idx: int, sender: int, receiver: int, share: tuple[int, int, int]) -> bytes:
    """nonce || AES-GCM(u || v || b-share || s-share), the associated data binding (round, sender,
    receiver) (Bonawitz et al. 2017, Fig. 4, round 1). `share` = (x, y of b_u, y of the s-seed)."""
    x, y_b, y_s = share
    plain = _SHARE_LAYOUT.pack(round_idx, sender, receiver, x) + seed_bytes(y_b) + seed_bytes(y_s)
    nonce = os.urandom(NONCE_BYTES)
    return nonce + AESGCM(key).encrypt(nonce, plain, _additional_data(round_idx, sender, receiver))


def open_shares(key: bytes, round_idx: int, sender: int, receiver: int, blob: bytes) -> tuple[int, int, int]:
    """(x, y of b_v, y of the s-seed) from `seal_shares`' output; `InvalidTag` for a ciphertext that was
    tampered with, sealed for another round or pair, and ValueError for one whose content disagrees."""
    nonce, body = blob[:NONCE_BYTES], blob[NONCE_BYTES:]
    plain = AESGCM(key).decrypt(nonce, body, _additional_data(round_idx, sender, receiver))
    if len(plain) != SHARE_PLAINTEXT_BYTES:
        raise ValueError(f"a share plaintext of {len(plain)} bytes, not {SHARE_PLAINTEXT_BYTES}")
    head, rest = plain[: _SHARE_LAYOUT.size], plain[_SHARE_LAYOUT.size :]
    r, u, v, x = _SHARE_LAYOUT.unpack(head)
    if (r, u, v) != (round_idx, sender, receiver):
        raise ValueError(f"the plaintext names round {r}, {u} -> {v}")
    return x, int.from_bytes(rest[:SEED_BYTES], "big"), int.from_bytes(rest[SEED_BYTES:], "big")


def word_dtype(k: int) -> type[np.unsignedinteger]:
    """The unsigned word the masks are added in: uint32 for k <= 32, uint64 otherwise (wrapping
    arithmetic mod 2^32 or 2^64, reduced mod 2^k at the end since 2^k divides either)."""
    return np.uint32 if k <= 32 else np.uint64


def prg(seed: bytes, length: int, k: int) -> np.ndarray:
    """PRG(seed): `length` uniform words of `word_dtype(k)` from AES-256-CTR keyed by the 32-byte seed
    (single-use key, zero nonce). Read-only view; callers reduce mod 2^k after summing."""
    dtype = np.dtype(word_dtype(k)).newbyteorder("<")
    encryptor = Cipher(algorithms.AES(seed), modes.CTR(_ZERO_NONCE)).encryptor()
    stream = encryptor.update(bytes(length * dtype.itemsize)) + encryptor.finalize()
    return np.frombuffer(stream, dtype=dtype)


def reduce(words: np.ndarray, k: int) -> np.ndarray:
    """Words mod 2^k as int64 in [0, 2^k)."""
    out = words.astype(np.int64)
    if k != 32:
        out &= (1 << k) - 1
    return out
