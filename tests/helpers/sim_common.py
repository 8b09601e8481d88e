"""Small, fast built-in-world configurations shared by the simulator tests."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from opencood_ext.sim.agent_types import AgentTypesConfig
from opencood_ext.sim.builtin import AgentParams, SimConfig
from opencood_ext.sim.roads import RoadParams
from opencood_ext.sim.town import TownParams
from opencood_ext.sim.traffic import TrafficParams

ARTIFACTS = Path("/tmp/gencomm_test_artifacts")


def small_config(points_per_second: int = 650_000, cameras: bool = False, camera_size=(160, 120),
                 rsu_probability: float = 0.5, vehicles=(20, 24), **kw) -> SimConfig:
    """A 3x3-node town at 0.5 m raster, ~20 vehicles, a lighter LiDAR."""
    sensors = AgentTypesConfig()
    sensors = replace(sensors, lidar=replace(sensors.lidar, points_per_second=points_per_second))
    town = TownParams(raster_res=0.5, roads=RoadParams(grid_nodes=(3, 3)))
    return SimConfig(town=town, traffic=TrafficParams(vehicles=vehicles), sensors=sensors,
                     agents=AgentParams(rsu_probability=rsu_probability), cameras=cameras,
                     camera_size=camera_size, warmup_ticks=10, **kw)
