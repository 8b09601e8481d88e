"""Sensor models of the built-in world: one import point.

* :class:`LidarModel` / :class:`LidarScan` (:mod:`gencomm.cosim.lidar`)
* :class:`CameraModel` / :class:`CameraRender` (:mod:`gencomm.cosim.camera`)

Both cast rays into a :class:`gencomm.cosim.scene.RayScene`; the specs they
take (:class:`LidarSpec`, :class:`CameraSpec`) are backend-neutral and live
in :mod:`gencomm.cosim.world`.
"""
from .camera import CameraModel, CameraRender
from .lidar import LidarModel, LidarScan
from .world import CameraSpec, LidarSpec, project_points

__all__ = ["CameraModel", "CameraRender", "CameraSpec", "LidarModel", "LidarScan", "LidarSpec",
           "project_points"]
