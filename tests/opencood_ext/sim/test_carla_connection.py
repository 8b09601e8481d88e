"""CARLA bridge, the connection side: a closed port fails fast with a clear error, the world checks
its arguments before connecting, actors are torn down in a safe order, the world's bookkeeping on a
fake server, and one live test that needs a real server (conversions: test_carla_bridge.py)."""
from __future__ import annotations

import os
import socket
import time
from types import SimpleNamespace

import numpy as np
import pytest

from opencood_ext.geometry.transforms import pose_to_matrix
from opencood_ext.sim.world import CameraSpec, LidarSpec

carla = pytest.importorskip("carla", reason="the carla client package (pip install carla==0.9.16)")


def _opv2v_cameras():
    yaws = {"camera0": 0.0, "camera1": 100.0, "camera2": -100.0, "camera3": 180.0}
    return [CameraSpec(name=n, mount=(0.0, 0.0, 1.8, 0.0, y, 0.0)) for n, y in yaws.items()]

# ----------------------------------------------------------------------------- connection

def _closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # verify nothing listens there
        s.settimeout(0.5)
        assert s.connect_ex(("127.0.0.1", port)) != 0
    return port


def test_connect_to_closed_port_raises_carla_unavailable():
    from opencood_ext.sim.carla_bridge import CarlaUnavailable, connect

    port = _closed_port()
    t0 = time.monotonic()
    with pytest.raises(CarlaUnavailable) as err:
        connect("127.0.0.1", port, timeout_s=2.0)
    elapsed = time.monotonic() - t0
    msg = str(err.value)
    assert f"127.0.0.1:{port}" in msg and "within 2 s" in msg and "docker compose" in msg
    assert elapsed < 2.0 + 20.0, "connect() must give up after its timeout, not hang"


def test_world_validates_arguments_before_connecting():
    from opencood_ext.sim.carla_bridge import CarlaWorld

    with pytest.raises(ValueError, match="agent_types is empty"):
        CarlaWorld(agent_types={})
    with pytest.raises(ValueError, match="unknown agent types"):
        CarlaWorld(agent_types={"m1": SimpleNamespace(lidar=LidarSpec())}, assignment=["m1", "m9"])


def test_destroy_actors_stops_sensors_then_destroys_sensors_first():
    from opencood_ext.sim.carla_bridge import destroy_actors

    events = []

    class Sensor:
        def __init__(self, i, listening):
            self.id, self.listening = i, listening

        def is_listening(self):  # a method, as in carla 0.9.16
            return self.listening

        def stop(self):
            events.append(("stop", self.id))
            self.listening = False

    class Client:
        def apply_batch_sync(self, cmds, do_tick):
            events.append(("destroy", [c.actor_id for c in cmds], do_tick))
            return []

    destroy_actors(Client(), [Sensor(11, True), Sensor(12, False), Sensor(13, True)], [1, 2, 40])
    assert events == [("stop", 11), ("stop", 13), ("destroy", [11, 12, 13, 1, 2, 40], False)]

    class Broken(Client):
        def apply_batch_sync(self, cmds, do_tick):
            raise RuntimeError("time-out of 10000ms while waiting for the simulator")

    destroy_actors(Broken(), [], [3])  # logged, not raised: clean-up runs while unwinding errors
    events.clear()
    destroy_actors(Client(), [], [])
    assert events == []


# ----------------------------------------------------------------------------- bookkeeping (fake server)

def test_world_bookkeeping_on_a_fake_server(monkeypatch):
    from opencood_ext.sim.carla_bridge import CarlaWorld

    from carla_fake_server import FakeServer

    server = FakeServer()
    monkeypatch.setattr(carla, "Client", lambda host, port: server)
    cams = [CameraSpec(name=f"camera{i}", width=8, height=6, mount=(0.0, 0.0, 1.8, 0.0, yaw, 0.0))
            for i, yaw in enumerate((0.0, 100.0, -100.0, 180.0))]
    types = {"m1": SimpleNamespace(lidar=LidarSpec(), cameras=[], lidar_variants={32: 2, 16: 4}),
             "m2": SimpleNamespace(lidar=LidarSpec(channels=32), cameras=cams, lidar_variants={}),
             "m3": SimpleNamespace(lidar=LidarSpec(keep_every=2), cameras=[], lidar_variants={})}
    with CarlaWorld(agent_types=types, num_agents=3, num_background=0, seed=1,
                    assignment=["m1", "m2", "m3"]) as world:
        assert server.settings.synchronous_mode and server.settings.fixed_delta_seconds == 0.05
        assert [a.agent_type for a in world.agents] == ["m1", "m2", "m3"]
        assert len(server.sensors) == 1 + 9 + 1
        frames = [world.tick(), world.tick()]
    assert [f.timestamp for f in frames] == ["000002", "000004"]
    ids = [a.agent_id for a in frames[0].agents]
    f = frames[-1]
    assert sorted(f.objects) == ids
    for a in f.agents:
        assert a.visible_ids == [i for i in ids if i != a.agent_id]
        assert a.meta["carla_frame"] == 6  # reset ticks twice (settle, after spawning), then 2 + 2
    m1, m2 = f.agents[0], f.agents[1]
    assert m1.lidar.shape == (640, 4) and {b: len(p) for b, p in m1.lidar_beams.items()} == {32: 320, 16: 160}
    assert m2.lidar.shape == (320, 4) and m2.lidar_beams == {}
    assert f.agents[2].lidar.shape == (320, 4)  # a 64-channel sweep, every 2nd ring kept
    assert [c.image.shape for c in m2.cameras] == [(6, 8, 3)] * 4 and m2.cameras[0].depth.shape == (6, 8)
    for c in m2.cameras:
        np.testing.assert_allclose(m2.T_world_from_lidar @ c.T_lidar_from_camera, c.T_world_from_camera, atol=1e-4)
    # closed: sensors stopped, every actor destroyed (sensors first), settings restored
    assert server.sensors == [] and server.vehicles == [] and server.settings.synchronous_mode is False
    assert len(server.destroyed) == 11 + 3 and set(server.destroyed[:11]) == {s for s in range(101, 115)} - set(ids)


# ----------------------------------------------------------------------------- a real server

@pytest.mark.carla_server
def test_live_server_few_ticks():
    from opencood_ext.sim.carla_bridge import CarlaUnavailable, CarlaWorld, connect

    host, port = os.environ.get("CARLA_HOST", "127.0.0.1"), int(os.environ.get("CARLA_PORT", "2000"))
    reason = f"no CARLA server at {host}:{port} (start one with docker compose, see README)"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(2.0)
        if s.connect_ex((host, port)) != 0:
            pytest.skip(reason)
    try:
        client, _ = connect(host, port, timeout_s=5.0)
    except CarlaUnavailable:
        pytest.skip(reason)
    was_sync = client.get_world().get_settings().synchronous_mode
    types = {"m1": SimpleNamespace(lidar=LidarSpec(), cameras=[], lidar_variants={32: 2, 16: 4}),
             "m2": SimpleNamespace(lidar=LidarSpec(), cameras=_opv2v_cameras(), lidar_variants={})}
    with CarlaWorld(host, port, timeout_s=20.0, agent_types=types, num_agents=2, num_background=10,
                    seed=3) as world:
        settings = client.get_world().get_settings()
        assert settings.synchronous_mode and settings.fixed_delta_seconds == pytest.approx(0.05)
        assert [a.agent_type for a in world.agents] == ["m1", "m2"]
        frames = [world.tick() for _ in range(3)]
        assert [int(f.timestamp) for f in frames] == [2, 4, 6]  # two 0.05 s ticks per frame
        for f in frames:
            assert len(f.agents) == 2
            for a in f.agents:
                assert a.lidar.dtype == np.float32 and a.lidar.shape[1] == 4 and len(a.lidar) > 1000
                np.testing.assert_allclose(a.T_world_from_lidar, pose_to_matrix(a.lidar_pose))
                assert set(a.visible_ids) <= set(f.objects) and a.agent_id not in a.visible_ids
            m1, m2 = f.agents
            assert set(m1.lidar_beams) == {32, 16} and len(m1.lidar_beams[16]) < len(m1.lidar_beams[32]) < len(m1.lidar)
            assert [c.name for c in m2.cameras] == ["camera0", "camera1", "camera2", "camera3"]
            for c in m2.cameras:
                assert c.image.shape == (600, 800, 3) and c.depth.shape == (600, 800)
                assert 0 < float(c.depth.min()) and float(c.depth.max()) <= 1000.0
                np.testing.assert_allclose(m2.T_world_from_lidar @ c.T_lidar_from_camera,
                                           c.T_world_from_camera, atol=0.05)
        assert world.protocol()["fixed_delta_seconds"] == 0.05
        ours = {s.id for s in world._sensors} | {a.agent_id for a in world.agents} | set(world._background_ids)
        assert len(ours) == 2 + 8 + 2 + 10 or len(world._background_ids) < 10
    # clean-up: no actor of ours is left and the server's settings are back
    assert not ours & {a.id for a in client.get_world().get_actors()}
    assert client.get_world().get_settings().synchronous_mode == was_sync
