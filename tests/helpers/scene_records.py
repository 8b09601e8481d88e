"""Per-frame evaluation records with a known bootstrap: for tests of AP intervals and paired differences."""
import numpy as np

from opencood_ext.eval.records import FrameRecords


def hit_records(hits, scenes: int = 10, frames: int = 2) -> FrameRecords:
    """One GT car per frame, detected exactly in every frame of the scenes ``hits`` and missed in the
    others: every AP (both orders, every IoU) is the share of hit scenes among the scenes drawn."""
    out = []
    for s in range(scenes):
        for f in range(frames):
            gt = np.array([[5.0 * f, 3.0, 0.0, 4.0, 1.8, 1.5, 0.0]])
            pred, score = (gt, np.array([0.9])) if s in hits else (np.zeros((0, 7)), np.zeros(0))
            out.append((pred, score, gt, f"scene{s}", f"scene{s}/{f:06d}"))
    return FrameRecords.from_detections(out)
