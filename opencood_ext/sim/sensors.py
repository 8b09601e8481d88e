"""Sensor models of the built-in world: one import point.

* :class:`LidarModel` / :class:`LidarScan` (:mod:`opencood_ext.sim.lidar`)
* :class:`CameraModel` / :class:`CameraRender` (:mod:`opencood_ext.sim.camera`)

Both cast rays into a :class:`opencood_ext.sim.scene.RayScene`; the specs they
take (:class:`LidarSpec`, :class:`CameraSpec`) are backend-neutral and live
in :mod:`opencood_ext.sim.world`.
"""
from .camera import CameraModel, CameraRender
from .lidar import LidarModel, LidarScan
from .world import CameraSpec, LidarSpec, project_points

__all__ = ["CameraModel", "CameraRender", "CameraSpec", "LidarModel", "LidarScan", "LidarSpec",
           "project_points"]
