"""The receiver type's frozen encoder applied to each SENDER's own scan: the training-time target of
GenComm's ego-encoder generation target (``model.link.generation_target: ego_encoder``, beyond the
paper; :mod:`gencomm.link`).

The dataset gives, for each collaborator of another type than its sample's ego, the collaborator's
scan preprocessed as the ego type reads scans (:mod:`opencood_ext.data.ego_type_input`;
``Batch.ego_type_inputs``). :func:`attach_ego_type_features` encodes them with the ego type's
encoder stack, without gradients (the stack is frozen in stage 2, its BatchNorm in eval mode; the
feature is a target, not an input), and hands them to the link through the
:class:`~.links.Arrival`, one row per arrived message. Nothing is sent over any wire.
"""
from __future__ import annotations

from typing import Sequence

import torch

from .links import Arrival


def attach_ego_type_features(model, batch, source_rows: Sequence[int], arrival: Arrival) -> None:
    """Set ``arrival.ego_type_features`` (n, C, H, W), message k's sender's scan as encoded by its
    receiver type's stack, in the sender's input frame (the frame of its own feature), and
    ``arrival.has_ego_type_feature`` (n,) bool: whether the batch holds that scan (False, and zeros,
    for a sender of the receiver's own type). ``source_rows``: (n,) each message's sender position
    in the flattened agent list of ``batch``. A message's receiver is its sample's ego, so the scan
    of row s sits in ``batch.ego_type_inputs[r]`` for r = that ego's type, which must be
    ``arrival.receiver_types[k]``."""
    n = len(source_rows)
    device = arrival.receiver_features.device
    C, (H, W) = model.channels, model.grid.shape
    feats = arrival.receiver_features.new_zeros(n, C, H, W)
    has = torch.zeros(n, dtype=torch.bool, device=device)
    for r, inp in batch.ego_type_inputs.items():
        where = {int(s): i for i, s in enumerate(batch.ego_type_index[r].tolist())}
        ks = [k for k, s in enumerate(source_rows) if int(s) in where]
        if not ks:
            continue
        wrong = [arrival.receiver_types[k] for k in ks if arrival.receiver_types[k] != r]
        if wrong:
            raise ValueError(f"ego-type inputs of ego type {r} reached a receiver of type {wrong[0]}")
        if r not in model.encoders:
            raise KeyError(f"the batch has ego-type inputs of type {r} but the model knows {sorted(model.encoders)}")
        with torch.no_grad():
            bev = model.encoders[r](inp.to(device)).bev
        idx = torch.as_tensor(ks, device=device)
        feats[idx] = bev[torch.as_tensor([where[int(source_rows[k])] for k in ks], device=device)].to(feats.dtype)
        has[idx] = True
    arrival.ego_type_features, arrival.has_ego_type_feature = feats, has
