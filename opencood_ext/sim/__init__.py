"""Data sources that drive agents through a world: the built-in simulator
(:mod:`.builtin`: procedural towns, traffic, Embree LiDAR and cameras), the
CARLA bridge (:mod:`.carla_bridge`), the recorder writing OPV2V-H data
(:mod:`.recorder`) and the live cooperation loop (:mod:`.live`). The
simulator's heavy dependencies (open3d, scipy) are the ``[sim]`` extra."""
