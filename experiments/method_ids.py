"""What each results row is: its method id. Every report finds a row by its id (``gencomm``,
``no_fusion``, ...), never by its display name, which may say more ("GenComm (m3 onboarded)") and
change with the alliance.

Main table: :data:`NO_FUSION`, :data:`LATE`, :data:`EARLY`, :data:`INTERMEDIATE` (full feature),
:data:`GENCOMM`, :data:`GENCOMM_EGOTARGET` (beyond the paper). Heterogeneous benchmark: the onboarding methods by their key
(:data:`ONBOARDING_ROWS`: ``gencomm``, ``backalign``, ...) and the two rows built from the stage-1 runs
without training, :data:`LATE_OF_STAGE1` and :data:`NONE_OF_STAGE1`.

Files written before rows stated their id (results.json, the seed archives' rows.json, the fair
benchmark's results.json) get it from :func:`legacy_method_id`, the one place that reads a display
name, and only those names the code of that time wrote.
"""
from __future__ import annotations

from typing import Optional

NO_FUSION = "no_fusion"
LATE = "late"
EARLY = "early"
INTERMEDIATE = "intermediate"  # full-feature intermediate fusion
GENCOMM = "gencomm"
# beyond the paper (issue 49 item 5), beside the faithful GenComm in every table: onboarding trains the new
# type's message extractor also to make the ego's generator regenerate the sender's scan as the ego's frozen
# encoder reads it (gencomm.onboarding.GenCommEgoTargetOnboarding; the onboarding method key too)
GENCOMM_EGOTARGET = "gencomm_egotarget"
LATE_OF_STAGE1 = "late_of_stage1"  # benchmark: each agent detects with its own stage-1 run
NONE_OF_STAGE1 = "none_of_stage1"  # benchmark: the ego's stage-1 run alone

REFERENCE = GENCOMM  # the row every paired table compares against
NO_FUSION_ROWS = frozenset({NO_FUSION, NONE_OF_STAGE1})
LATE_ROWS = frozenset({LATE, LATE_OF_STAGE1})
# rows that exchange no features (their evaluation fusion is none, late or early)
NOT_FEATURE_LEVEL = frozenset({NO_FUSION, LATE, EARLY, LATE_OF_STAGE1, NONE_OF_STAGE1})

# the benchmark's onboarding rows: (row label, onboarding method key = the row's method id);
# "mpda_fusion_head" is MPDA with its reference's trainable set (the ego's fusion, post-fusion layers
# and head train too), beside "mpda" with the alliance frozen as for every method
ONBOARDING_ROWS = [("GenComm", GENCOMM), ("BackAlign", "backalign"), ("STAMP", "stamp"), ("MPDA", "mpda"),
                   ("MPDA, fusion + head train", "mpda_fusion_head"), ("CodeFilling", "codefilling")]

# the main table's display names as every file so far wrote them
_MAIN_NAMES = {"No fusion": NO_FUSION, "Late fusion": LATE, "Early fusion": EARLY,
               "Intermediate (full feature)": INTERMEDIATE, "GenComm (m3 onboarded)": GENCOMM}


def legacy_method_id(method: str, table: str, onboard_method: Optional[str] = None) -> Optional[str]:
    """The id of a row of a file that predates ``method_id``, from what that file states: a benchmark
    row's onboarding method, else the display name the code of that time gave it; None when the name is
    none of those (the loader then asks for ``method_id``)."""
    if table != "heterogeneous":
        return _MAIN_NAMES.get(method)
    if onboard_method:
        return onboard_method
    if method.startswith("Late fusion ("):
        return LATE_OF_STAGE1
    if method.startswith("No fusion ("):
        return NONE_OF_STAGE1
    # longest label first: "MPDA, fusion + head train (...)" before "MPDA (...)"
    for label, key in sorted(ONBOARDING_ROWS, key=lambda lk: -len(lk[0])):
        if method.startswith(label + " ("):
            return key
    return None
