"""Per-sender signatures and replay refusal (issue 52 items 1-2): each agent signs with its own
Ed25519 key, a receiver verifies against the alliance's key registry, so a member cannot sign as
another member and a revoked key is refused; each packet carries a sequence number and generation
time inside what is signed, and a receiver refuses a replayed sequence (same frame, later frame,
within and beyond its window) and ages messages in seconds. The old HMAC and unsigned modes still
work. Nothing here depends on timing: every clock is a number the test sets."""
import numpy as np
import pytest
import torch
import yaml

from opencood_ext.comm import Message, decode, encode, wire
from opencood_ext.comm.messages import Acceptance, ReceiverContext, receive_frame, receive_packet
from opencood_ext.comm.signing import STAMP, KeyRegistry, ReplayWindow, SenderKeys, Signer, keygen, public_hex
from test_message_auth import KEY, _resign_header  # header fields changed, CRCs valid, trailer kept

torch.set_num_threads(1)
IDS = (10, 20, 30)  # the synthetic frames' agents


@pytest.fixture(scope="module")
def alliance(tmp_path_factory):
    """(folder of <id>.pem, registry path) for the synthetic agents."""
    folder = tmp_path_factory.mktemp("alliance")
    return folder, keygen(folder, IDS)


def _msg(sender=10, timestamp=40.0):
    pose = np.eye(4)
    pose[:3, 3] = [5.0, 1.0, 1.8]
    return Message(sender, "m1", timestamp, pose, torch.arange(12, dtype=torch.float32).reshape(1, 3, 4))


def _limits(alliance):
    return wire.Limits(registry=KeyRegistry.load(alliance[1]))


def test_sizes_of_each_mode_and_the_signed_stamp(alliance):
    """Bytes per message of each mode: unsigned +0, alliance HMAC +32, per-sender Ed25519 +80
    (sequence 8, generation time 8, signature 64), as message_nbytes says; a sender's sequence
    counts up from 0 and decode returns it with the generation time."""
    signer = SenderKeys.load(alliance[0]).get(10)
    first = encode(_msg(), signer=signer, generation_time=2.0)
    second = encode(_msg(), signer=signer, generation_time=2.05)
    sizes = {mode: wire.message_nbytes((1, 3, 4), signed=mode) for mode in (False, "hmac", "ed25519")}
    assert sizes == {False: 252, "hmac": 284, "ed25519": 332}
    assert len(encode(_msg())) == sizes[False] and len(encode(_msg(), key=KEY)) == sizes["hmac"]
    assert len(first) == len(second) == sizes["ed25519"] and wire.message_nbytes((2, 100, 352), signed="ed25519") \
        == 281_804 + 80
    got = [decode(p, _limits(alliance)) for p in (first, second)]
    assert [(m.sequence, m.generation_time) for m in got] == [(0, 2.0), (1, 2.05)]
    torch.testing.assert_close(got[0].payload, _msg().payload)
    assert decode(first).sequence == 0  # a receiver without keys reads version 3 unchecked
    with pytest.raises(wire.MessageError, match="signed must be one of"):
        wire.message_nbytes((1, 3, 4), signed="rsa")


def test_a_member_cannot_sign_as_another_member(alliance):
    """Member 10's key signing a message that says it is from 20: refused at the sender, and a
    packet forged with 10's key over header id 20 (or 10's packet with its id rewritten, or an
    outsider's key claiming 20) fails 20's registered key at the receiver."""
    keys, limits = SenderKeys.load(alliance[0]), _limits(alliance)
    with pytest.raises(wire.MessageError, match="sender 10's key cannot sign a message from sender 20"):
        encode(_msg(sender=20), signer=keys.get(10))
    honest = encode(_msg(sender=10), signer=keys.get(10))
    body = _resign_header(honest, f4=20)[:-wire.TRAILER_SIZE]
    forged = {"10's key over id 20": body + keys.get(10).seal(body, 2.0),
              "id rewritten after signing": _resign_header(honest, f4=20),
              "outsider's key as 20": encode(_msg(sender=20), signer=Signer.generate(20))}
    for name, packet in forged.items():
        with pytest.raises(wire.MessageError, match="^bad signature: not signed with sender 20's registered key"):
            decode(packet, limits)
    assert decode(honest, limits).sender_id == 10
    with pytest.raises(wire.MessageError, match="^unknown signer: sender 40 has no key"):
        decode(encode(_msg(sender=40), signer=Signer.generate(40)), limits)


def test_the_stamp_is_signed(alliance):
    """The sequence and generation time are inside the signature: rewriting either is refused."""
    packet = bytearray(encode(_msg(), signer=SenderKeys.load(alliance[0]).get(10), generation_time=2.0))
    at = len(packet) - wire.TRAILER_SIZE
    for seq, when in ((7, 2.0), (0, 9.0)):
        changed = bytes(packet[:at]) + STAMP.pack(seq, when) + bytes(packet[at + STAMP.size:])
        with pytest.raises(wire.MessageError, match="^bad signature"):
            decode(changed, _limits(alliance))


def _write_registry(path, members, revoked=()):
    path.write_text(yaml.safe_dump({"members": {i: public_hex(s.public_key) for i, s in members.items()},
                                    "revoked": [public_hex(s.public_key) for s in revoked]}))
    return KeyRegistry.load(path)


def test_a_revoked_or_removed_key_is_refused_and_a_new_key_accepted(alliance, tmp_path):
    """The user revokes 20's leaked key in the registry file: refused as revoked, even while still
    listed as 20's. 20 gets a new key (the old one stays revoked) and 30 is removed: the old key
    fails, the new one passes, 30 is unknown."""
    keys = SenderKeys.load(alliance[0])
    old, fresh = keys.get(20), Signer.generate(20)
    revoked = _write_registry(tmp_path / "revoked.yaml", {10: keys.get(10), 20: old}, revoked=[old])
    with pytest.raises(wire.MessageError, match="^revoked key: sender 20's key is revoked"):
        decode(encode(_msg(sender=20), signer=old), wire.Limits(registry=revoked))
    limits = wire.Limits(registry=_write_registry(tmp_path / "rekeyed.yaml", {10: keys.get(10), 20: fresh},
                                                  revoked=[old]))
    with pytest.raises(wire.MessageError, match="^bad signature"):
        decode(encode(_msg(sender=20), signer=old), limits)
    assert decode(encode(_msg(sender=20), signer=fresh), limits).sender_id == 20
    with pytest.raises(wire.MessageError, match="^unknown signer: sender 30"):
        decode(encode(_msg(sender=30), signer=keys.get(30)), limits)
    assert decode(encode(_msg(sender=10), signer=keys.get(10)), limits).sender_id == 10


@pytest.fixture
def frame(alliance):
    """frame(packets, window, now=40.0): one receiver's frame under the alliance registry."""
    accept = Acceptance(kind="bev", registry=KeyRegistry.load(alliance[1]), tick_s=0.05)
    return lambda packets, window, now=40.0: receive_frame(packets, accept, ReceiverContext(now=now, replay=window))


def test_replays_are_refused_in_the_same_and_a_later_frame_within_and_beyond_the_window(alliance, frame):
    signer = SenderKeys.load(alliance[0]).get(10)
    window = ReplayWindow(size=4)
    packets = [encode(_msg(), signer=signer, generation_time=2.0) for _ in range(10)]  # sequences 0..9
    same = frame([packets[0], packets[0]], window)  # the same packet twice in one frame
    assert [i for i, _ in same.accepted] == [0]
    assert same.rejected == [(1, "replayed: sequence 0 of sender 10 was already accepted")]
    later = frame([packets[0]], window)  # a later frame
    assert not later.accepted and later.rejected[0][1].startswith("replayed: sequence 0")
    assert frame([packets[9]], window).accepted  # highest 9, window 4: 6, 7, 8 are still new
    assert frame([packets[7]], window).accepted  # within the window, out of order: accepted once
    again = frame([packets[7]], window)
    assert again.rejected == [(0, "replayed: sequence 7 of sender 10 was already accepted")]
    beyond = frame([packets[5]], window)  # never seen, but 4 or more below the highest
    assert beyond.rejected == [(0, "replayed: sequence 5 of sender 10 is older than the replay window "
                                   "(highest accepted 9, window 4)")]
    assert frame([packets[6]], window).accepted and frame([packets[8]], window).accepted
    other = SenderKeys.load(alliance[0]).get(20)  # each sender has its own sequence
    assert frame([encode(_msg(sender=20), signer=other, generation_time=2.0)], window).accepted


def test_a_packet_refused_for_another_rule_does_not_use_up_its_sequence(alliance, frame):
    signer = SenderKeys.load(alliance[0]).get(10)
    window = ReplayWindow(size=8)
    packet = encode(_msg(), signer=signer, generation_time=2.0)
    accept = Acceptance(kind="bev", registry=KeyRegistry.load(alliance[1]), tick_s=0.05)
    own = receive_frame([packet], accept, ReceiverContext(now=40.0, own_id=10, replay=window))
    assert own.rejected[0][1].startswith("own id")
    assert frame([packet], window).accepted


def test_max_age_is_seconds_of_the_senders_clock(alliance):
    """The receiver ages a version 3 message by its signed generation time, and any other by its
    timestamp times tick_s: a message 0.1 s old passes max_age 0.1 and fails 0.05."""
    signer = SenderKeys.load(alliance[0]).get(10)
    reg = KeyRegistry.load(alliance[1])
    made = encode(_msg(timestamp=40.0), signer=signer, generation_time=40 * 0.05)
    plain = encode(_msg(timestamp=40.0))
    for max_age, ok in ((0.1, True), (0.05, False)):
        for packet, registry in ((made, reg), (plain, None)):
            got = receive_packet(packet, Acceptance(kind="bev", registry=registry, max_age=max_age, tick_s=0.05),
                                 now=42.0)  # two 0.05 s ticks later
            assert isinstance(got, Message) if ok else got.startswith("stale: made at 2 s, now 2.1 s"), (max_age, got)
    ahead = receive_packet(made, Acceptance(kind="bev", registry=reg, max_future=0.0, tick_s=0.05), now=39.0)
    assert ahead.startswith("from the future")


def test_old_modes_still_work_and_modes_do_not_mix(alliance):
    """Unsigned and HMAC packets decode as before; a receiver holding the registry refuses them, and
    an HMAC receiver refuses a version 3 packet (it cannot check it)."""
    signer = SenderKeys.load(alliance[0]).get(10)
    v3, v2, v1 = encode(_msg(), signer=signer), encode(_msg(), key=KEY), encode(_msg())
    for packet, limits in ((v1, wire.Limits()), (v2, wire.Limits()), (v2, wire.Limits(key=KEY)), (v3, wire.Limits())):
        torch.testing.assert_close(decode(packet, limits).payload, _msg().payload)
    refused = {(v1, "registry"): "unsigned:", (v2, "registry"): "signature scheme:", (v3, "hmac"): "signature scheme:",
               (v1, "hmac"): "unsigned:"}
    for (packet, mode), reason in refused.items():
        limits = _limits(alliance) if mode == "registry" else wire.Limits(key=KEY)
        with pytest.raises(wire.MessageError) as err:
            decode(packet, limits)
        assert err.value.reason.startswith(reason), (mode, err.value.reason)
    with pytest.raises(wire.MessageError, match="not both"):
        encode(_msg(), key=KEY, signer=signer)
