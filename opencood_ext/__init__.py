"""OpenCOOD-compatible substrate: configs, geometry, dataset formats, detection
models, post-processing and evaluation."""
__version__ = "0.1.0"
