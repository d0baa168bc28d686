"""Bytes of secure aggregation per client and round, by the protocols' messages (Bonawitz et al. CCS
2017, Section 4 and Table 1; Bell et al. CCS 2020 for SecAgg+, where each client talks to k neighbours
instead of all n - 1). With N neighbours and d values of b bits:

  upload   = 2 K                      (AdvertiseKeys: two public keys)
           + N (2 S + T)              (ShareKeys: one ciphertext to each neighbour holding a share of its
                                       mask key and of its self-mask seed, with the cipher's tag T)
           + ceil(d b / 8)            (MaskedInputCollection)
           + N S                      (Unmasking: a share per neighbour, of its self-mask seed if it sent
                                       or of its key if it dropped)
  download = N (2 K)  +  N (2 S + T)  (the neighbours' keys and the ciphertexts addressed to it)

K = 32 bytes (an X25519 public key), S = 32 bytes (a Shamir share of a 256-bit secret over a 256-bit
field), T = 16 bytes (an AEAD tag). A neighbour's share travels up whether it sent or dropped, so the
bytes do not depend on the dropouts (only which secret each share belongs to does)."""
from __future__ import annotations

KEY_BYTES = 32
SHARE_BYTES = 32
TAG_BYTES = 16


def upload_bytes(numel: int, bits: int, neighbours: int) -> int:
    return 2 * KEY_BYTES + neighbours * (2 * SHARE_BYTES + TAG_BYTES) + (numel * bits + 7) // 8 \
        + neighbours * SHARE_BYTES


def download_bytes(neighbours: int) -> int:
    return neighbours * 2 * KEY_BYTES + neighbours * (2 * SHARE_BYTES + TAG_BYTES)
