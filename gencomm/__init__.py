"""GenComm: generative communication for heterogeneous cooperative perception
(message extractor, diffusion feature generator, channel enhancer, wire format,
training stages, co-simulation)."""
__version__ = "0.1.0"
