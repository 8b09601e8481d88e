"""Data layer: the Frame model, dataset formats, preprocessing and batching."""
from .frame import VEHICLE_CLASSES, AgentObs, CameraObs, Frame, ObjectLabel, sort_agent_ids

__all__ = ["AgentObs", "CameraObs", "Frame", "ObjectLabel", "VEHICLE_CLASSES", "sort_agent_ids"]
