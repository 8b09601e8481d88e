"""The one lock primitive under the trainer's run-folder lock and the simulator's folder lock:
who holds it, giving up or waiting, and what the file says afterwards."""
import os
import threading

import pytest

from opencood_ext.file_lock import HeldLock


class Busy(Exception):
    pass


def _refuse(holder):
    raise Busy(holder)


def test_a_second_holder_gives_up_naming_the_first_and_leaves_nothing_open(tmp_path):
    path = tmp_path / "sub" / "lock"  # the folder is created with the file
    first = HeldLock(path, _refuse)
    assert path.read_text().startswith(f"pid {os.getpid()} on ")
    with pytest.raises(Busy, match=f"^pid {os.getpid()} on "):
        HeldLock(path, _refuse)
    assert len([f for f in os.listdir(f"/proc/{os.getpid()}/fd")
                if os.path.realpath(f"/proc/{os.getpid()}/fd/{f}") == str(path)]) == 1  # only the holder's
    first.release()
    assert path.read_text().startswith(f"pid {os.getpid()} on ")  # release(None): the name stays
    first.release("")  # a second release does nothing
    second = HeldLock(path, _refuse)  # free again
    assert second.previous.startswith(f"pid {os.getpid()} on ")
    second.release(second.previous)
    third = HeldLock(path, _refuse)
    third.release("")
    assert path.read_text() == ""


def test_a_waiting_holder_gets_the_lock_when_the_first_releases_it(tmp_path):
    path = tmp_path / "lock"
    first = HeldLock(path, _refuse)
    seen, got = [], threading.Event()

    def wait_for_it():
        HeldLock(path, seen.append).release("")
        got.set()

    waiter = threading.Thread(target=wait_for_it)
    waiter.start()
    for _ in range(1000):  # until the waiter has been told who holds the lock (10 s at most)
        if seen:
            break
        got.wait(0.01)
    assert not got.is_set()  # blocked while the first holds it
    assert len(seen) == 1 and seen[0].startswith(f"pid {os.getpid()} on ")
    first.release()
    assert got.wait(10.0)
    waiter.join()
    assert path.read_text() == ""
