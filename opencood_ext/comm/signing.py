"""Message signatures: per-sender Ed25519 keys with replay refusal, or the alliance's shared HMAC key.

Three versions of the wire format (:mod:`.wire`) differ only in what follows the payload::

    version  after the payload                                   bytes  proves
          1  nothing (unsigned)                                       0  nothing
          2  HMAC-SHA256 under the alliance's shared key             32  the sender holds the alliance key
          3  sequence, generation time, Ed25519 signature            80  which member sent it, and that it is new

Version 3's trailer (little-endian), signed together with the header (which holds the sender id)
and the payload, so a member's key cannot sign as another member::

    offset size field
         0    8 sequence         uint64: the sender's count of signed messages, strictly increasing
         8    8 generation_time  float64: seconds of the sender's clock when the message was made
        16   64 signature        Ed25519 (RFC 8032) of every byte before it: header, payload, 0..16

Keys (the ``cryptography`` package's Ed25519; nothing here is hand-written cryptography):

* a private key is a PEM file, PKCS#8, unencrypted: ``openssl genpkey -algorithm ed25519 -out 7.pem``
  or ``python -m opencood_ext.comm.signing keygen DIR 1 2 3``. :class:`Signer` holds one; a
  process that plays several senders (a simulation, the live demo) loads a folder of them named
  ``<sender id>.pem`` (:class:`SenderKeys`). Keys are referenced by path only: no repr, log, config
  dump or result holds a private key's bytes or its file's contents.
* the alliance registry (:class:`KeyRegistry`) is a YAML (or JSON) file the user writes::

      members:            # sender id -> its Ed25519 public key: 64 hex digits (the 32 raw bytes)
        1: 3b6a27bcceb6a42d62a3a8d02a6f0d73653215771de243a63ac048a18b59da29
        2: 8a88e3dd7409f195fd52db2d3cba5d72ca6709bf1d94121bf3748801b40f6f5c
      revoked:            # public keys refused from now on (a leaked key), same encoding
        - d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a

  A receiver accepts a version 3 packet only when its sender id is a member, the member's key is
  not revoked and the signature verifies under it. Removing a member or revoking its key takes
  effect when the registry is loaded again (a new run, a restarted demo).

Replays (:class:`ReplayWindow`): per receiver and sender, the highest sequence accepted and which
of the ``size`` sequences below it were; a sequence already accepted, or ``size`` or more below the
highest, is refused. A receiver that restarts forgets its windows (then only ``max_age`` bounds what
it accepts); a sender that restarts must go on above its last sequence (``first_sequence``).
"""
from __future__ import annotations

import argparse
import hashlib
import hmac
import math
import os
import struct
import sys
from pathlib import Path
from typing import Dict, Iterable, Mapping, Optional, Set, Union

import yaml
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

SIGNATURE_SIZE = hashlib.sha256().digest_size  # version 2: the HMAC-SHA256 tag
STAMP = struct.Struct("<Qd")  # version 3: sequence, generation time
ED25519_SIZE = 64
TRAILER_SIZE = STAMP.size + ED25519_SIZE  # version 3: 80 bytes
VERSION, VERSION_SIGNED, VERSION_SENDER = 1, 2, 3  # unsigned, alliance HMAC, sender's Ed25519
TRAILERS = {VERSION: 0, VERSION_SIGNED: SIGNATURE_SIZE, VERSION_SENDER: TRAILER_SIZE}  # bytes after the payload
SIGNED_BYTES = {False: 0, True: SIGNATURE_SIZE, "hmac": SIGNATURE_SIZE, "ed25519": TRAILER_SIZE}  # by signing mode
PUBLIC_KEY_HEX = 64
MAX_SEQUENCE = (1 << 64) - 1


def signature(signed_bytes: bytes, key: bytes) -> bytes:
    """The SIGNATURE_SIZE-byte HMAC-SHA256 of ``signed_bytes`` (header + payload) under ``key``."""
    return hmac.new(key, signed_bytes, hashlib.sha256).digest()


def public_hex(key: Ed25519PublicKey) -> str:
    """The 64-hex-digit form of a public key used in the registry file."""
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()


class Signer:
    """One sender's signing identity: its ``sender_id``, its Ed25519 ``private_key`` and the next
    sequence number it stamps (starting at ``first_sequence``). Its repr names the id and the public
    key only; it cannot be pickled (the private key stays in this process)."""

    def __init__(self, sender_id: int, private_key: Ed25519PrivateKey, first_sequence: int = 0):
        if not isinstance(private_key, Ed25519PrivateKey):
            raise TypeError(f"Signer: private_key must be an Ed25519PrivateKey, got {type(private_key).__name__}")
        if not 0 <= int(first_sequence) <= MAX_SEQUENCE:
            raise ValueError(f"Signer: first_sequence must lie in [0, 2^64), got {first_sequence}")
        self.sender_id = int(sender_id)
        self._key = private_key
        self.next_sequence = int(first_sequence)

    @classmethod
    def generate(cls, sender_id: int) -> "Signer":
        """A Signer with a fresh random key (the operating system's generator)."""
        return cls(sender_id, Ed25519PrivateKey.generate())

    @classmethod
    def load(cls, sender_id: int, path: Union[str, Path]) -> "Signer":
        """The Signer whose key is the PEM file ``path``; ValueError (one line naming the file, never
        its contents) when it cannot be read or is not an unencrypted Ed25519 private key."""
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise ValueError(f"{path}: cannot read the private key of sender {sender_id} ({exc.strerror})") from None
        try:
            key = serialization.load_pem_private_key(data, password=None)
        except (ValueError, TypeError):
            key = None
        if not isinstance(key, Ed25519PrivateKey):
            raise ValueError(f"{path}: not an unencrypted PEM Ed25519 private key (sender {sender_id})")
        return cls(sender_id, key)

    def write(self, path: Union[str, Path]) -> None:
        """Write the private key to ``path`` as PEM (PKCS#8, unencrypted), readable by the owner only."""
        pem = self._key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption())
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(pem)

    @property
    def public_key(self) -> Ed25519PublicKey:
        return self._key.public_key()

    def seal(self, signed: bytes, generation_time: float) -> bytes:
        """The version-3 trailer of the packet whose header and payload are ``signed``: this
        sender's next sequence number, ``generation_time`` (seconds) and the signature."""
        if not math.isfinite(generation_time):
            raise ValueError(f"generation time must be finite, got {generation_time}")
        if self.next_sequence > MAX_SEQUENCE:
            raise ValueError(f"sender {self.sender_id} has used every sequence number")
        stamp = STAMP.pack(self.next_sequence, float(generation_time))
        self.next_sequence += 1
        return stamp + self._key.sign(bytes(signed) + stamp)

    def reseal(self, signed: bytes, trailer: bytes) -> bytes:
        """``trailer``'s sequence and generation time signed again over a changed ``signed`` (the
        channel's pose noise, the sender's own localisation error); uses no new sequence number."""
        stamp = bytes(trailer[:STAMP.size])
        return stamp + self._key.sign(bytes(signed) + stamp)

    def __repr__(self) -> str:
        return f"Signer(sender_id={self.sender_id}, public_key={public_hex(self.public_key)[:16]}...)"

    def __reduce__(self):
        raise TypeError("a Signer holds a private key and is not pickled")


class SenderKeys:
    """The private keys of the senders this process plays: sender id -> :class:`Signer`."""

    def __init__(self, signers: Iterable[Signer], source: str = "memory"):
        self._by_id: Dict[int, Signer] = {s.sender_id: s for s in signers}
        self.source = source

    @classmethod
    def load(cls, folder: Union[str, Path]) -> "SenderKeys":
        """Every ``<sender id>.pem`` in ``folder`` (other files are ignored); ValueError naming the
        folder, or the file, when it is missing or a key cannot be read."""
        folder = Path(folder)
        if not folder.is_dir():
            raise ValueError(f"{folder}: not a folder of private keys (<sender id>.pem)")
        signers = [Signer.load(int(p.stem), p) for p in sorted(folder.glob("*.pem"))
                   if p.stem.lstrip("-").isdigit()]
        if not signers:
            raise ValueError(f"{folder}: holds no private key named <sender id>.pem")
        return cls(signers, str(folder))

    def get(self, sender_id: int) -> Optional[Signer]:
        return self._by_id.get(int(sender_id))

    def ids(self):
        return sorted(self._by_id)

    def __repr__(self) -> str:
        return f"SenderKeys({self.source}: senders {self.ids()})"

    def __reduce__(self):
        raise TypeError("SenderKeys hold private keys and are not pickled")


def _public_key(text, where: str) -> Ed25519PublicKey:
    if not (isinstance(text, str) and len(text) == PUBLIC_KEY_HEX):
        raise ValueError(f"{where}: an Ed25519 public key must be {PUBLIC_KEY_HEX} hex digits, got {text!r:.80}")
    try:
        return Ed25519PublicKey.from_public_bytes(bytes.fromhex(text))
    except ValueError:
        raise ValueError(f"{where}: not {PUBLIC_KEY_HEX} hex digits of an Ed25519 public key") from None


class KeyRegistry:
    """The alliance's public keys: ``members`` (sender id -> Ed25519PublicKey) and ``revoked``
    (public keys, as 64 hex digits, refused whoever presents them). File format: module docstring."""

    def __init__(self, members: Mapping[int, Ed25519PublicKey], revoked: Iterable[str] = (), source: str = "memory"):
        self.members: Dict[int, Ed25519PublicKey] = {int(k): v for k, v in members.items()}
        self.revoked: Set[str] = {r.lower() for r in revoked}
        self.source = source

    @classmethod
    def load(cls, path: Union[str, Path]) -> "KeyRegistry":
        """Read a registry file; ValueError, one line naming the file and the entry, when it is wrong."""
        try:
            doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise ValueError(f"{path}: cannot read the alliance key registry ({exc.strerror})") from None
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            raise ValueError(f"{path}: not a YAML / JSON key registry ({type(exc).__name__})") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("members"), dict) or set(doc) - {"members", "revoked"}:
            raise ValueError(f"{path}: a key registry is a mapping with 'members' (sender id -> public key) "
                             f"and an optional 'revoked' list, got {type(doc).__name__} "
                             f"{sorted(doc) if isinstance(doc, dict) else ''}")
        members = {}
        for sid, text in doc["members"].items():
            if isinstance(sid, bool) or not isinstance(sid, int) and not (isinstance(sid, str) and sid.lstrip("-").isdigit()):
                raise ValueError(f"{path}: members: sender ids must be integers, got {sid!r}")
            members[int(sid)] = _public_key(text, f"{path}: members.{sid}")
        revoked = doc.get("revoked") or []
        if not isinstance(revoked, list):
            raise ValueError(f"{path}: revoked: must be a list of public keys, got {type(revoked).__name__}")
        for i, text in enumerate(revoked):
            _public_key(text, f"{path}: revoked[{i}]")
        return cls(members, revoked, str(path))

    def write(self, path: Union[str, Path]) -> None:
        """Write this registry as YAML (the format :meth:`load` reads)."""
        doc = {"members": {sid: public_hex(k) for sid, k in sorted(self.members.items())},
               "revoked": sorted(self.revoked)}
        Path(path).write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")

    def refusal(self, sender_id: int, signed: bytes, sig: bytes) -> Optional[str]:
        """None when ``sig`` is ``sender_id``'s member key's signature of ``signed``, else the reason."""
        key = self.members.get(int(sender_id))
        if key is None:
            return f"unknown signer: sender {sender_id} has no key in the alliance registry"
        if public_hex(key) in self.revoked:
            return f"revoked key: sender {sender_id}'s key is revoked in the alliance registry"
        try:
            key.verify(bytes(sig), bytes(signed))
        except InvalidSignature:
            return f"bad signature: not signed with sender {sender_id}'s registered key, or changed after signing"
        return None

    def __repr__(self) -> str:
        return f"KeyRegistry({self.source}: {len(self.members)} members, {len(self.revoked)} revoked)"


class ReplayWindow:
    """What one receiver has accepted from each sender: per sender, the highest sequence and the
    accepted ones among the ``size`` below it (module docstring)."""

    def __init__(self, size: int = 64):
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"replay window size must be an integer >= 1, got {size!r}")
        self.size = size
        self._top: Dict[int, int] = {}
        self._seen: Dict[int, Set[int]] = {}

    def refusal(self, sender_id: int, sequence: int) -> Optional[str]:
        """None when ``sequence`` from ``sender_id`` is new to this receiver, else why it is a replay."""
        top = self._top.get(int(sender_id))
        if top is None or sequence > top:
            return None
        if sequence <= top - self.size:
            return (f"replayed: sequence {sequence} of sender {sender_id} is older than the replay window "
                    f"(highest accepted {top}, window {self.size})")
        if sequence in self._seen[int(sender_id)]:
            return f"replayed: sequence {sequence} of sender {sender_id} was already accepted"
        return None

    def accept(self, sender_id: int, sequence: int) -> None:
        """Record an accepted message (call after :meth:`refusal` said None)."""
        sid = int(sender_id)
        top = max(self._top.get(sid, sequence), sequence)
        self._top[sid] = top
        self._seen[sid] = {s for s in self._seen.get(sid, set()) if s > top - self.size} | {sequence}


def refusal(data: bytes, version: int, sender_id: int, end: int, key: Optional[bytes],
            registry: Optional["KeyRegistry"]) -> Optional[str]:
    """Why a receiver refuses packet ``data`` (``version``, from ``sender_id``, header and payload
    ending at ``end``) for its signature, or None. With ``registry``: only version 3 signed by the
    sender's registered, unrevoked key passes. With ``key`` (the alliance's HMAC key): only version
    2 whose tag matches (constant-time compare). With neither: every version passes unchecked."""
    if registry is not None:
        if version != VERSION_SENDER:
            return ("unsigned: this receiver accepts only messages signed with their sender's own key"
                    if version == VERSION else "signature scheme: signed with an alliance HMAC key, this "
                    "receiver accepts only messages signed with their sender's own key")
        view = memoryview(data)
        return registry.refusal(sender_id, view[:end + STAMP.size], view[end + STAMP.size:])
    if key is None:
        return None
    if version == VERSION_SENDER:
        return "signature scheme: signed with a sender's own key, this receiver checks the alliance HMAC key"
    if version != VERSION_SIGNED:
        return "unsigned: this receiver accepts only messages signed with the alliance key"
    if not hmac.compare_digest(signature(memoryview(data)[:end], key), bytes(data[end:])):
        return "bad signature: not signed with the alliance key, or changed after signing"
    return None


def keygen(folder: Union[str, Path], sender_ids: Iterable[int], registry: str = "alliance_keys.yaml") -> Path:
    """Fresh keys for ``sender_ids``: ``folder/<id>.pem`` each and the registry ``folder/registry``
    listing their public keys; returns the registry's path. Existing key files are refused."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    signers = [Signer.generate(i) for i in sender_ids]
    for s in signers:
        if (folder / f"{s.sender_id}.pem").exists():
            raise ValueError(f"{folder / f'{s.sender_id}.pem'}: exists; remove it to make a new key")
    for s in signers:
        s.write(folder / f"{s.sender_id}.pem")
    out = folder / registry
    KeyRegistry({s.sender_id: s.public_key for s in signers}, source=str(out)).write(out)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m opencood_ext.comm.signing",
                                description="Make Ed25519 keys for senders and the alliance registry listing them.")
    sub = p.add_subparsers(dest="cmd", required=True)
    k = sub.add_parser("keygen", help="write DIR/<id>.pem for each id and DIR/alliance_keys.yaml")
    k.add_argument("folder")
    k.add_argument("ids", nargs="+", type=int)
    args = p.parse_args(argv)
    try:
        print(keygen(args.folder, args.ids))
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


__all__ = ["Signer", "SenderKeys", "KeyRegistry", "ReplayWindow", "signature", "public_hex", "keygen",
           "SIGNATURE_SIZE", "TRAILER_SIZE", "STAMP"]

if __name__ == "__main__":
    sys.exit(main())
