"""gencomm-bench job (experiments/bench/job_cost.py): the projection counts what the main job does.
Its timings are measurements, never asserted; these tests check the counts it multiplies by."""
import pytest

from experiments.bench import job_cost
from experiments.profiles import PROFILES


def test_train_frames_follow_the_simulators_split():
    # default: 400 scenes, split 0.85 / 0.05 / 0.1 -> 340 train and 20 validation scenes of 3 frames
    assert job_cost._train_frames(PROFILES["default"]) == (1020, 60)
    assert job_cost._train_frames(PROFILES["quick"]) == (6, 3)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="--steps"):
        job_cost.main(["--steps", "0"])
    with pytest.raises(SystemExit):
        job_cost.main(["--profile", "nope"])
